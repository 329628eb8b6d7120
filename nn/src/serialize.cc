#include "gradwire/nn/serialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "gradwire/nn/crc32c.h"
#include "gradwire/nn/file_io.h"
#include "gradwire/tensor/kernels.h"
#include "gradwire/tensor/vector_math.h"

namespace gw::nn {
namespace {

constexpr char kMagic[4] = {'G', 'W', 'T', 'F'};
constexpr uint32_t kVersionUnchecked = 1;  // no checksums
constexpr uint32_t kVersion = 2;
constexpr size_t kHeaderBytes = 4 + 4 + 8;
constexpr size_t kTrailerBytes = 8 + 4;
constexpr uint32_t kMaxNameBytes = 4096;
constexpr uint8_t kMaxDims = 16;
static_assert(std::endian::native == std::endian::little, "the file format is little-endian");

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A version 2 file as the pieces to write, checksums computed: the tensors' payloads in
// place, and between them the small parts in strings (header + first entry's metadata,
// each entry's CRC + the next one's metadata, the last CRC + the trailer). Each payload is
// read once, by its entry's CRC; the file's CRC (of the header and the entries' bytes, not
// of the entry CRCs: serialize.h) is combined from the entries' CRCs (Crc32cCombine), not
// computed again over the bytes.
class FileImage {
 public:
  explicit FileImage(const NamedTensors& tensors) : small_(tensors.size() + 1) {
    std::string* s = &small_[0];
    s->append(kMagic, 4);
    Put<uint32_t>(s, kVersion);
    Put<uint64_t>(s, tensors.size());
    uint32_t file_crc = Crc32c(s->data(), s->size());
    uint64_t file_bytes = s->size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& [name, t] = tensors[i];
      const Tensor& c = payloads_.emplace_back(kernels::Contiguous(kernels::ToDevice(t, kCPU)));
      const size_t meta_start = s->size();
      Put<uint32_t>(s, static_cast<uint32_t>(name.size()));
      s->append(name);
      Put<uint8_t>(s, static_cast<uint8_t>(t.dtype()));
      Put<uint8_t>(s, static_cast<uint8_t>(t.dim()));
      for (int64_t d : t.sizes()) Put<int64_t>(s, d);
      Put<uint64_t>(s, c.nbytes());
      const size_t meta_bytes = s->size() - meta_start;
      const uint32_t entry_crc = Crc32cExtend(Crc32c(s->data() + meta_start, meta_bytes), c.raw_data(), c.nbytes());
      file_crc = Crc32cCombine(file_crc, entry_crc, meta_bytes + c.nbytes());
      file_bytes += meta_bytes + c.nbytes() + sizeof(entry_crc);
      s = &small_[i + 1];
      Put<uint32_t>(s, entry_crc);
    }
    const size_t trailer_start = s->size();
    Put<uint64_t>(s, file_bytes);
    Put<uint32_t>(s, file_crc);
    (void)trailer_start;
    digest_ = {file_bytes + kTrailerBytes, file_crc};
  }

  const FileDigest& digest() const { return digest_; }

  // The file's bytes in order: the small parts and the payloads, from their memory.
  std::vector<absl::string_view> Pieces() const {
    std::vector<absl::string_view> pieces;
    for (size_t i = 0; i < small_.size(); ++i) {
      pieces.push_back(small_[i]);
      if (i < payloads_.size()) {
        pieces.emplace_back(static_cast<const char*>(payloads_[i].raw_data()), payloads_[i].nbytes());
      }
    }
    return pieces;
  }

 private:
  std::vector<std::string> small_;
  std::vector<Tensor> payloads_;  // contiguous (copies of the strided ones)
  FileDigest digest_;
};

}  // namespace

absl::Status SaveTensors(const std::string& path, const NamedTensors& tensors, FileDigest* digest) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.dim() > kMaxDims || name.size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SaveTensors: entry '", name, "' cannot be saved (undefined, more than ",
          int{kMaxDims}, " dims, or a name over ", kMaxNameBytes, " bytes)"));
    }
  }
  const FileImage image(tensors);
  if (absl::Status s = WriteFileAtomically(path, image.Pieces(), "SaveTensors"); !s.ok()) return s;
  if (digest != nullptr) *digest = image.digest();
  return absl::OkStatus();
}

