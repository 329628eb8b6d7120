// Unit: BatchNorm1d/2d, LayerNorm and GroupNorm against PyTorch reference values
// (make_reference_normalization.py) in float64 and float32 (float32 runs on oneDNN), plus
// their state-dict keys, defaults and error messages.
#include "gradwire/nn/normalization.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"

namespace gw::nn {
namespace {

using gw::testing::Det;

class NormReferenceTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ref_ = gw::testing::ReadReference(GRADWIRE_SOURCE_DIR
                                      "/nn/tests/data/normalization_reference.txt");
    ASSERT_FALSE(ref_.empty()) << "missing nn/tests/data/normalization_reference.txt";
  }

  DType dtype() const { return GetParam(); }
  Tensor Det(const Shape& s, double k) const { return kernels::ToDType(gw::testing::Det(s, k), dtype()); }

  // Relative to the tensor's largest value: 1e-10 in float64, 1e-5 in float32.
  void ExpectMatches(const std::string& name, const Tensor& t) {
    ASSERT_TRUE(ref_.count(name)) << name;
    ASSERT_TRUE(t.defined()) << name;
    const std::vector<double>& want = ref_[name];
    const std::vector<double> got = t.ToVector<double>();
    ASSERT_EQ(got.size(), want.size()) << name;
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    const double tol = (dtype() == DType::kFloat64 ? 1e-10 : 1e-5) * std::max(scale, 1e-3);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], tol) << name << "[" << i << "]";
    }
  }

  // What make_reference_normalization.py's run() does: parameters det(1) and det(2), two
  // training steps and one eval step on det(shape, 0 / 3 / 6) (a permuted view when `perm`
  // is given), output gradient det(out, 9); checks outputs, gradients and buffers.
  void Run(const std::string& name, Module& m, const Shape& shape, const Shape& perm = {}) {
    {
      autograd::NoGradGuard no_grad;
      for (const auto& [p_name, p] : m.NamedParameters()) {
        kernels::CopyInPlace(p, Det(p.sizes(), p_name == "weight" ? 1 : 2));
      }
    }
    const bool steps_train[] = {true, true, false};
    for (int step = 0; step < 3; ++step) {
      m.Train(steps_train[step]);
      m.ZeroGrad();
      Shape base = shape;
      for (size_t i = 0; i < perm.size(); ++i) base[perm[i]] = shape[i];
      Tensor leaf = Det(base, 3.0 * step);
      leaf.set_requires_grad(true);
      const Tensor x = perm.empty() ? leaf : gw::Permute(leaf, perm);
      ASSERT_EQ(x.sizes(), shape);
      Tensor out = m.Forward(x);
      autograd::Backward({out}, {Det(out.sizes(), 9)});
      const std::string prefix = name + "." + std::to_string(step);
      ExpectMatches(prefix + ".out", out);
      ExpectMatches(prefix + ".grad.input", leaf.grad());
      for (const auto& [p_name, p] : m.NamedParameters()) {
        ExpectMatches(prefix + ".grad." + p_name, p.grad());
      }
      for (const auto& [b_name, b] : m.NamedBuffers()) ExpectMatches(prefix + "." + b_name, b);
    }
  }

  std::map<std::string, std::vector<double>> ref_;
};

TEST_P(NormReferenceTest, BatchNorm2d) {
  BatchNorm2d bn(3, {.dtype = dtype()});
  Run("bn2d", bn, {4, 3, 2, 3});
}

TEST_P(NormReferenceTest, BatchNorm2dStridedInput) {
  BatchNorm2d bn(3, {.dtype = dtype()});
  Run("bn2d_strided", bn, {4, 3, 2, 3}, {3, 1, 0, 2});
}

TEST_P(NormReferenceTest, BatchNorm2dWithoutAffineOrRunningStats) {
  BatchNorm2d bn(3, {.affine = false, .track_running_stats = false, .dtype = dtype()});
  Run("bn2d_plain", bn, {2, 3, 3, 2});
}

TEST_P(NormReferenceTest, BatchNorm1dCumulativeAverage) {
  BatchNorm1d bn(4, {.momentum = std::nullopt, .dtype = dtype()});
  Run("bn1d", bn, {6, 4});
}

TEST_P(NormReferenceTest, BatchNorm1dSequence) {
  BatchNorm1d bn(4, {.eps = 1e-3, .momentum = 0.3, .dtype = dtype()});
  Run("bn1d_seq", bn, {3, 4, 5});
}

TEST_P(NormReferenceTest, LayerNorm) {
  LayerNorm ln({6}, {.dtype = dtype()});
  Run("ln", ln, {2, 3, 6});
}

TEST_P(NormReferenceTest, LayerNormStridedInput) {
  LayerNorm ln({6}, {.dtype = dtype()});
  Run("ln_strided", ln, {2, 3, 6}, {1, 2, 0});
}

TEST_P(NormReferenceTest, LayerNormTwoDimsWithoutAffine) {
  LayerNorm ln({3, 4}, {.elementwise_affine = false, .dtype = dtype()});
  Run("ln2", ln, {2, 3, 4});
}

TEST_P(NormReferenceTest, GroupNorm) {
  GroupNorm gn(2, 6, {.dtype = dtype()});
  Run("gn", gn, {2, 6, 3, 2});
}

TEST_P(NormReferenceTest, GroupNormStridedInput) {
  GroupNorm gn(3, 6, {.eps = 1e-4, .dtype = dtype()});
  Run("gn_strided", gn, {3, 6, 4}, {2, 1, 0});
}

