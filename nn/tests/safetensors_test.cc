// Unit: safetensors files (safetensors.h) — round trips of every dtype, the layout the
// reference implementation writes, PyTorch's files loaded into gradwire modules and gradwire's
// read by PyTorch, F16/BF16 conversion, every malformed file a Status (also under random
// corruption), and Module's safetensors methods with LoadStateDict's all-or-nothing checks.
#include "gradwire/nn/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

#include "gradwire/nn/crc32c.h"
#include "gradwire/nn/layers.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"
#include "scoped_temp_dir.h"

namespace gw::nn {
namespace {

using rpc::testing::ScopedTempDir;

const std::string kData = GRADWIRE_SOURCE_DIR "/nn/tests/data/";

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file of the given header text and buffer bytes.
std::string FileOf(const std::string& header, const std::string& buffer) {
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + buffer;
}

template <typename T>
std::string BytesOf(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  std::string Path(const std::string& name = "t.safetensors") const { return dir_.File(name); }
  // Loads a file made of `header` and `buffer` and returns the status.
  absl::Status LoadOf(const std::string& header, const std::string& buffer, LoadOptions options = {}) {
    WriteBytes(Path("hand.safetensors"), FileOf(header, buffer));
    return LoadSafetensors(Path("hand.safetensors"), options).status();
  }
  ScopedTempDir dir_{"gw-safetensors"};
};

void ExpectSameTensor(const Tensor& got, const Tensor& want, const std::string& name) {
  EXPECT_EQ(got.dtype(), want.dtype()) << name;
  EXPECT_EQ(got.sizes(), want.sizes()) << name;
  EXPECT_EQ(got.ToVector<double>(), want.ToVector<double>()) << name;
}

const Tensor& Find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  static const Tensor kNone;
  ADD_FAILURE() << "no tensor " << name;
  return kNone;
}

NamedTensors EveryKind() {
  Generator gen(7);
  return {{"w", kernels::Transpose(Tensor::Randn({3, 4}, gen), 0, 1)},  // strided
          {"d", Tensor::Randn({2, 3}, gen, DType::kFloat64)},
          {"ids", Tensor::FromVector<int64_t>({5, -1, 1LL << 40})},
          {"mask", Tensor::FromVector<bool>({true, false, true})},
          {"scalar", Tensor::Scalar(2.5)},
          {"empty", Tensor::Zeros({0, 3}, DType::kFloat64)}};
}

TEST_F(SafetensorsTest, RoundTripsEveryDTypeWithMetadata) {
  const NamedTensors saved = EveryKind();
  ASSERT_TRUE(SaveSafetensors(Path(), saved, {{"format", "pt"}}).ok());
  SafetensorsMetadata meta;
  absl::StatusOr<NamedTensors> loaded = LoadSafetensors(Path(), {}, &meta);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), saved.size());
  for (const auto& [name, t] : saved) ExpectSameTensor(Find(*loaded, name), t, name);
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(meta.at(kSafetensorsCrcKey).size(), 8u);
}

TEST_F(SafetensorsTest, LayoutIsTheReferenceImplementations) {
  ASSERT_TRUE(SaveSafetensors(Path(), EveryKind(), {{"gradwire.crc32c", "ignored"}}).ok());
  const std::string file = ReadBytes(Path());
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = file.substr(8, n), buffer = file.substr(8 + n);
  EXPECT_EQ(header.front(), '{');
  // Larger elements first, then by name: every tensor aligned to its element size.
  const size_t d = header.find("\"d\":"), empty = header.find("\"empty\":"), ids = header.find("\"ids\":"),
               scalar = header.find("\"scalar\":"), w = header.find("\"w\":"), mask = header.find("\"mask\":");
  EXPECT_TRUE(d < empty && empty < ids && ids < scalar && scalar < w && w < mask) << header;
  EXPECT_NE(header.find("\"d\":{\"dtype\":\"F64\",\"shape\":[2,3],\"data_offsets\":[0,48]}"), std::string::npos)
      << header;
  char crc[9];
  std::snprintf(crc, sizeof(crc), "%08x", Crc32c(buffer.data(), buffer.size()));
  EXPECT_NE(header.find(std::string("\"gradwire.crc32c\":\"") + crc + "\""), std::string::npos) << header;
}

