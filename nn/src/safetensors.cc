#include "gradwire/nn/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "gradwire/nn/crc32c.h"
#include "gradwire/nn/file_io.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors files are little-endian");

using Json = nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
// The most elements the non-zero sizes of a tensor without elements may describe: far above
// any real shape, far below where strides could overflow.
constexpr uint64_t kMaxEmptyExtent = uint64_t{1} << 40;
// A payload is checksummed, copied and checked in blocks of this many elements, so that each
// block is read from memory once.
constexpr uint64_t kBlockElements = 16 << 10;

// A dtype as a file stores it, and the DType it loads as.
enum class Stored { kF32, kF64, kI64, kBool, kF16, kBF16 };
struct StoredType {
  const char* name;
  Stored stored;
  uint64_t bytes;
  DType loads_as;
};
// Those gradwire writes come first: each is the first entry that loads as its DType.
constexpr StoredType kStoredTypes[] = {
    {"F32", Stored::kF32, 4, DType::kFloat32}, {"F64", Stored::kF64, 8, DType::kFloat64},
    {"I64", Stored::kI64, 8, DType::kInt64},   {"BOOL", Stored::kBool, 1, DType::kBool},
    {"F16", Stored::kF16, 2, DType::kFloat32}, {"BF16", Stored::kBF16, 2, DType::kFloat32},
};
// The format's other dtypes: valid files that gradwire cannot load.
constexpr const char* kUnsupportedTypes[] = {"I8", "U8", "I16", "U16", "I32", "U32", "U64", "F8_E4M3", "F8_E5M2"};

const StoredType* FindStoredType(const std::string& name) {
  for (const StoredType& t : kStoredTypes) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

const StoredType& StoredTypeOf(DType dtype) {
  for (const StoredType& t : kStoredTypes) {
    if (t.loads_as == dtype && t.bytes == ElementSize(dtype)) return t;
  }
  throw Error(absl::StrCat("SaveSafetensors: no safetensors dtype for ", DTypeName(dtype)));
}

std::string Hex(uint32_t v) { return absl::StrFormat("%08x", v); }

// ---------------------------------------------------------------- F16 and BF16

float FloatFromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

// IEEE binary16 to float32, exactly (every half value is a float value).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return FloatFromBits(sign | 0x7f800000u | (mantissa << 13));  // Inf, NaN
  if (exponent != 0) return FloatFromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign != 0 ? -magnitude : magnitude;
}

float BFloat16ToFloat(uint16_t b) { return FloatFromBits(static_cast<uint32_t>(b) << 16); }

template <typename Convert>
void ConvertHalves(const char* src, float* dst, uint64_t n, Convert convert) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, src + 2 * i, 2);
    dst[i] = convert(v);
  }
}

// ---------------------------------------------------------------- value checks

// The index of the first NaN or infinity among p[0, n), or n: one branch-free pass says
// whether there is one, and only then is it searched for.
template <typename T>
uint64_t FirstNonFinite(const T* p, uint64_t n) {
  bool any = false;
  for (uint64_t i = 0; i < n; ++i) any |= !std::isfinite(p[i]);
  if (!any) return n;
  for (uint64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i])) return i;
  }
  return n;
}

uint64_t FirstNonBool(const char* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (static_cast<unsigned char>(p[i]) > 1) return i;
  }
  return n;
}

// Copies n elements of `type` from src into dst (as type.loads_as) and returns the index of
// the first value that may not be loaded (NaN or infinite unless `allow_non_finite`, a BOOL
// byte other than 0 or 1), or n.
uint64_t CopyBlock(const StoredType& type, const char* src, char* dst, uint64_t n, bool allow_non_finite) {
  switch (type.stored) {
    case Stored::kF16: ConvertHalves(src, reinterpret_cast<float*>(dst), n, HalfToFloat); break;
    case Stored::kBF16: ConvertHalves(src, reinterpret_cast<float*>(dst), n, BFloat16ToFloat); break;
    default: std::memcpy(dst, src, n * type.bytes);
  }
  switch (type.loads_as) {
    case DType::kFloat32: return allow_non_finite ? n : FirstNonFinite(reinterpret_cast<const float*>(dst), n);
    case DType::kFloat64: return allow_non_finite ? n : FirstNonFinite(reinterpret_cast<const double*>(dst), n);
    case DType::kBool: return FirstNonBool(src, n);
    case DType::kInt64: return n;
  }
  return n;
}

