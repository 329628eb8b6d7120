// Unit: the named-tensor file format (serialize.h) — version 2's checksums catch every
// kind of damage, version 1 files still load, non-finite values are refused unless
// allowed, digests, and unreadable paths as Statuses naming them.
#include "gradwire/nn/serialize.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>

#include "gradwire/nn/crc32c.h"
#include "gradwire/nn/layers.h"
#include "scoped_temp_dir.h"

namespace gw::nn {
namespace {

using rpc::testing::ScopedTempDir;

// A version 2 file's contents as its CRC covers them: the header and every entry's bytes,
// without the entry CRCs and the trailer (serialize.h).
std::string Contents(const std::string& file) {
  std::string out = file.substr(0, 16);
  uint64_t count = 0;
  std::memcpy(&count, file.data() + 8, 8);
  size_t pos = 16;
  for (uint64_t i = 0; i < count; ++i) {
    const size_t start = pos;
    uint32_t name_len = 0;
    std::memcpy(&name_len, file.data() + pos, 4);
    pos += 4 + name_len + 1;
    const uint8_t ndim = static_cast<uint8_t>(file[pos]);
    pos += 1 + 8 * ndim;
    uint64_t nbytes = 0;
    std::memcpy(&nbytes, file.data() + pos, 8);
    pos += 8 + nbytes;
    out += file.substr(start, pos - start);
    pos += 4;  // the entry's CRC
  }
  return out;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

bool Contains(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != std::string_view::npos;
}

// Two float32 entries, [3, 4] and [3]: the byte offsets below follow serialize.h's format.
NamedTensors Tables() {
  return {{"fc1.weight", Tensor::FromVector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4})},
          {"fc1.bias", Tensor::FromVector<float>({-1, 0.5f, 2}, {3})}};
}
constexpr size_t kHeader = 16;
// Entry 0 from byte 16: name_len (4) | "fc1.weight" (10) | dtype | ndim | 2 sizes (16) |
// nbytes (8) | 48 payload bytes | CRC (4).
constexpr size_t kEntry0Name = kHeader + 4, kEntry0Sizes = kEntry0Name + 10 + 2,
                 kEntry0Payload = kEntry0Sizes + 16 + 8, kEntry0Crc = kEntry0Payload + 48,
                 kEntry1 = kEntry0Crc + 4;
// Entry 1: name_len (4) | "fc1.bias" (8) | dtype | ndim | 1 size (8) | nbytes (8) | 12
// payload bytes | CRC (4); then the trailer (u64 length, u32 CRC).
constexpr size_t kTrailer = kEntry1 + 4 + 8 + 2 + 8 + 8 + 12 + 4, kFileBytes = kTrailer + 12;

class SerializeFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    ASSERT_TRUE(SaveTensors(good_path_, Tables()).ok());
    good_ = ReadBytes(good_path_);
    ASSERT_EQ(good_.size(), kFileBytes);
  }
  // LoadTensors of `bytes` written to a file of their own.
  absl::Status LoadBytes(const std::string& bytes) {
    WriteBytes(bad_path_, bytes);
    return LoadTensors(bad_path_).status();
  }
  std::string Flipped(size_t byte, int bit = 0) const {
    std::string bad = good_;
    bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
    return bad;
  }

  // Entry 0's sizes [3, 4] made [4, 3]: every length still agrees, only the CRC can tell.
  std::string Reshaped() const {
    std::string bad = good_;
    bad[kEntry0Sizes] = 4;
    bad[kEntry0Sizes + 8] = 3;
    return bad;
  }

  ScopedTempDir dir_{"gw-serialize"};
  const std::string good_path_ = dir_.File("good.gwtf");
  const std::string bad_path_ = dir_.File("bad.gwtf");
  std::string good_;
};