namespace {

// Reads fixed-size values from a byte range, failing instead of reading past the end.
class Reader {
 public:
  Reader(const std::string& data, const std::string& path) : data_(data), path_(path), end_(data.size()) {}
  template <typename T>
  bool Get(T* v) {
    if (end_ - pos_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(size_t n, const char** p) {
    if (end_ - pos_ < n) return false;
    *p = data_.data() + pos_;
    pos_ += n;
    return true;
  }
  // Reads stop at `end` (the start of a trailer). REQUIRES: pos() <= end <= size.
  void Limit(size_t end) { end_ = end; }
  size_t pos() const { return pos_; }
  size_t remaining() const { return end_ - pos_; }
  absl::Status Corrupt(const std::string& what) const {
    return absl::DataLossError(absl::StrCat("LoadTensors: '", path_, "' is corrupt at byte ", pos_,
                                            ": ", what));
  }

 private:
  const std::string& data_;
  const std::string& path_;
  size_t end_;
  size_t pos_ = 0;
};

std::string Hex(uint32_t v) { return absl::StrFormat("0x%08x", v); }

// The index of the first NaN or infinity among the n values (float or double, as raw
// bits) at p, or n. A value is not finite when its exponent bits are all ones: one
// branch-free (vectorised) pass says whether there is one, and only then is it searched.
template <typename Bits, Bits kExponent>
inline uint64_t FirstNonFinite(const char* p, uint64_t n) {
  auto bits = [p](uint64_t i) {
    Bits b;
    std::memcpy(&b, p + i * sizeof(Bits), sizeof(Bits));
    return b;
  };
  Bits any = 0;
  for (uint64_t i = 0; i < n; ++i) any |= (bits(i) & kExponent) == kExponent ? ~Bits{0} : Bits{0};
  if (any == 0) return n;
  for (uint64_t i = 0; i < n; ++i) {
    if ((bits(i) & kExponent) == kExponent) return i;
  }
  return n;
}

// Compiled for the CPU's vector width (GW_VECTOR_CLONES, gradwire/tensor/vector_math.h).
GW_VECTOR_CLONES uint64_t FirstNonFiniteFloat(const char* p, uint64_t n) {
  return FirstNonFinite<uint32_t, 0x7f800000u>(p, n);
}
GW_VECTOR_CLONES uint64_t FirstNonFiniteDouble(const char* p, uint64_t n) {
  return FirstNonFinite<uint64_t, 0x7ff0000000000000u>(p, n);
}


// FirstNonFinite for `numel` values of `dtype` (numel for the types without NaN).
uint64_t FirstNonFinite(DType dtype, const char* p, uint64_t numel) {
  switch (dtype) {
    case DType::kFloat32: return FirstNonFiniteFloat(p, numel);
    case DType::kFloat64: return FirstNonFiniteDouble(p, numel);
    default: return numel;
  }
}

// "NaN", "+Inf" or "-Inf": the non-finite value of `dtype` at p.
const char* NonFiniteName(DType dtype, const char* p) {
  double value;
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, sizeof(f));
    value = f;
  } else {
    std::memcpy(&value, p, sizeof(value));
  }
  return std::isnan(value) ? "NaN" : value > 0 ? "+Inf" : "-Inf";
}

// An entry's payload is copied, checksummed and checked in blocks of this size, so that
// each block is read from memory once (the CRC brings it into the cache for the copy and
// the check).
constexpr uint64_t kLoadBlockBytes = 64 << 10;

// The most elements the sizes of a tensor with none may describe (their product without
// the zeros): far above any real shape, far below what strides could overflow at.
constexpr uint64_t kMaxEmptyExtent = uint64_t{1} << 40;

// Checks a whole file in memory and, when `out` is given, makes its tensors; returns the
// file's digest (serialize.h).
absl::StatusOr<FileDigest> Parse(const std::string& data, const std::string& path, const LoadOptions& options,
                                 NamedTensors* out) {
  Reader r(data, path);
  const char* magic;
  uint32_t version;
  uint64_t count;
  if (!r.Bytes(4, &magic) || std::memcmp(magic, kMagic, 4) != 0) {
    return r.Corrupt("not a gradwire tensor file (bad magic)");
  }
  if (!r.Get(&version) || (version != kVersion && version != kVersionUnchecked)) {
    return r.Corrupt("unsupported version");
  }
  if (!r.Get(&count)) return r.Corrupt("truncated header");
  const bool checked = version == kVersion;
  uint64_t stored_length = 0;
  uint32_t stored_file_crc = 0;
  if (checked) {
    // The trailer first: a file cut short or extended is named as such, not as whatever
    // its last entry then looks like.
    if (data.size() < kHeaderBytes + kTrailerBytes) return r.Corrupt("truncated: no room for the trailer");
    std::memcpy(&stored_length, data.data() + data.size() - kTrailerBytes, sizeof(stored_length));
    std::memcpy(&stored_file_crc, data.data() + data.size() - sizeof(stored_file_crc), sizeof(stored_file_crc));
    if (stored_length != data.size() - kTrailerBytes) {
      return absl::DataLossError(absl::StrCat("LoadTensors: '", path, "' is ", data.size(),
                                              " bytes, but its trailer says ", stored_length,
                                              " bytes precede it: the file is truncated, extended or damaged"));
    }
    r.Limit(data.size() - kTrailerBytes);
  }
  // The CRC of the header and the entries' bytes so far, combined from the entries' CRCs.
  uint32_t file_crc = Crc32c(data.data(), kHeaderBytes);
  for (uint64_t i = 0; i < count; ++i) {
    const size_t entry_start = r.pos();
    uint32_t name_len;
    const char* name;
    uint8_t dtype, ndim;
    if (!r.Get(&name_len) || name_len > kMaxNameBytes || !r.Bytes(name_len, &name)) {
      return r.Corrupt(absl::StrCat("entry ", i, ": bad name"));
    }
    const std::string entry(name, name_len);
    if (!r.Get(&dtype) || dtype > static_cast<uint8_t>(DType::kBool)) {
      return r.Corrupt(absl::StrCat("entry '", entry, "': bad dtype"));
    }
    if (!r.Get(&ndim) || ndim > kMaxDims) return r.Corrupt(absl::StrCat("entry '", entry, "': bad rank"));
    Shape sizes(ndim);
    uint64_t numel = 1;
    // The product of the sizes that are not 0 is bounded (by the bytes left when the
    // tensor has elements, by kMaxEmptyExtent when it has none: an empty [0, 4096] is
    // valid at the end of any file), so no stride or product can overflow.
    uint64_t extent = 1;
    for (auto& d : sizes) {
      if (!r.Get(&d) || d < 0) return r.Corrupt(absl::StrCat("entry '", entry, "': bad size"));
      const uint64_t u = static_cast<uint64_t>(d);
      if (u > 0 && extent > kMaxEmptyExtent / u) return r.Corrupt(absl::StrCat("entry '", entry, "': bad size"));
      if (u > 0) extent *= u;
      numel *= u;
    }
    if (numel > 0 && extent > r.remaining()) return r.Corrupt(absl::StrCat("entry '", entry, "': bad size"));
    uint64_t nbytes;
    const char* payload;
    const DType dt = static_cast<DType>(dtype);
    if (!r.Get(&nbytes) || nbytes != numel * ElementSize(dt) || !r.Bytes(nbytes, &payload)) {
      return r.Corrupt(absl::StrCat("entry '", entry, "': payload length does not match ",
                                    ShapeToString(sizes)));
    }
    // The payload is copied, checksummed and checked for non-finite values in one pass;
    // a bad checksum is reported before a non-finite value (a flipped bit can make one).
    // Without `out` (a digest) it is only checksummed, in place.
    Tensor t = out != nullptr ? Tensor::Empty(sizes, dt) : Tensor();
    char* const values = out != nullptr ? static_cast<char*>(t.raw_data()) : nullptr;
    const size_t meta_bytes = static_cast<size_t>(payload - (data.data() + entry_start));
    uint32_t computed = checked ? Crc32c(data.data() + entry_start, meta_bytes) : 0;
    const bool check_values =
        out != nullptr && !options.allow_non_finite && (dt == DType::kFloat32 || dt == DType::kFloat64);
    uint64_t first_non_finite = numel;
    for (uint64_t off = 0; off < nbytes; off += kLoadBlockBytes) {
      const uint64_t len = std::min(kLoadBlockBytes, nbytes - off);
      if (checked) computed = Crc32cExtend(computed, payload + off, len);
      if (values != nullptr) std::memcpy(values + off, payload + off, len);
      if (check_values && first_non_finite == numel) {
        const uint64_t n = len / ElementSize(dt), at = FirstNonFinite(dt, values + off, n);
        if (at < n) first_non_finite = off / ElementSize(dt) + at;
      }
    }
    if (checked) {
      uint32_t stored;
      if (!r.Get(&stored)) return r.Corrupt(absl::StrCat("entry '", entry, "': truncated before its checksum"));
      if (computed != stored) {
        return absl::DataLossError(absl::StrCat("LoadTensors: '", path, "': entry '", entry,
                                                "' fails its checksum (stored ", Hex(stored), ", computed ",
                                                Hex(computed), "): the file is damaged"));
      }
      file_crc = Crc32cCombine(file_crc, computed, meta_bytes + nbytes);
    }
    if (first_non_finite < numel) {
      return absl::DataLossError(absl::StrCat(
          "LoadTensors: '", path, "': entry '", entry, "' holds ",
          NonFiniteName(dt, values + first_non_finite * ElementSize(dt)), " at index ", first_non_finite,
          "; load with allow_non_finite to accept it"));
    }
    if (out != nullptr) out->emplace_back(entry, std::move(t));
  }
  if (r.remaining() != 0) return r.Corrupt("trailing bytes after the last entry");
  if (checked && file_crc != stored_file_crc) {
    return absl::DataLossError(absl::StrCat("LoadTensors: '", path, "' fails its checksum (stored ",
                                            Hex(stored_file_crc), ", computed ", Hex(file_crc),
                                            "): the file is damaged"));
  }
  // A version 1 file has no checksums of its own: its digest is the CRC of its bytes.
  return FileDigest{data.size(), checked ? file_crc : Crc32c(data.data(), data.size())};
}

}  // namespace

absl::StatusOr<NamedTensors> LoadTensors(const std::string& path, const LoadOptions& options) {
  absl::StatusOr<std::string> file = ReadWholeFile(path, "LoadTensors");
  if (!file.ok()) return file.status();
  NamedTensors out;
  if (absl::StatusOr<FileDigest> parsed = Parse(*file, path, options, &out); !parsed.ok()) return parsed.status();
  return out;
}

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  absl::StatusOr<std::string> file = ReadWholeFile(path, "DigestFile");
  if (!file.ok()) return file.status();
  return Parse(*file, path, LoadOptions{}, nullptr);
}

}  // namespace gw::nn
