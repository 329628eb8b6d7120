// Unit: Module — registration, state_dict round trips through the file format, and
// rejection of corrupt or mismatched state.
#include "gradwire/nn/module.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "gradwire/nn/layers.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

std::shared_ptr<Sequential> MakeMlp(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(6, 5, gen), std::make_shared<ReLU>(),
      std::make_shared<Linear>(5, 2, gen)});
}

class TempFile {
 public:
  TempFile() : path_(::testing::TempDir() + "gw_module_test_" + std::to_string(::getpid()) + "_" +
                     std::to_string(counter_++)) {}
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST(ModuleTest, SaveLoadRoundTripRestoresEveryParameter) {
  auto a = MakeMlp(1), b = MakeMlp(2);
  TempFile f;
  ASSERT_TRUE(a->Save(f.path()).ok());
  Tensor b_weight_handle = b->Parameters()[0];
  ASSERT_TRUE(b->Load(f.path()).ok());
  auto pa = a->NamedParameters(), pb = b->NamedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_EQ(pa[i].second.ToVector<float>(), pb[i].second.ToVector<float>()) << pa[i].first;
  }
  // Loaded in place: handles held by optimizers stay valid.
  EXPECT_EQ(b_weight_handle.ToVector<float>(), pa[0].second.ToVector<float>());
}

TEST(ModuleTest, MismatchedStateIsRejectedWithoutPartialWrites) {
  auto a = MakeMlp(1);
  const std::vector<float> before = a->Parameters()[0].ToVector<float>();
  NamedTensors state = a->StateDict();
  state[0].second = Tensor::Zeros({5, 6});  // valid, but must not be applied
  state.back().second = Tensor::Zeros({3});  // wrong shape for 2.bias
  absl::Status s = a->LoadStateDict(state);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("2.bias"), std::string::npos) << s;
  EXPECT_EQ(a->Parameters()[0].ToVector<float>(), before);
  NamedTensors missing(state.begin(), state.begin() + 1);
  EXPECT_EQ(a->LoadStateDict(missing).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(a->LoadStateDict({{"0.weight", Tensor::Zeros({5, 6})}}, /*strict=*/false).ok());
  EXPECT_EQ(kernels::MaxAll(kernels::Abs(a->Parameters()[0])).item(), 0);
  NamedTensors extra = a->StateDict();
  extra.emplace_back("bogus", Tensor::Zeros({1}));
  EXPECT_EQ(a->LoadStateDict(extra).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SerializeTest, AllDtypesRoundTrip) {
  TempFile f;
  NamedTensors in = {{"f", Tensor::FromVector<float>({1.5f, -2}, {2, 1})},
                     {"d", Tensor::FromVector<double>({3.25})},
                     {"i", Tensor::FromVector<int64_t>({-7, 8, 9})},
                     {"b", Tensor::FromVector<bool>({true, false})},
                     {"scalar", Tensor::Scalar(4)},
                     {"empty", Tensor::Zeros({0, 3})}};
  ASSERT_TRUE(SaveTensors(f.path(), in).ok());
  auto out = LoadTensors(f.path());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].first, in[i].first);
    EXPECT_EQ((*out)[i].second.dtype(), in[i].second.dtype());
    EXPECT_EQ((*out)[i].second.sizes(), in[i].second.sizes());
    EXPECT_EQ((*out)[i].second.ToVector<double>(), in[i].second.ToVector<double>());
  }
}

TEST(SerializeTest, CorruptFilesAreErrorsNotCrashes) {
  TempFile f;
  ASSERT_TRUE(SaveTensors(f.path(), MakeMlp(3)->StateDict()).ok());
  std::ifstream in(f.path(), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto load_bytes = [&](const std::string& bytes) {
    TempFile g;
    std::ofstream(g.path(), std::ios::binary) << bytes;
    return LoadTensors(g.path()).status();
  };
  EXPECT_TRUE(load_bytes(good).ok());
  // Every truncation fails cleanly.
  for (size_t n = 0; n < good.size(); n += 7) {
    EXPECT_EQ(load_bytes(good.substr(0, n)).code(), absl::StatusCode::kDataLoss) << n;
  }
  // Flipping bytes in the header region never crashes.
  for (size_t i = 0; i < 64 && i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0xff);
    (void)load_bytes(bad);
  }
  std::string huge = good;
  huge[16] = '\x7f';  // name length far beyond the file
  EXPECT_FALSE(load_bytes(huge).ok());
  EXPECT_EQ(LoadTensors("/nonexistent/dir/file").status().code(), absl::StatusCode::kNotFound);
}

// A path that cannot be read is a Status naming it (a directory used to abort the process
// with an uncaught std::ios_base::failure from the stream's first read).
TEST(SerializeTest, UnreadablePathsAreStatusesNamingThem) {
  char dir_template[] = "/tmp/gw-serialize-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  absl::StatusOr<NamedTensors> from_dir = LoadTensors(dir);
  EXPECT_EQ(from_dir.status().code(), absl::StatusCode::kFailedPrecondition) << from_dir.status();
  EXPECT_NE(from_dir.status().message().find(dir), std::string::npos) << from_dir.status();
  EXPECT_NE(from_dir.status().message().find("is a directory"), std::string::npos) << from_dir.status();
  absl::StatusOr<NamedTensors> missing = LoadTensors(dir + "/missing.gwtf");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("missing.gwtf"), std::string::npos) << missing.status();
  // Module::Load goes through it: a module given a directory gets the same Status.
  Generator gen(0);
  Linear layer(2, 2, gen);
  EXPECT_EQ(layer.Load(dir).code(), absl::StatusCode::kFailedPrecondition);
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace gw::nn