TEST_F(SerializeFormatTest, RoundTripWritesVersionTwoWithATrailer) {
  EXPECT_EQ(good_.substr(0, 4), "GWTF");
  uint32_t version;
  std::memcpy(&version, good_.data() + 4, 4);
  EXPECT_EQ(version, 2u);
  uint64_t length;
  uint32_t crc;
  std::memcpy(&length, good_.data() + kTrailer, 8);
  std::memcpy(&crc, good_.data() + kTrailer + 8, 4);
  EXPECT_EQ(length, kTrailer);
  const std::string contents = Contents(good_);
  EXPECT_EQ(contents.size(), kTrailer - 8) << "two entry CRCs left out";
  EXPECT_EQ(crc, Crc32c(contents.data(), contents.size()));
  uint32_t entry0_crc;
  std::memcpy(&entry0_crc, good_.data() + kEntry0Crc, 4);
  EXPECT_EQ(entry0_crc, Crc32c(good_.data() + kHeader, kEntry0Crc - kHeader));

  absl::StatusOr<NamedTensors> out = LoadTensors(good_path_);
  ASSERT_TRUE(out.ok()) << out.status();
  const NamedTensors in = Tables();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].first, in[i].first);
    EXPECT_EQ((*out)[i].second.sizes(), in[i].second.sizes());
    EXPECT_EQ((*out)[i].second.ToVector<float>(), in[i].second.ToVector<float>());
  }
  // No temporary file is left next to it.
  EXPECT_NE(::access((good_path_ + ".tmp").c_str(), F_OK), 0);
}

TEST_F(SerializeFormatTest, VersionOneFilesStillLoadUnchecked) {
  // An entry's metadata: name_len | name | dtype | ndim | sizes | nbytes.
  auto meta = [](std::string* out, const std::string& name, DType dtype, const std::vector<int64_t>& sizes,
                 uint64_t nbytes) {
    Append<uint32_t>(out, static_cast<uint32_t>(name.size()));
    *out += name;
    Append<uint8_t>(out, static_cast<uint8_t>(dtype));
    Append<uint8_t>(out, static_cast<uint8_t>(sizes.size()));
    for (int64_t d : sizes) Append<int64_t>(out, d);
    Append<uint64_t>(out, nbytes);
  };
  std::string v1 = "GWTF";
  Append<uint32_t>(&v1, 1);  // version
  Append<uint64_t>(&v1, 2);  // count
  meta(&v1, "w", DType::kFloat64, {2}, 16);
  Append<double>(&v1, 1.5);
  const size_t second_value = v1.size();
  Append<double>(&v1, -3);
  meta(&v1, "steps", DType::kInt64, {}, 8);
  Append<int64_t>(&v1, 42);
  WriteBytes(bad_path_, v1);
  absl::StatusOr<NamedTensors> out = LoadTensors(bad_path_);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].first, "w");
  EXPECT_EQ((*out)[0].second.ToVector<double>(), (std::vector<double>{1.5, -3}));
  EXPECT_EQ((*out)[1].first, "steps");
  EXPECT_EQ((*out)[1].second.ToVector<int64_t>(), std::vector<int64_t>{42});
  // Version 1 still refuses what it can see: a byte too many, and a NaN.
  EXPECT_EQ(LoadBytes(v1 + "x").code(), absl::StatusCode::kDataLoss);
  std::string nan = v1;
  const double q = std::numeric_limits<double>::quiet_NaN();
  std::memcpy(nan.data() + second_value, &q, 8);
  absl::Status s = LoadBytes(nan);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(Contains(s, "entry 'w' holds NaN at index 1")) << s;
}