// The MLP of make_safetensors_reference.py, in the dtype its file loads as.
std::shared_ptr<Sequential> Mlp(DType dtype) {
  Generator gen(1);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(6, 5, gen, true, dtype), std::make_shared<ReLU>(),
      std::make_shared<Linear>(5, 3, gen, true, dtype)});
}

TEST_F(SafetensorsTest, LoadsPyTorchFilesAndReproducesTheModel) {
  const auto ref = gw::testing::ReadReference(kData + "safetensors_reference.txt");
  struct Case {
    const char* file;
    const char* output;
    DType dtype;
    double tolerance;
  };
  for (const Case& c : {Case{"pytorch_mlp.safetensors", "out_f32", DType::kFloat32, 1e-5},
                        Case{"pytorch_mlp_f64.safetensors", "out_f64", DType::kFloat64, 1e-10},
                        Case{"pytorch_mlp_bf16.safetensors", "out_bf16", DType::kFloat32, 1e-5},
                        Case{"pytorch_mlp_f16.safetensors", "out_f16", DType::kFloat32, 1e-5}}) {
    SCOPED_TRACE(c.file);
    auto mlp = Mlp(c.dtype);
    absl::Status s = mlp->LoadSafetensors(kData + c.file);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<double> got =
        mlp->Forward(kernels::ToDType(gw::testing::Det({4, 6}, 0.5), c.dtype)).ToVector<double>();
    const std::vector<double>& want = ref.at(c.output);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], c.tolerance * std::abs(want[i])) << i;
  }
  SafetensorsMetadata meta;
  ASSERT_TRUE(LoadSafetensors(kData + "pytorch_mlp.safetensors", {}, &meta).ok());
  EXPECT_EQ(meta, (SafetensorsMetadata{{"format", "pt"}}));  // no CRC: written by PyTorch
}

// Runs `command` and returns its exit status, its standard output in *out.
int RunCommand(const std::string& command, std::string* out) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out->append(buf, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(SafetensorsTest, PyTorchReadsWhatGradwireWrites) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  const NamedTensors saved = EveryKind();
  ASSERT_TRUE(SaveSafetensors(Path(), saved, {{"format", "pt"}}).ok());
  std::string out;
  const int rc = RunCommand("/usr/bin/python3 " GRADWIRE_SOURCE_DIR "/nn/tests/read_safetensors.py " + Path() + " 2>/dev/null",
                     &out);
  if (rc == 77) GTEST_SKIP() << "PyTorch is not installed";
  ASSERT_EQ(rc, 0) << out;
  std::istringstream lines(out);
  std::string line;
  size_t tensors = 0;
  while (std::getline(lines, line)) {
    std::istringstream ls(line);
    std::string name, dtype, shape;
    ls >> name >> dtype;
    if (name == "meta") continue;
    ls >> shape;
    const Tensor& want = Find(saved, name);
    std::string want_shape;
    for (int64_t d : want.sizes()) want_shape += (want_shape.empty() ? "" : ",") + std::to_string(d);
    EXPECT_EQ(shape, "[" + want_shape + "]") << line;
    EXPECT_EQ(dtype, want.dtype() == DType::kFloat32   ? "F32"
                     : want.dtype() == DType::kFloat64 ? "F64"
                     : want.dtype() == DType::kInt64   ? "I64"
                                                       : "BOOL")
        << line;
    std::vector<double> values;
    for (double v; ls >> v;) values.push_back(v);
    EXPECT_EQ(values, want.ToVector<double>()) << line;
    ++tensors;
  }
  EXPECT_EQ(tensors, saved.size()) << out;
  EXPECT_NE(out.find("meta format pt"), std::string::npos) << out;
}

