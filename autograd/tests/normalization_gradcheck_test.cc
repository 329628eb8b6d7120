// Unit: batch, layer and group normalization (gradwire/autograd/normalization.h) against
// central finite differences in float64, on contiguous and strided inputs, with and
// without affine parameters, and with only some inputs needing gradients.
#include "gradwire/autograd/normalization.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/gradcheck.h"
#include "gradwire/tensor/kernels.h"

namespace gw {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Case {
  const char* name;
  std::vector<Shape> shapes;
  Fn fn;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Fixed tensors a case closes over (no gradient): running statistics, a constant input.
Tensor Fixed(const Shape& s, double low, double high, uint64_t seed) {
  Generator gen(seed);
  return Tensor::Uniform(s, low, high, gen, DType::kFloat64);
}

std::vector<Case> Cases() {
  const Tensor rm = Fixed({3}, -0.5, 0.5, 1), rv = Fixed({3}, 0.5, 2.0, 2);
  const Tensor x_const = Fixed({4, 3, 5}, -2, 2, 3);
  const Tensor none;
  auto bn_train = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    return BatchNorm(x, Tensor(), Tensor(), w, b, /*training=*/true);
  };
  return {
      {"BatchNormTrain", {{4, 3, 5}, {3}, {3}}, [=](auto& x) { return bn_train(x[0], x[1], x[2]); }},
      {"BatchNorm2D", {{2, 3, 2, 3}, {3}, {3}}, [=](auto& x) { return bn_train(x[0], x[1], x[2]); }},
      {"BatchNormNC", {{6, 3}, {3}, {3}}, [=](auto& x) { return bn_train(x[0], x[1], x[2]); }},
      {"BatchNormStrided", {{5, 3, 4}, {3}, {3}},
       [=](auto& x) { return bn_train(Permute(x[0], {2, 1, 0}), x[1], x[2]); }},
      {"BatchNormNoAffine", {{4, 3, 5}}, [=](auto& x) { return bn_train(x[0], none, none); }},
      {"BatchNormWeightOnly", {{3}}, [=](auto& x) { return bn_train(x_const, x[0], none); }},
      {"BatchNormParamsOnly", {{3}, {3}}, [=](auto& x) { return bn_train(x_const, x[0], x[1]); }},
      {"BatchNormEval", {{4, 3, 5}, {3}, {3}},
       [=](auto& x) { return BatchNorm(x[0], rm, rv, x[1], x[2], /*training=*/false); }},
      {"BatchNormEvalStrided", {{3, 5, 4}, {3}, {3}},
       [=](auto& x) { return BatchNorm(Transpose(x[0], 0, 1), rm, rv, x[1], x[2], false); }},
      {"LayerNorm", {{3, 4, 5}, {5}, {5}},
       [](auto& x) { return LayerNorm(x[0], {5}, x[1], x[2]); }},
      {"LayerNormTwoDims", {{3, 4, 5}, {4, 5}, {4, 5}},
       [](auto& x) { return LayerNorm(x[0], {4, 5}, x[1], x[2]); }},
      {"LayerNormStrided", {{5, 3, 4}, {5}, {5}},
       [](auto& x) { return LayerNorm(Permute(x[0], {1, 2, 0}), {5}, x[1], x[2]); }},
      {"LayerNormNarrowed", {{3, 8}, {5}, {5}},
       [](auto& x) { return LayerNorm(Narrow(x[0], 1, 2, 5), {5}, x[1], x[2]); }},
      {"LayerNormNoAffine", {{3, 6}}, [](auto& x) { return LayerNorm(x[0], {6}); }},
      {"LayerNormParamsOnly", {{5}, {5}},
       [=](auto& x) { return LayerNorm(x_const, {5}, x[0], x[1]); }},
      {"GroupNorm", {{2, 6, 3, 2}, {6}, {6}},
       [](auto& x) { return GroupNorm(x[0], 3, x[1], x[2]); }},
      {"GroupNormOneGroup", {{2, 4, 5}, {4}, {4}},
       [](auto& x) { return GroupNorm(x[0], 1, x[1], x[2]); }},
      {"GroupNormPerChannel", {{3, 4, 5}, {4}, {4}},
       [](auto& x) { return GroupNorm(x[0], 4, x[1], x[2]); }},
      {"GroupNormStrided", {{5, 2, 6}, {6}, {6}},
       [](auto& x) { return GroupNorm(Permute(x[0], {1, 2, 0}), 2, x[1], x[2]); }},
      {"GroupNormNoAffine", {{2, 4, 3}}, [](auto& x) { return GroupNorm(x[0], 2); }},
      {"GroupNormParamsOnly", {{3}, {3}},
       [=](auto& x) { return GroupNorm(x_const, 3, x[0], x[1]); }},
  };
}

class NormGradCheckTest : public ::testing::TestWithParam<Case> {};

TEST_P(NormGradCheckTest, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  Generator gen(11);
  std::vector<Tensor> inputs;
  for (const Shape& s : c.shapes) {
    Tensor t = Tensor::Randn(s, gen, DType::kFloat64);
    t.set_requires_grad(true);
    inputs.push_back(t);
  }
  autograd::GradCheckResult r = autograd::GradCheck(c.fn, inputs);
  EXPECT_TRUE(r.ok) << c.name << ": " << r.message;
  EXPECT_LT(r.max_abs_error, 1e-5) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Norms, NormGradCheckTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(NormalizationTest, BatchNormUpdatesRunningStatistics) {
  const Tensor x = Fixed({4, 2, 3}, -2, 2, 5);
  Tensor rm = Tensor::Zeros({2}, DType::kFloat64), rv = Tensor::Ones({2}, DType::kFloat64);
  BatchNorm(x, rm, rv, Tensor(), Tensor(), /*training=*/true, /*momentum=*/0.25);
  const Tensor per_channel = kernels::Reshape(kernels::Permute(x, {1, 0, 2}), {2, 12});
  const Tensor mean = kernels::Mean(per_channel, {1}, true);
  const Tensor dev = kernels::Sub(per_channel, mean);
  const Tensor unbiased = kernels::MulScalar(kernels::Sum(kernels::Mul(dev, dev), {1}), 1.0 / 11);
  EXPECT_LT(kernels::MaxAbsDiff(rm, kernels::MulScalar(kernels::Reshape(mean, {2}), 0.25)), 1e-14);
  EXPECT_LT(kernels::MaxAbsDiff(rv, kernels::AddScalar(kernels::MulScalar(unbiased, 0.25), 0.75)),
            1e-14);
}

TEST(NormalizationTest, SavedRunningStatisticsModifiedBeforeBackwardAreDetected) {
  Tensor x = Fixed({4, 3, 5}, -2, 2, 6);
  x.set_requires_grad(true);
  Tensor rm = Tensor::Zeros({3}, DType::kFloat64), rv = Tensor::Ones({3}, DType::kFloat64);
  Tensor y = Sum(BatchNorm(x, rm, rv, Tensor(), Tensor(), /*training=*/false));
  BatchNorm(x, rm, rv, Tensor(), Tensor(), /*training=*/true);  // updates rm, rv in place
  try {
    autograd::Backward({y});
    ADD_FAILURE() << "backward used running statistics modified after the forward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BatchNormBackward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(NormalizationTest, ErrorsNameTheOpAndShapes) {
  const Tensor x = Tensor::Zeros({1, 4}, DType::kFloat64);
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { BatchNorm(x, Tensor(), Tensor(), Tensor(), Tensor(), true); }),
            "BatchNorm: expected more than 1 value per channel when training, got input [1, 4]");
  EXPECT_EQ(message([&] { BatchNorm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); }),
            "BatchNorm: running_mean and running_var are required when not training");
  EXPECT_EQ(message([&] { LayerNorm(x, {5}); }),
            "LayerNorm: given normalized_shape=[5], expected input [*, 5], got [1, 4]");
  EXPECT_EQ(message([&] { GroupNorm(x, 3); }),
            "GroupNorm: num_groups=3 must divide the channels of input [1, 4]");
  EXPECT_EQ(message([&] { LayerNorm(x, {4}, Tensor::Ones({3}, DType::kFloat64)); }),
            "LayerNorm: weight must be [4] for input [1, 4], got [3]");
  EXPECT_EQ(message([&] { LayerNorm(x, {4}, Tensor::Ones({4})); }),
            "LayerNorm: dtype mismatch: float64 [1, 4] vs float32 [4]");
}

}  // namespace
}  // namespace gw