TEST_F(SerializeFormatTest, EveryKindOfDamageIsDataLossNamingThePath) {
  struct Case {
    std::string what;
    std::string bytes;
    std::string message;  // part of the error's message
  };
  const std::vector<Case> cases = {
      {"a payload bit", Flipped(kEntry0Payload + 5, 3), "entry 'fc1.weight' fails its checksum (stored 0x"},
      {"a payload bit of the last entry", Flipped(kTrailer - 5, 7), "entry 'fc1.bias' fails its checksum"},
      {"a name bit", Flipped(kEntry0Name + 2, 1), "fails its checksum"},
      {"a size bit", Flipped(kEntry0Sizes, 0), "fc1.weight"},
      {"a bit of the second size", Flipped(kEntry0Sizes + 8, 2), "fc1.weight"},
      {"sizes changed with the same element count ([3, 4] -> [4, 3])", Reshaped(),
       "entry 'fc1.weight' fails its checksum"},
      {"an entry CRC bit", Flipped(kEntry0Crc + 1, 4), "entry 'fc1.weight' fails its checksum"},
      {"the header's count", Flipped(8, 0), ""},
      {"the header's version", Flipped(4, 0), "unsupported version"},
      {"the trailer's length", Flipped(kTrailer, 2), "its trailer says"},
      {"the trailer's CRC", Flipped(kTrailer + 8, 0), "fails its checksum"},
      {"truncated by one byte", good_.substr(0, good_.size() - 1), "truncated"},
      {"truncated by a whole entry", good_.substr(0, kEntry1) + good_.substr(kTrailer), ""},
      {"one byte appended", good_ + '\0', "extended"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const absl::Status s = LoadBytes(c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_TRUE(Contains(s, bad_path_)) << s;
    EXPECT_TRUE(Contains(s, c.message)) << s;
  }
  // Swapping two values keeps every length and the bytes' sum: the entry's CRC catches it.
  std::string swapped = good_;
  std::swap_ranges(swapped.begin() + kEntry0Payload, swapped.begin() + kEntry0Payload + 4,
                   swapped.begin() + kEntry0Payload + 4);
  EXPECT_TRUE(Contains(LoadBytes(swapped), "entry 'fc1.weight' fails its checksum"));
}

// Exhaustively: no single flipped bit anywhere in the file loads.
TEST_F(SerializeFormatTest, EverySingleBitFlipIsDetected) {
  for (size_t byte = 0; byte < good_.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      const absl::Status s = LoadBytes(Flipped(byte, bit));
      ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << byte << " bit " << bit << ": " << s;
    }
  }
}

TEST_F(SerializeFormatTest, DigestsAgreeWithTheFileOnDisk) {
  FileDigest saved;
  ASSERT_TRUE(SaveTensors(good_path_, Tables(), &saved).ok());
  EXPECT_EQ(saved.bytes, kFileBytes);
  const std::string contents = Contents(good_);
  EXPECT_EQ(saved.crc32c, Crc32c(contents.data(), contents.size()));
  absl::StatusOr<FileDigest> on_disk = DigestFile(good_path_);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(*on_disk, saved);
  // A large file (several read chunks), and an empty one.
  const std::string big = dir_.File("big.gwtf");
  FileDigest big_saved;
  ASSERT_TRUE(SaveTensors(big, {{"x", Tensor::Zeros({1 << 19})}, {"y", Tensor::Ones({3})}}, &big_saved).ok());
  const std::string big_bytes = ReadBytes(big);
  const std::string big_contents = Contents(big_bytes);
  EXPECT_EQ(big_saved, (FileDigest{big_bytes.size(), Crc32c(big_contents.data(), big_contents.size())}));
  EXPECT_EQ(*DigestFile(big), big_saved);
  // Files of the same layout and different values have different digests (a CRC over all
  // the bytes would not: each entry's CRC cancels the entry's bytes).
  FileDigest other;
  ASSERT_TRUE(SaveTensors(big, {{"x", Tensor::Ones({1 << 19})}, {"y", Tensor::Ones({3})}}, &other).ok());
  EXPECT_EQ(other.bytes, big_saved.bytes);
  EXPECT_NE(other.crc32c, big_saved.crc32c);
  // DigestFile checks the file: an empty or damaged one is DATA_LOSS naming it.
  WriteBytes(bad_path_, "");
  EXPECT_EQ(DigestFile(bad_path_).status().code(), absl::StatusCode::kDataLoss);
  WriteBytes(bad_path_, Flipped(kEntry0Payload + 3));
  EXPECT_EQ(DigestFile(bad_path_).status().code(), absl::StatusCode::kDataLoss);
  // An empty state dict is a header and a trailer.
  ASSERT_TRUE(SaveTensors(bad_path_, {}, &saved).ok());
  EXPECT_EQ(saved.bytes, 16u + 12u);
  ASSERT_TRUE(LoadTensors(bad_path_).ok());
  EXPECT_TRUE(LoadTensors(bad_path_)->empty());
}

template <typename T>
NamedTensors WithValueAt17(T value) {
  std::vector<T> v(20, T{1});
  v[17] = value;
  return {{"fc1.weight", Tensor::FromVector<T>(std::vector<T>(6, T{2}), {2, 3})},
          {"fc1.bias", Tensor::FromVector<T>(v, {20})}};
}

TEST_F(SerializeFormatTest, NonFiniteValuesAreRefusedUnlessAllowed) {
  struct Case {
    NamedTensors tensors;
    std::string shown;
  };
  const std::vector<Case> cases = {
      {WithValueAt17(std::numeric_limits<float>::quiet_NaN()), "NaN"},
      {WithValueAt17(-std::numeric_limits<float>::quiet_NaN()), "NaN"},
      {WithValueAt17(std::numeric_limits<float>::infinity()), "+Inf"},
      {WithValueAt17(-std::numeric_limits<float>::infinity()), "-Inf"},
      {WithValueAt17(std::numeric_limits<double>::quiet_NaN()), "NaN"},
      {WithValueAt17(std::numeric_limits<double>::signaling_NaN()), "NaN"},
      {WithValueAt17(std::numeric_limits<double>::infinity()), "+Inf"},
      {WithValueAt17(-std::numeric_limits<double>::infinity()), "-Inf"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.shown + " " + DTypeName(c.tensors[1].second.dtype()));
    ASSERT_TRUE(SaveTensors(bad_path_, c.tensors).ok());
    const absl::Status refused = LoadTensors(bad_path_).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
    EXPECT_TRUE(Contains(refused, "'" + bad_path_ + "': entry 'fc1.bias' holds " + c.shown +
                                      " at index 17; load with allow_non_finite to accept it"))
        << refused;
    absl::StatusOr<NamedTensors> allowed = LoadTensors(bad_path_, {.allow_non_finite = true});
    ASSERT_TRUE(allowed.ok()) << allowed.status();
    const double v = (*allowed)[1].second.ToVector<double>()[17];
    EXPECT_EQ(std::isnan(v), c.shown == "NaN");
    if (c.shown != "NaN") {
      EXPECT_EQ(v, c.shown == "+Inf" ? INFINITY : -INFINITY);
    }
  }
  // The largest finite values and the smallest denormals are finite.
  ASSERT_TRUE(SaveTensors(bad_path_, {{"f", Tensor::FromVector<float>({std::numeric_limits<float>::max(),
                                                                        -std::numeric_limits<float>::max(),
                                                                        std::numeric_limits<float>::denorm_min()})},
                                      {"d", Tensor::FromVector<double>({std::numeric_limits<double>::lowest()})}})
                  .ok());
  EXPECT_TRUE(LoadTensors(bad_path_).ok());
  // The first of many is named, across the check's blocks.
  std::vector<float> many(10000, 0.5f);
  many[9000] = many[9999] = INFINITY;
  ASSERT_TRUE(SaveTensors(bad_path_, {{"m", Tensor::FromVector<float>(many)}}).ok());
  EXPECT_TRUE(Contains(LoadTensors(bad_path_).status(), "entry 'm' holds +Inf at index 9000"));
}

TEST_F(SerializeFormatTest, ModuleLoadRefusesNonFiniteWeights) {
  Generator gen(0);
  Linear layer(3, 20, gen);
  NamedTensors state = layer.StateDict();
  for (auto& [name, t] : state) {
    if (name == "bias") t = Tensor::FromVector<float>(std::vector<float>(20, NAN), {20});
  }
  ASSERT_TRUE(SaveTensors(bad_path_, state).ok());
  const std::vector<float> before = layer.Parameters()[0].ToVector<float>();
  const absl::Status s = layer.Load(bad_path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(Contains(s, "entry 'bias' holds NaN at index 0")) << s;
  EXPECT_EQ(layer.Parameters()[0].ToVector<float>(), before);
}

TEST_F(SerializeFormatTest, SaveErrorsNameThePath) {
  const std::string nowhere = dir_.File("missing/dir/model.gwtf");
  const absl::Status s = SaveTensors(nowhere, Tables());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(Contains(s, nowhere)) << s;
  // Saving over a directory fails at the rename and leaves no temporary file behind.
  const std::string sub = dir_.File("sub");
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  const absl::Status over_dir = SaveTensors(sub, Tables());
  EXPECT_FALSE(over_dir.ok());
  EXPECT_TRUE(Contains(over_dir, sub)) << over_dir;
  EXPECT_NE(::access((sub + ".tmp").c_str(), F_OK), 0);
  // A relative path (its directory is ".") works too.
  const std::string cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_.path());
  const absl::Status relative = SaveTensors("relative.gwtf", Tables());
  std::filesystem::current_path(cwd);
  EXPECT_TRUE(relative.ok()) << relative;
  EXPECT_TRUE(LoadTensors(dir_.File("relative.gwtf")).ok());
}

// Drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the calling thread's effective set
// (capabilities are per thread; the raw syscall changes this thread only), so that root
// meets file permissions as other users do.
bool DropFileOverridesOfThisThread() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  for (int cap : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH}) data[CAP_TO_INDEX(cap)].effective &= ~CAP_TO_MASK(cap);
  return ::syscall(SYS_capset, &header, data) == 0;
}