TEST_F(SafetensorsTest, HalvesLoadAsExactFloats) {
  // 0, -0, 1, -2, the smallest subnormal, the largest subnormal, the largest normal.
  const std::vector<uint16_t> f16 = {0x0000, 0x8000, 0x3c00, 0xc000, 0x0001, 0x03ff, 0x7bff};
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc0a0, 0x0001};
  const std::string header = R"({"h":{"dtype":"F16","shape":[7],"data_offsets":[0,14]},)"
                             R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[14,20]}})";
  WriteBytes(Path(), FileOf(header, BytesOf(f16) + BytesOf(bf16)));
  absl::StatusOr<NamedTensors> loaded = LoadSafetensors(Path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tensor& h = Find(*loaded, "h");
  EXPECT_EQ(h.dtype(), DType::kFloat32);
  const std::vector<float> hv = h.ToVector<float>();
  EXPECT_EQ(hv, (std::vector<float>{0.0f, -0.0f, 1.0f, -2.0f, 0x1p-24f, 1023 * 0x1p-24f, 65504.0f}));
  EXPECT_TRUE(std::signbit(hv[1]));
  EXPECT_EQ(Find(*loaded, "b").ToVector<float>(), (std::vector<float>{1.0f, -5.0f, std::bit_cast<float>(0x00010000u)}));
}

TEST_F(SafetensorsTest, NonFiniteValuesAreRefusedUnlessAllowed) {
  const std::string f16_inf = R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  absl::Status s = LoadOf(f16_inf, BytesOf(std::vector<uint16_t>{0x3c00, 0xfc00}));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("tensor 'h' holds -Inf at index 1"), std::string::npos) << s;
  EXPECT_TRUE(LoadOf(f16_inf, BytesOf(std::vector<uint16_t>{0x3c00, 0x7e00}), {.allow_non_finite = true}).ok());

  const Tensor w = Tensor::FromVector<double>({1, std::nan(""), 3});
  ASSERT_TRUE(SaveSafetensors(Path(), {{"w", w}}).ok());
  s = LoadSafetensors(Path()).status();
  EXPECT_NE(s.message().find("tensor 'w' holds NaN at index 1"), std::string::npos) << s;
  absl::StatusOr<NamedTensors> allowed = LoadSafetensors(Path(), {.allow_non_finite = true});
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(std::isnan(allowed->at(0).second.ToVector<double>()[1]));
}