// What the refused value at `index` of t is.
std::string DescribeValue(const Tensor& t, uint64_t index) {
  if (t.dtype() == DType::kBool) return "a BOOL byte other than 0 or 1";
  const double v = t.dtype() == DType::kFloat32 ? static_cast<const float*>(t.raw_data())[index]
                                                : static_cast<const double*>(t.raw_data())[index];
  return std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf";
}

// ---------------------------------------------------------------- the header

// One tensor as the header describes it.
struct Entry {
  std::string name;
  const StoredType* type;
  Shape sizes;
  uint64_t begin, end;
};

// Parses and checks a header; every failure names the path.
class HeaderParser {
 public:
  HeaderParser(const std::string& path, uint64_t buffer_bytes) : path_(path), buffer_bytes_(buffer_bytes) {}

  absl::Status Parse(absl::string_view text, std::vector<Entry>* entries, SafetensorsMetadata* metadata) {
    if (text.empty() || text.front() != '{') return Corrupt("the header does not start with '{'");
    Json header;
    try {
      header = Json::parse(text.begin(), text.end(), Callback());
    } catch (const Json::exception& e) {
      return Corrupt(absl::StrCat("the header is not valid JSON (", e.what(), ")"));
    }
    if (!duplicate_.empty()) return Corrupt(absl::StrCat("the header has the key '", duplicate_, "' twice"));
    if (too_deep_) return Corrupt("the header nests deeper than a safetensors header does");
    if (!header.is_object()) return Corrupt("the header is not a JSON object");
    for (auto& [key, value] : header.items()) {
      absl::Status s = key == kMetadataKey ? ParseMetadata(value, metadata) : ParseEntry(key, value, entries);
      if (!s.ok()) return s;
    }
    return CheckTiling(entries);
  }

  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("LoadSafetensors: '", path_, "': ", what));
  }

 private:
  // Records duplicate keys (a JSON object keeps the last of them silently) and drops anything
  // nested deeper than a header's [shape] arrays. Objects at depth d have their keys at d + 1.
  Json::parser_callback_t Callback() {
    return [this](int depth, Json::parse_event_t event, Json& parsed) {
      const size_t d = static_cast<size_t>(depth);
      if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) {
        if (d >= 3) {
          too_deep_ = true;
          return false;
        }
        if (event == Json::parse_event_t::object_start) {
          if (keys_.size() < d + 2) keys_.resize(d + 2);
          keys_[d + 1].clear();
        }
      } else if (event == Json::parse_event_t::key && d < keys_.size()) {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys_[d].insert(key).second && duplicate_.empty()) duplicate_ = key;
      }
      return true;
    };
  }

  absl::Status ParseMetadata(const Json& value, SafetensorsMetadata* metadata) {
    if (!value.is_object()) return Corrupt("__metadata__ is not an object");
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) return Corrupt(absl::StrCat("__metadata__ entry '", key, "' is not a string"));
      (*metadata)[key] = v.get<std::string>();
    }
    return absl::OkStatus();
  }

  absl::Status ParseEntry(const std::string& name, const Json& info, std::vector<Entry>* entries) {
    auto bad = [&](absl::string_view what) { return Corrupt(absl::StrCat("tensor '", name, "': ", what)); };
    if (!info.is_object()) return bad("not an object of dtype, shape and data_offsets");
    for (const auto& [key, _] : info.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") return bad(absl::StrCat("unknown field '", key, "'"));
    }
    const auto dtype = info.find("dtype"), shape = info.find("shape"), offsets = info.find("data_offsets");
    if (dtype == info.end() || !dtype->is_string()) return bad("no dtype string");
    Entry e{name, FindStoredType(dtype->get<std::string>()), {}, 0, 0};
    if (e.type == nullptr) {
      const std::string& d = dtype->get_ref<const std::string&>();
      const bool known = std::find(std::begin(kUnsupportedTypes), std::end(kUnsupportedTypes), d) !=
                         std::end(kUnsupportedTypes);
      const std::string what = absl::StrCat("LoadSafetensors: '", path_, "': tensor '", name, "' has dtype \"", d,
                                            known ? "\", which gradwire does not load"
                                                  : "\", which is not a safetensors dtype",
                                            " (it loads F32, F64, I64, BOOL, F16 and BF16)");
      return known ? absl::UnimplementedError(what) : absl::DataLossError(what);
    }
    if (shape == info.end() || !shape->is_array()) return bad("no shape array");
    uint64_t numel = 1, extent = 1;  // extent: the product of the sizes that are not 0
    for (const Json& d : *shape) {
      if (!d.is_number_unsigned()) return bad(absl::StrCat("the shape ", shape->dump(), " is not of sizes >= 0"));
      const uint64_t u = d.get<uint64_t>();
      if (u > 0 && extent > kMaxEmptyExtent / u) return bad(absl::StrCat("the shape ", shape->dump(), " is too large"));
      if (u > 0) extent *= u;
      numel *= u;
      e.sizes.push_back(static_cast<int64_t>(u));
    }
    if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned()) {
      return bad("data_offsets is not [begin, end]");
    }
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > buffer_bytes_) {
      return bad(absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] are out of the buffer's ", buffer_bytes_,
                              " bytes"));
    }
    // numel * bytes cannot overflow when it may equal end - begin (numel <= extent <= 2^40).
    if (numel > 0 && extent > buffer_bytes_) return bad(absl::StrCat("the shape ", shape->dump(), " is too large"));
    if (numel * e.type->bytes != e.end - e.begin) {
      return bad(absl::StrCat(e.end - e.begin, " bytes hold ", e.type->name, ShapeToString(e.sizes), ", which takes ",
                              numel * e.type->bytes));
    }
    entries->push_back(std::move(e));
    return absl::OkStatus();
  }

  // The tensors must cover the buffer exactly, without overlapping. Sorts `entries` by offset.
  absl::Status CheckTiling(std::vector<Entry>* entries) const {
    std::sort(entries->begin(), entries->end(),
              [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
    uint64_t covered = 0;
    const Entry* previous = nullptr;
    for (const Entry& e : *entries) {
      if (e.begin < covered) {
        return Corrupt(absl::StrCat("tensors '", previous->name, "' and '", e.name, "' overlap"));
      }
      if (e.begin > covered) {
        return Corrupt(absl::StrCat("bytes [", covered, ", ", e.begin, ") of the buffer, before tensor '", e.name,
                                    "', belong to no tensor"));
      }
      covered = e.end;
      previous = &e;
    }
    if (covered != buffer_bytes_) {
      return Corrupt(absl::StrCat("the buffer has ", buffer_bytes_, " bytes but its tensors cover ", covered,
                                  " (the file is truncated, extended or damaged)"));
    }
    return absl::OkStatus();
  }

  const std::string& path_;
  const uint64_t buffer_bytes_;
  std::vector<std::set<std::string>> keys_;  // by depth: the keys of the object being parsed
  std::string duplicate_;
  bool too_deep_ = false;
};

}  // namespace