TEST_F(SerializeFormatTest, UnreadablePathsAreStatusesNamingThem) {
  const std::string missing = dir_.File("missing.gwtf");
  const std::string unreadable = dir_.File("unreadable.gwtf");
  ASSERT_TRUE(SaveTensors(unreadable, Tables()).ok());
  ASSERT_EQ(::chmod(unreadable.c_str(), 0), 0);
  struct Case {
    std::string path;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {{dir_.path(), absl::StatusCode::kFailedPrecondition},
                                   {missing, absl::StatusCode::kNotFound},
                                   {unreadable, absl::StatusCode::kPermissionDenied}};
  std::vector<absl::Status> loaded, digested;
  std::thread reader([&] {
    if (::geteuid() == 0 && !DropFileOverridesOfThisThread()) return;
    for (const Case& c : cases) {
      loaded.push_back(LoadTensors(c.path).status());
      digested.push_back(DigestFile(c.path).status());
    }
  });
  reader.join();
  ASSERT_EQ(loaded.size(), cases.size()) << "cannot drop CAP_DAC_OVERRIDE: " << std::strerror(errno);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].path);
    EXPECT_EQ(loaded[i].code(), cases[i].code) << loaded[i];
    EXPECT_TRUE(Contains(loaded[i], "LoadTensors")) << loaded[i];
    EXPECT_TRUE(Contains(loaded[i], cases[i].path)) << loaded[i];
    EXPECT_EQ(digested[i].code(), cases[i].code) << digested[i];
    EXPECT_TRUE(Contains(digested[i], "DigestFile")) << digested[i];
    EXPECT_TRUE(Contains(digested[i], cases[i].path)) << digested[i];
  }
  // This thread kept its capabilities.
  if (::geteuid() == 0) {
    EXPECT_TRUE(LoadTensors(unreadable).ok());
  }
}

