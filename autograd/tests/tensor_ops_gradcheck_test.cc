// Unit: the tensor operations added for issue 29 (and the older ones they build on) against
// central finite differences in float64, on contiguous and strided (transposed, narrowed,
// expanded) inputs.
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

// A strided view of x [a, b]: its transpose [b, a].
Tensor T(const Tensor& x) { return Transpose(x, 0, 1); }
// A narrowed view: columns 1.. of x (neither contiguous nor column-major).
Tensor Cols(const Tensor& x) { return Narrow(x, -1, 1, x.sizes().back() - 1); }

std::vector<Case> Cases() {
  const Tensor idx = Tensor::FromVector<int64_t>({2, 0, 2, 1, 1, 0}, {2, 3});
  const Tensor mask = Tensor::FromVector<bool>({true, false, false, true}, {4, 1});
  return {
      // Batched MatMul with broadcast batch dims, strided operands, and a 2-D weight.
      {"MatMulBroadcast", {{2, 1, 3, 4}, {5, 4, 6}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"MatMulBroadcastLeft", {{3, 4}, {2, 4, 5}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"MatMulBatchedTransposed", {{2, 4, 3}, {2, 5, 4}},
       [](auto& x) { return MatMul(Transpose(x[0], 1, 2), Transpose(x[1], 1, 2)); }},
      {"MatMulBatchedNarrowed", {{2, 3, 5}, {2, 4, 3}},
       [](auto& x) { return MatMul(Cols(x[0]), Cols(x[1])); }},
      {"MatMulPermutedHeads", {{2, 3, 2, 4}, {2, 2, 4, 3}},
       [](auto& x) { return MatMul(Permute(x[0], {0, 2, 1, 3}), x[1]); }},
      {"MatMulExpandedBatch", {{1, 3, 4}, {2, 4, 2}},
       [](auto& x) { return MatMul(Expand(x[0], {2, 3, 4}), x[1]); }},
      {"MatMulStridedBatchWeight", {{2, 3, 4}, {5, 4}},
       [](auto& x) { return MatMul(Transpose(x[0], 0, 1), T(x[1])); }},
      // Shape.
      {"Flatten", {{2, 3, 4}}, [](auto& x) { return Flatten(x[0]) * 2.0; }},
      {"FlattenStrided", {{2, 3, 4}}, [](auto& x) { return Flatten(Transpose(x[0], 0, 2), 0, 1) * 2.0; }},
      {"SplitSize", {{5, 3}},
       [](auto& x) {
         auto p = Split(T(x[0]), 2, 1);
         return Cat({p[2] * 3.0, p[0] * p[1]}, 1);
       }},
      {"SplitSizes", {{4, 5}},
       [](auto& x) {
         auto p = Split(x[0], Shape{1, 3, 1}, 1);
         return p[1] * Sum(p[0] * p[2]);
       }},
      {"Chunk", {{6, 2}}, [](auto& x) {
         auto p = Chunk(x[0], 3, 0);
         return p[0] * p[1] - p[2];
       }},
      {"CatStrided", {{3, 2}, {2, 4}}, [](auto& x) { return Cat({x[0], T(Cols(x[1]))}, 1); }},
      {"StackStrided", {{2, 3}, {3, 2}}, [](auto& x) { return Stack({x[0], T(x[1])}, 0); }},
      {"PermuteReshapeStrided", {{2, 3, 4}},
       [](auto& x) { return Reshape(Permute(x[0], {2, 0, 1}), {4, 6}) * 2.0; }},
      // Indexing and selection.
      {"Gather", {{3, 4}}, [idx](auto& x) { return Gather(x[0], 1, idx); }},
      {"GatherDim0Strided", {{4, 3}}, [idx](auto& x) { return Gather(T(x[0]), 0, idx); }},
      {"GatherNarrowedIndexed", {{3, 5}}, [idx](auto& x) { return Gather(Cols(x[0]), 1, idx); }},
      {"MaskedFill", {{4, 3}}, [mask](auto& x) { return MaskedFill(x[0], mask, 7.0); }},
      {"MaskedFillStrided", {{3, 4}}, [mask](auto& x) { return MaskedFill(T(x[0]), mask, -1.0); }},
      {"MaskedFillBroadcastsInput", {{3}}, [mask](auto& x) { return MaskedFill(x[0], mask, 0.5); }},
      {"Where", {{4, 3}, {3}}, [mask](auto& x) { return Where(mask, x[0], x[1]); }},
      {"WhereStrided", {{3, 4}, {4, 1}}, [mask](auto& x) { return Where(mask, T(x[0]), x[1]); }},
      // Reductions.
      {"VarAll", {{3, 4}}, [](auto& x) { return Var(x[0]); }},
      {"VarDim", {{3, 4, 2}}, [](auto& x) { return Var(x[0], {1}); }},
      {"VarDimsKeepdimBiased", {{3, 4, 2}}, [](auto& x) { return Var(x[0], {0, -1}, 0, true); }},
      {"VarStrided", {{3, 5}}, [](auto& x) { return Var(T(Cols(x[0])), {0}); }},
      // Element-wise, contiguous and strided.
      {"Erf", {{3, 4}}, [](auto& x) { return Erf(x[0]); }},
      {"ErfStrided", {{3, 4}}, [](auto& x) { return Erf(T(x[0])); }},
      {"Gelu", {{3, 4}}, [](auto& x) { return Gelu(x[0] * 2.0); }},
      {"GeluStrided", {{3, 5}}, [](auto& x) { return Gelu(T(Cols(x[0])) * 2.0); }},
      {"GeluTanh", {{3, 4}}, [](auto& x) { return Gelu(x[0] * 2.0, GeluApproximate::kTanh); }},
      {"GeluTanhStrided", {{3, 4}}, [](auto& x) { return Gelu(T(x[0]), GeluApproximate::kTanh); }},
      {"Silu", {{3, 4}}, [](auto& x) { return Silu(x[0] * 2.0); }},
      {"SiluStrided", {{3, 5}}, [](auto& x) { return Silu(T(Cols(x[0]))); }},
      {"ExpStrided", {{3, 4}}, [](auto& x) { return Exp(T(x[0])); }},
      {"LogStrided", {{3, 4}}, [](auto& x) { return Log(Cols(x[0])); }, true},
      {"SqrtStrided", {{3, 4}}, [](auto& x) { return Sqrt(T(x[0])); }, true},
      {"PowStrided", {{3, 4}, {4, 3}}, [](auto& x) { return Pow(x[0], T(x[1])); }, true},
      {"TanhStrided", {{3, 4}}, [](auto& x) { return Tanh(T(x[0])); }},
      {"SigmoidStrided", {{3, 4}}, [](auto& x) { return Sigmoid(Cols(x[0])); }},
      {"LogSoftmaxDim0", {{3, 4}}, [](auto& x) { return LogSoftmax(x[0], 0); }},
      {"LogSoftmaxMiddleStrided", {{2, 3, 4}},
       [](auto& x) { return LogSoftmax(Transpose(x[0], 0, 2), 1); }},
      // Dropout with a fixed mask (a generator seeded afresh on every call).
      {"Dropout", {{4, 5}},
       [](auto& x) {
         Generator gen(3);
         return Dropout(x[0], 0.4, true, gen);
       }},
      {"FeatureDropoutStrided", {{3, 2, 4}},
       [](auto& x) {
         Generator gen(4);
         return FeatureDropout(Transpose(x[0], 0, 1), 0.5, true, gen);
       }},
  };
}

class TensorOpsGradCheckTest : public ::testing::TestWithParam<Case> {};

TEST_P(TensorOpsGradCheckTest, MatchesFiniteDifferences) {
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

INSTANTIATE_TEST_SUITE_P(Ops, TensorOpsGradCheckTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gw