TEST_F(SafetensorsTest, MalformedFilesAreStatusesNamingThePathAndTheProblem) {
  const std::string f32x2 = BytesOf(std::vector<float>{1, 2});
  struct Case {
    std::string header, buffer, message;
    absl::StatusCode code = absl::StatusCode::kDataLoss;
  };
  const std::vector<Case> cases = {
      {R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", f32x2, "tensor 'a' has dtype \"I32\", which gradwire does not load", absl::StatusCode::kUnimplemented},
      {R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", f32x2, "tensor 'a' has dtype \"Q7\", which is not a safetensors dtype"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2, "tensor 'a': 8 bytes hold F32[3], which takes 12"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", f32x2, "out of the buffer's 8 bytes"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32x2, "data_offsets [8, 0] are out of"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32x2, "overlap"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2, "bytes [0, 4) of the buffer, before tensor 'a', belong to no tensor"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32x2, "the buffer has 8 bytes but its tensors cover 4"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})", f32x2, "the header has the key 'a' twice"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"dtype":"F32"}})", f32x2, "the key 'dtype' twice"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", f32x2, "the header is not valid JSON"},
      {R"([1, 2])", "", "the header does not start with '{'"},
      {R"({"a":[[[[1]]]]})", "", "nests deeper"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2, "the shape [-2] is not of sizes >= 0"},
      {R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", f32x2, "is not of sizes >= 0"},
      {R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", "", "is too large"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", f32x2, "data_offsets is not [begin, end]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", f32x2, "unknown field 'extra'"},
      {R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", f32x2, "no dtype string"},
      {R"({"a":3})", "", "tensor 'a': not an object"},
      {R"({"__metadata__":{"k":1}})", "", "__metadata__ entry 'k' is not a string"},
      {R"({"__metadata__":{"gradwire.crc32c":"xyz"}})", "", "not 8 hex digits"},
      {R"({"__metadata__":{"gradwire.crc32c":"00000001"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2, "the buffer fails its checksum (stored 00000001"},
      {R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x02", 2), "tensor 'm' holds a BOOL byte other than 0 or 1 at index 1"},
      {"{\"a\xff\":{}}", "", "the header is not valid JSON"},
  };
  for (const Case& c : cases) {
    absl::Status s = LoadOf(c.header, c.buffer);
    EXPECT_EQ(s.code(), c.code) << c.header << ": " << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.header << ": " << s;
    EXPECT_NE(s.message().find(Path("hand.safetensors")), std::string::npos) << s;
  }
  // The length prefix itself.
  WriteBytes(Path(), std::string("\x10\0\0", 3));
  EXPECT_NE(LoadSafetensors(Path()).status().message().find("truncated: 3 bytes"), std::string::npos);
  std::string beyond = FileOf("{}", "");
  beyond[0] = 100;
  WriteBytes(Path(), beyond);
  EXPECT_NE(LoadSafetensors(Path()).status().message().find("the header length 100 is beyond the file's 10 bytes"),
            std::string::npos);
  EXPECT_EQ(LoadSafetensors(Path("missing")).status().code(), absl::StatusCode::kNotFound);
  // A valid file without tensors.
  EXPECT_TRUE(LoadOf("{}", "").ok());
}

TEST_F(SafetensorsTest, BadNamesAreNotSaved) {
  const Tensor t = Tensor::Zeros({2});
  for (const NamedTensors& bad : {NamedTensors{{"", t}}, NamedTensors{{"__metadata__", t}},
                                  NamedTensors{{"a", t}, {"a", t}}, NamedTensors{{"a", Tensor()}},
                                  NamedTensors{{"bad\xff", t}}}) {
    absl::Status s = SaveSafetensors(Path(), bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  EXPECT_EQ(SaveSafetensors(Path(), {{"a", t}}, {{"k", "bad\xff"}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::ifstream(Path()).good());  // nothing written
}

// Flipped bits, overwritten bytes, truncations and appended bytes, many seeds: every load is
// a Status or the original values, never a crash; a changed buffer is always caught.
TEST_F(SafetensorsTest, RandomCorruptionIsAStatusNeverACrash) {
  const NamedTensors saved = EveryKind();
  ASSERT_TRUE(SaveSafetensors(Path(), saved, {{"format", "pt"}}).ok());
  const std::string original = ReadBytes(Path());
  absl::StatusOr<NamedTensors> clean = LoadSafetensors(Path());
  ASSERT_TRUE(clean.ok());
  uint64_t header_bytes;
  std::memcpy(&header_bytes, original.data(), 8);
  const size_t buffer_start = 8 + header_bytes;
  int failures = 0, unchecked = 0;
  for (uint32_t seed = 0; seed < 1500; ++seed) {
    std::mt19937 rng(seed);
    std::string file = original;
    auto pos = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
    bool buffer_changed = false;
    switch (seed % 4) {
      case 0:  // flip a few bits
        for (int i = 0, n = 1 + static_cast<int>(pos(3)); i < n; ++i) {
          const size_t at = pos(file.size());
          file[at] = static_cast<char>(file[at] ^ (1 << pos(8)));
          buffer_changed |= at >= buffer_start;
        }
        break;
      case 1: {  // overwrite a byte
        const size_t at = pos(file.size());
        const char was = file[at];
        file[at] = static_cast<char>(pos(256));
        buffer_changed = at >= buffer_start && file[at] != was;
        break;
      }
      case 2:  // truncate
        file.resize(pos(file.size()));
        break;
      case 3:  // append
        file.append(1 + pos(16), static_cast<char>(pos(256)));
        break;
    }
    WriteBytes(Path("bad"), file);
    SafetensorsMetadata meta;
    absl::StatusOr<NamedTensors> loaded = LoadSafetensors(Path("bad"), {}, &meta);
    if (!loaded.ok()) {
      ++failures;
      EXPECT_NE(loaded.status().message().find(Path("bad")), std::string::npos) << loaded.status();
      continue;
    }
    // Loaded: only the header's text changed (a name or the metadata), not a value; unless
    // the damage renamed the checksum's key too, which leaves a file without one, unchecked
    // as PyTorch's files are.
    if (meta.contains(kSafetensorsCrcKey)) {
      EXPECT_FALSE(buffer_changed) << "seed " << seed;
    } else {
      ++unchecked;
      continue;
    }
    ASSERT_EQ(loaded->size(), clean->size()) << "seed " << seed;
    for (size_t i = 0; i < clean->size(); ++i) {
      EXPECT_EQ((*loaded)[i].second.ToVector<double>(), (*clean)[i].second.ToVector<double>()) << "seed " << seed;
    }
  }
  EXPECT_GT(failures, 1000);
  EXPECT_LT(unchecked, 30);
}

// ---------------------------------------------------------------- Module

std::shared_ptr<Sequential> MlpSeeded(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(6, 5, gen), std::make_shared<ReLU>(), std::make_shared<Linear>(5, 3, gen)});
}

std::vector<std::vector<float>> Values(const Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [_, t] : m.StateDict()) out.push_back(t.ToVector<float>());
  return out;
}

TEST_F(SafetensorsTest, ModuleRoundTripUsesPyTorchKeys) {
  auto a = MlpSeeded(1), b = MlpSeeded(2);
  ASSERT_TRUE(a->SaveSafetensors(Path(), {{"format", "pt"}}).ok());
  absl::StatusOr<NamedTensors> state = LoadSafetensors(Path());
  ASSERT_TRUE(state.ok());
  std::vector<std::string> names;
  for (const auto& [name, _] : *state) names.push_back(name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"0.bias", "0.weight", "2.bias", "2.weight"}));
  const Tensor handle = b->Parameters()[0];
  ASSERT_TRUE(b->LoadSafetensors(Path()).ok());
  EXPECT_EQ(Values(*b), Values(*a));
  EXPECT_EQ(handle.ToVector<float>(), a->Parameters()[0].ToVector<float>());  // loaded in place
}

// A state dict with a missing key, an extra key, a key given twice or a tensor of another
// shape or dtype fails naming the key, and changes no parameter.
TEST_F(SafetensorsTest, MismatchedStateFailsNamingTheKeyAndChangesNothing) {
  auto m = MlpSeeded(3);
  const auto before = Values(*m);
  const NamedTensors good = MlpSeeded(4)->StateDict();
  auto with = [&](auto edit) {
    NamedTensors s = good;
    edit(s);
    return s;
  };
  struct Case {
    NamedTensors state;
    std::string message;
  };
  const std::vector<Case> cases = {
      {with([](NamedTensors& s) { s.erase(s.begin() + 2); }), "missing entry '2.weight'"},
      {with([](NamedTensors& s) { s.emplace_back("3.weight", Tensor::Zeros({1})); }), "unexpected entry '3.weight'"},
      {with([](NamedTensors& s) { s.back().second = Tensor::Zeros({4}); }), "entry '2.bias' has float32[4]"},
      {with([](NamedTensors& s) { s[0].second = Tensor::Zeros({5, 6}, DType::kFloat64); }), "entry '0.weight' has float64"},
      {with([](NamedTensors& s) { s.push_back(s[1]); }), "entry '0.bias' is given twice"},
  };
  for (const Case& c : cases) {
    absl::Status direct = m->LoadStateDict(c.state);
    EXPECT_NE(direct.message().find(c.message), std::string::npos) << direct;
    EXPECT_EQ(Values(*m), before);
    if (c.message.find("twice") != std::string::npos) continue;  // a file cannot hold a name twice
    ASSERT_TRUE(SaveSafetensors(Path(), c.state).ok());
    absl::Status from_file = m->LoadSafetensors(Path());
    EXPECT_NE(from_file.message().find(c.message), std::string::npos) << from_file;
    EXPECT_EQ(Values(*m), before);
  }
  // Not strict: missing and extra keys are skipped, the rest is loaded.
  ASSERT_TRUE(m->LoadStateDict(cases[1].state, /*strict=*/false).ok());
  EXPECT_EQ(Values(*m), Values(*MlpSeeded(4)));
}

}  // namespace
}  // namespace gw::nn