// An empty tensor whose other sizes exceed the bytes left (a sparse table's empty sum of
// rows [0, 4096], the last entry of a checkpoint) loads; sizes no tensor could have are
// refused all the same.
TEST_F(SerializeFormatTest, EmptyTensorsWithWideShapesLoadAtTheEndOfAFile) {
  const NamedTensors in = {{"rows", Tensor::Ones({2, 3})}, {"sum_rows", Tensor::Empty({0, 4096})},
                           {"more", Tensor::Empty({4096, 0, 7})}};
  ASSERT_TRUE(SaveTensors(good_path_, in).ok());
  absl::StatusOr<NamedTensors> out = LoadTensors(good_path_);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_EQ((*out)[1].second.sizes(), Shape({0, 4096}));
  EXPECT_EQ((*out)[2].second.sizes(), Shape({4096, 0, 7}));
  ASSERT_TRUE(SaveTensors(good_path_, {{"huge", Tensor::Empty({0, int64_t{1} << 21, int64_t{1} << 21})}}).ok());
  absl::StatusOr<NamedTensors> huge = LoadTensors(good_path_);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kDataLoss) << huge.status();
  EXPECT_TRUE(Contains(huge.status(), "bad size")) << huge.status();
}

}  // namespace
}  // namespace gw::nn