absl::Status SaveSafetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || name.empty() || name == kMetadataKey || !names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("SaveSafetensors: '", path, "': tensor '", name,
                                                     "' cannot be saved (undefined, an empty or reserved name, or a "
                                                     "name given twice)"));
    }
  }
  // The reference implementation's order: larger elements first (so each is aligned), then by name.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t ea = ElementSize(tensors[a].second.dtype()), eb = ElementSize(tensors[b].second.dtype());
    return ea != eb ? ea > eb : tensors[a].first < tensors[b].first;
  });
  std::vector<Tensor> payloads;  // contiguous (copies of the strided ones)
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  uint32_t crc = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    const Tensor& c = payloads.emplace_back(kernels::Contiguous(kernels::ToDevice(t, kCPU)));
    crc = Crc32cExtend(crc, c.raw_data(), c.nbytes());
    entries[name] = {{"dtype", StoredTypeOf(t.dtype()).name},
                     {"shape", std::vector<int64_t>(t.sizes().begin(), t.sizes().end())},
                     {"data_offsets", {offset, offset + c.nbytes()}}};
    offset += c.nbytes();
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json& meta = header[kMetadataKey] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  meta[kSafetensorsCrcKey] = Hex(crc);
  header.update(entries);
  std::string prefix(8, '\0');
  try {
    prefix += header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("SaveSafetensors: '", path, "': a name or metadata entry is not valid UTF-8 (", e.what(), ")"));
  }
  prefix.append((8 - prefix.size() % 8) % 8, ' ');
  const uint64_t header_bytes = prefix.size() - 8;
  std::memcpy(prefix.data(), &header_bytes, 8);
  std::vector<absl::string_view> pieces{prefix};
  for (const Tensor& c : payloads) pieces.emplace_back(static_cast<const char*>(c.raw_data()), c.nbytes());
  return WriteFileAtomically(path, pieces, "SaveSafetensors");
}