INSTANTIATE_TEST_SUITE_P(DTypes, NormReferenceTest,
                         ::testing::Values(DType::kFloat64, DType::kFloat32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

std::vector<std::string> Keys(const NamedTensors& state) {
  std::vector<std::string> keys;
  for (const auto& [name, _] : state) keys.push_back(name);
  return keys;
}

TEST(NormalizationModuleTest, StateDictKeysAndDefaultsAreTorchs) {
  BatchNorm2d bn(4);
  EXPECT_EQ(Keys(bn.StateDict()), (std::vector<std::string>{"weight", "bias", "running_mean",
                                                             "running_var", "num_batches_tracked"}));
  EXPECT_EQ(bn.weight().ToVector<float>(), std::vector<float>(4, 1.f));
  EXPECT_EQ(bn.bias().ToVector<float>(), std::vector<float>(4, 0.f));
  EXPECT_EQ(bn.running_mean().ToVector<float>(), std::vector<float>(4, 0.f));
  EXPECT_EQ(bn.running_var().ToVector<float>(), std::vector<float>(4, 1.f));
  EXPECT_EQ(bn.num_batches_tracked().dtype(), DType::kInt64);
  EXPECT_EQ(bn.num_batches_tracked().dim(), 0);
  EXPECT_EQ(bn.NumParameters(), 8);
  EXPECT_EQ(Keys(BatchNorm1d(4, {.affine = false}).StateDict()),
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ(Keys(BatchNorm1d(4, {.track_running_stats = false}).StateDict()),
            (std::vector<std::string>{"weight", "bias"}));
  LayerNorm ln({3, 4});
  EXPECT_EQ(Keys(ln.StateDict()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(ln.weight().sizes(), (Shape{3, 4}));
  EXPECT_TRUE(LayerNorm({3}, {.elementwise_affine = false}).StateDict().empty());
  GroupNorm gn(2, 6);
  EXPECT_EQ(Keys(gn.StateDict()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(gn.weight().sizes(), (Shape{6}));
  EXPECT_EQ(bn.ToString(),
            "BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)");
  EXPECT_EQ(BatchNorm1d(2, {.momentum = std::nullopt}).ToString(),
            "BatchNorm1d(2, eps=1e-05, momentum=none, affine=true, track_running_stats=true)");
  EXPECT_EQ(ln.ToString(), "LayerNorm([3, 4], eps=1e-05, elementwise_affine=true)");
  EXPECT_EQ(gn.ToString(), "GroupNorm(2, 6, eps=1e-05, affine=true)");
}

TEST(NormalizationModuleTest, StateDictRoundTripsRunningStatistics) {
  BatchNorm2d a(2, {.dtype = DType::kFloat64}), b(2, {.dtype = DType::kFloat64});
  a.Forward(Det({3, 2, 2, 2}, 0));
  a.Forward(Det({3, 2, 2, 2}, 1));
  ASSERT_TRUE(b.LoadStateDict(a.StateDict()).ok());
  EXPECT_EQ(b.num_batches_tracked().item<int64_t>(), 2);
  EXPECT_EQ(b.running_mean().ToVector<double>(), a.running_mean().ToVector<double>());
  EXPECT_EQ(b.running_var().ToVector<double>(), a.running_var().ToVector<double>());
  a.Eval();
  b.Eval();
  const Tensor x = Det({1, 2, 3, 3}, 2);  // eval mode takes a single sample
  EXPECT_EQ(a.Forward(x).ToVector<double>(), b.Forward(x).ToVector<double>());
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(NormalizationModuleTest, ErrorsNameTheModuleAndShapes) {
  BatchNorm2d bn2(64);
  EXPECT_EQ(ErrorOf([&] { bn2.Forward(Tensor::Zeros({8, 32, 5, 5})); }),
            "BatchNorm2d(64): expected input [N, 64, H, W], got [8, 32, 5, 5]");
  EXPECT_EQ(ErrorOf([&] { bn2.Forward(Tensor::Zeros({8, 64})); }),
            "BatchNorm2d(64): expected input [N, 64, H, W], got [8, 64]");
  EXPECT_EQ(ErrorOf([&] { bn2.Forward(Tensor::Zeros({8, 64, 2, 2}, DType::kFloat64)); }),
            "BatchNorm2d(64): expected float32 input, got float64 [8, 64, 2, 2]");
  EXPECT_EQ(ErrorOf([&] { bn2.Forward(Tensor::Zeros({1, 64, 1, 1})); }),
            "BatchNorm: expected more than 1 value per channel when training, got input "
            "[1, 64, 1, 1]");
  EXPECT_EQ(bn2.num_batches_tracked().item<int64_t>(), 0);  // a failed call changes nothing
  BatchNorm1d bn1(3);
  EXPECT_EQ(ErrorOf([&] { bn1.Forward(Tensor::Zeros({4, 3, 2, 2})); }),
            "BatchNorm1d(3): expected input [N, 3] or [N, 3, L], got [4, 3, 2, 2]");
  LayerNorm ln({128});
  EXPECT_EQ(ErrorOf([&] { ln.Forward(Tensor::Zeros({64, 49, 64})); }),
            "LayerNorm([128]): expected input [*, 128], got [64, 49, 64]");
  GroupNorm gn(4, 16);
  EXPECT_EQ(ErrorOf([&] { gn.Forward(Tensor::Zeros({2, 12, 3})); }),
            "GroupNorm(4, 16): expected input [N, 16, *], got [2, 12, 3]");
  EXPECT_EQ(ErrorOf([] { GroupNorm(5, 16); }),
            "GroupNorm: num_channels=16 must be a positive multiple of num_groups=5");
  EXPECT_EQ(ErrorOf([] { BatchNorm2d(4, {.momentum = 1.5}); }),
            "BatchNorm2d: momentum must be in [0, 1], got 1.5");
}

}  // namespace
}  // namespace gw::nn
