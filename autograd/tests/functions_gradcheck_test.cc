// Unit: every differentiable op in gradwire/autograd/functions.h against central finite
// differences in float64.
#include <gtest/gtest.h>

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
  bool positive = false;  // inputs drawn from (0.5, 2) instead of N(0, 1)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  const Tensor idx = Tensor::FromVector<int64_t>({2, 0, 2, 1});
  return {
      {"Add", {{3, 4}, {4}}, [](auto& x) { return x[0] + x[1]; }},
      {"AddBroadcastBoth", {{3, 1}, {1, 4}}, [](auto& x) { return Add(x[0], x[1]); }},
      {"Sub", {{3, 4}, {3, 1}}, [](auto& x) { return x[0] - x[1]; }},
      {"Mul", {{2, 3}, {2, 3}}, [](auto& x) { return x[0] * x[1]; }},
      {"MulBroadcast", {{2, 3}, {3}}, [](auto& x) { return x[0] * x[1]; }},
      {"Div", {{2, 3}, {2, 3}}, [](auto& x) { return x[0] / x[1]; }, true},
      {"Pow", {{2, 3}, {2, 3}}, [](auto& x) { return Pow(x[0], x[1]); }, true},
      {"PowScalar", {{5}}, [](auto& x) { return Pow(x[0], 3.0); }},
      {"Scalars", {{4}}, [](auto& x) { return (2.0 - x[0]) * 3.0 + 1.0 - x[0] / 4.0; }},
      {"Neg", {{4}}, [](auto& x) { return -x[0]; }},
      {"Exp", {{2, 2}}, [](auto& x) { return Exp(x[0]); }},
      {"Log", {{2, 2}}, [](auto& x) { return Log(x[0]); }, true},
      {"Sqrt", {{2, 2}}, [](auto& x) { return Sqrt(x[0]); }, true},
      {"Relu", {{3, 5}}, [](auto& x) { return Relu(x[0]); }},
      {"Tanh", {{3, 5}}, [](auto& x) { return Tanh(x[0]); }},
      {"Sigmoid", {{3, 5}}, [](auto& x) { return Sigmoid(x[0]); }},
      {"SumAll", {{2, 3, 4}}, [](auto& x) { return Sum(x[0]); }},
      {"SumDims", {{2, 3, 4}}, [](auto& x) { return Sum(x[0], {0, 2}); }},
      {"SumKeepdim", {{2, 3, 4}}, [](auto& x) { return Sum(x[0], {-1}, true); }},
      {"Mean", {{2, 3, 4}}, [](auto& x) { return Mean(x[0], {1}); }},
      {"MeanAll", {{2, 3}}, [](auto& x) { return Mean(x[0]); }},
      {"Max", {{3, 4}}, [](auto& x) { return Max(x[0], 1); }},
      {"MaxKeepdim", {{3, 4}}, [](auto& x) { return Max(x[0], 0, true); }},
      {"MatMul2D", {{3, 4}, {4, 5}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"MatMulVecMat", {{4}, {4, 5}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"MatMulMatVec", {{3, 4}, {4}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"MatMulDot", {{4}, {4}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"MatMulBatched", {{2, 3, 4}, {2, 4, 2}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"MatMulBroadcast", {{2, 3, 4}, {4, 2}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"MatMulTransposed", {{4, 3}, {5, 4}},
       [](auto& x) { return MatMul(Transpose(x[0], 0, 1), Transpose(x[1], 0, 1)); }},
      {"Linear", {{3, 4}, {5, 4}, {5}}, [](auto& x) { return Linear(x[0], x[1], x[2]); }},
      {"Linear3D", {{2, 3, 4}, {5, 4}, {5}}, [](auto& x) { return Linear(x[0], x[1], x[2]); }},
      {"LinearNoBias", {{3, 4}, {5, 4}}, [](auto& x) { return Linear(x[0], x[1], Tensor()); }},
      {"Softmax", {{3, 5}}, [](auto& x) { return Softmax(x[0], 1); }},
      {"Softmax0", {{3, 5}}, [](auto& x) { return Softmax(x[0], 0); }},
      {"LogSoftmax", {{3, 5}}, [](auto& x) { return LogSoftmax(x[0], -1); }},
      {"Reshape", {{2, 6}}, [](auto& x) { return Reshape(x[0], {3, -1}) * 2.0; }},
      {"Transpose", {{2, 3}}, [](auto& x) { return Transpose(x[0], 0, 1) * 2.0; }},
      {"Permute", {{2, 3, 4}}, [](auto& x) { return Permute(x[0], {2, 0, 1}) * 2.0; }},
      {"Narrow", {{4, 3}}, [](auto& x) { return Narrow(x[0], 0, 1, 2) * 2.0; }},
      {"Select", {{4, 3}}, [](auto& x) { return Select(x[0], 1, 2) * 2.0; }},
      {"Expand", {{3, 1}}, [](auto& x) { return Expand(x[0], {2, 3, 4}) * 2.0; }},
      {"SqueezeUnsqueeze", {{3, 1}}, [](auto& x) { return Unsqueeze(Squeeze(x[0], 1), 0) * 2.0; }},
      {"Contiguous", {{3, 4}}, [](auto& x) { return Contiguous(Transpose(x[0], 0, 1)) * 2.0; }},
      {"IndexSelect", {{3, 2}}, [idx](auto& x) { return IndexSelect(x[0], 0, idx); }},
      {"IndexSelectDim1", {{2, 3}}, [idx](auto& x) { return IndexSelect(x[0], 1, idx); }},
      {"IndexAdd", {{3, 2}, {4, 2}}, [idx](auto& x) { return IndexAdd(x[0], 0, idx, x[1]); }},
      {"Cat", {{2, 3}, {1, 3}}, [](auto& x) { return Cat({x[0], x[1]}, 0); }},
      {"Stack", {{2, 3}, {2, 3}}, [](auto& x) { return Stack({x[0], x[1]}, 1); }},
      {"Chain", {{4, 3}, {2, 3}},
       [](auto& x) { return Sum(Tanh(MatMul(x[0], Transpose(x[1], 0, 1))) * x[0].sizes()[0], {0}); }},
      {"Reuse", {{3}}, [](auto& x) { return x[0] * x[0] + Exp(x[0]) * x[0]; }},
  };
}

class GradCheckTest : public ::testing::TestWithParam<Case> {};

TEST_P(GradCheckTest, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  Generator gen(7);
  std::vector<Tensor> inputs;
  for (const Shape& s : c.shapes) {
    Tensor t = c.positive ? Tensor::Uniform(s, 0.5, 2.0, gen, DType::kFloat64)
                          : Tensor::Randn(s, gen, DType::kFloat64);
    t.set_requires_grad(true);
    inputs.push_back(t);
  }
  autograd::GradCheckResult r = autograd::GradCheck(c.fn, inputs);
  EXPECT_TRUE(r.ok) << c.name << ": " << r.message;
  EXPECT_LT(r.max_abs_error, 1e-5) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheckTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gw