absl::StatusOr<NamedTensors> LoadSafetensors(const std::string& path, const LoadOptions& options,
                                             SafetensorsMetadata* metadata) {
  absl::StatusOr<std::string> file = ReadWholeFile(path, "LoadSafetensors");
  if (!file.ok()) return file.status();
  const std::string& data = *file;
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("LoadSafetensors: '", path, "': ", what));
  };
  if (data.size() < 8) return corrupt(absl::StrCat("truncated: ", data.size(), " bytes, no room for the header length"));
  uint64_t header_bytes;
  std::memcpy(&header_bytes, data.data(), 8);
  if (header_bytes > kMaxHeaderBytes || header_bytes > data.size() - 8) {
    return corrupt(absl::StrCat("the header length ", header_bytes, " is beyond the file's ", data.size(),
                                " bytes (or over the limit of ", kMaxHeaderBytes, ")"));
  }
  const char* buffer = data.data() + 8 + header_bytes;
  HeaderParser parser(path, data.size() - 8 - header_bytes);
  std::vector<Entry> entries;
  SafetensorsMetadata meta;
  if (absl::Status s = parser.Parse(absl::string_view(data.data() + 8, header_bytes), &entries, &meta); !s.ok()) {
    return s;
  }
  std::optional<uint32_t> stored_crc;
  if (auto it = meta.find(kSafetensorsCrcKey); it != meta.end()) {
    uint32_t v;
    if (it->second.size() != 8 || !absl::SimpleHexAtoi(it->second, &v)) {
      return corrupt(absl::StrCat("__metadata__ '", kSafetensorsCrcKey, "' is \"", it->second,
                                  "\", not 8 hex digits"));
    }
    stored_crc = v;
  }
  // The entries tile the buffer in order: their CRCs, chained, are the buffer's.
  NamedTensors out;
  uint32_t crc = 0;
  std::optional<std::pair<size_t, uint64_t>> bad;  // the first value refused: tensor, index
  for (const Entry& e : entries) {
    const Tensor& t = out.emplace_back(e.name, Tensor::Empty(e.sizes, e.type->loads_as)).second;
    const uint64_t numel = (e.end - e.begin) / e.type->bytes;
    char* dst = static_cast<char*>(t.raw_data());
    for (uint64_t i = 0; i < numel; i += kBlockElements) {
      const uint64_t n = std::min(kBlockElements, numel - i);
      const char* src = buffer + e.begin + i * e.type->bytes;
      if (stored_crc) crc = Crc32cExtend(crc, src, n * e.type->bytes);
      const uint64_t at = CopyBlock(*e.type, src, dst + i * ElementSize(t.dtype()), n, options.allow_non_finite);
      if (at < n && !bad) bad.emplace(out.size() - 1, i + at);
    }
  }
  // A bad checksum first: a flipped bit can make a NaN.
  if (stored_crc && crc != *stored_crc) {
    return corrupt(absl::StrCat("the buffer fails its checksum (stored ", Hex(*stored_crc), ", computed ", Hex(crc),
                                "): the file is damaged"));
  }
  if (bad) {
    const auto& [name, t] = out[bad->first];
    return corrupt(absl::StrCat("tensor '", name, "' holds ", DescribeValue(t, bad->second), " at index ", bad->second,
                                t.dtype() == DType::kBool ? "" : "; load with allow_non_finite to accept it"));
  }
  if (metadata != nullptr) *metadata = std::move(meta);
  return out;
}

}  // namespace gw::nn
