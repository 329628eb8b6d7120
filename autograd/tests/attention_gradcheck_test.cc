// Unit: the fused multi-head attention (gradwire/autograd/attention.h) against central
// finite differences in float64 (masks of every kind, dropout, weights, packed and strided
// inputs, only some inputs needing gradients), against the same attention composed of
// differentiable ops, and float32 (oneDNN) against float64.
#include "gradwire/autograd/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
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

Tensor Fixed(const Shape& s, uint64_t seed, DType dtype = DType::kFloat64) {
  Generator gen(seed);
  return Tensor::Uniform(s, -1, 1, gen, dtype);
}

// Causal: key s is masked for query l when s > l.
Tensor Causal(int64_t l, int64_t s) {
  return kernels::Gt(kernels::Reshape(Tensor::Arange(0, static_cast<double>(s)), {1, s}),
                     kernels::Reshape(Tensor::Arange(0, static_cast<double>(l)), {l, 1}));
}

// Key padding for N = 2, S = 4: the last key of sample 0 and the first two of sample 1.
Tensor KeyPadding() {
  return Tensor::FromVector<bool>({false, false, false, true, true, true, false, false},
                                  {2, 1, 1, 4});
}

Tensor Out(const AttentionResult& r) { return r.output; }

// Output and weights as one tensor, so that both are checked.
Tensor Both(const AttentionResult& r) {
  return Cat({Reshape(r.output, {-1}), Reshape(r.weights, {-1})}, 0);
}

std::vector<Case> Cases() {
  const Tensor float_mask = Fixed({3, 4}, 1);
  const Tensor head_mask = Fixed({2, 2, 3, 4}, 2);
  const Tensor q_const = Fixed({2, 3, 4}, 3), k_const = Fixed({2, 4, 4}, 4);
  const Tensor v_const = Fixed({2, 4, 6}, 5);
  const Shape q{2, 3, 4}, kk{2, 4, 4}, v{2, 4, 6};
  auto mha = [](const std::vector<Tensor>& x, AttentionOptions o = {}) {
    return MultiHeadAttention(x[0], x[1], x[2], 2, o);
  };
  return {
      {"Plain", {q, kk, v}, [=](auto& x) { return Out(mha(x)); }},
      {"OneHead", {q, kk, v}, [=](auto& x) { return Out(MultiHeadAttention(x[0], x[1], x[2], 1)); }},
      {"FloatMask", {q, kk, v}, [=](auto& x) { return Out(mha(x, {.mask = float_mask})); }},
      {"PerHeadFloatMask", {q, kk, v}, [=](auto& x) { return Out(mha(x, {.mask = head_mask})); }},
      {"CausalBoolMask", {{2, 4, 4}, kk, v},
       [=](auto& x) { return Out(mha(x, {.mask = Causal(4, 4)})); }},
      {"KeyPaddingMask", {q, kk, v}, [=](auto& x) { return Out(mha(x, {.mask = KeyPadding()})); }},
      {"Weights", {q, kk, v},
       [=](auto& x) { return Both(mha(x, {.mask = float_mask, .need_weights = true})); }},
      {"Scale", {q, kk, v}, [=](auto& x) { return Out(mha(x, {.scale = 0.3})); }},
      {"Dropout", {q, kk, v},
       [=](auto& x) {
         Generator gen(7);  // the same mask on every evaluation
         return Both(mha(x, {.dropout_p = 0.4, .gen = &gen, .need_weights = true}));
       }},
      // q seq-first (transposed), k narrowed, v with column-major head matrices.
      {"StridedViews", {{3, 2, 4}, {2, 4, 7}, {2, 6, 4}},
       [=](auto& x) {
         return Out(MultiHeadAttention(Transpose(x[0], 0, 1), Narrow(x[1], 2, 1, 4),
                                       Transpose(x[2], 1, 2), 2, {.mask = KeyPadding()}));
       }},
      // Neither stride of the head matrices is 1: copied before the GEMMs.
      {"StridedCopied", {{4, 6, 2}, v},
       [=](auto& x) {
         const Tensor qk = Permute(x[0], {2, 0, 1});  // [2, 4, 6], strides (1, 12, 2)
         return Out(MultiHeadAttention(qk, qk, x[1], 2));
       }},
      {"OnlyQuery", {q}, [=](auto& x) { return Out(mha({x[0], k_const, v_const})); }},
      {"OnlyKey", {kk}, [=](auto& x) { return Out(mha({q_const, x[0], v_const})); }},
      {"OnlyValue", {v}, [=](auto& x) { return Out(mha({q_const, k_const, x[0]})); }},
      {"OnlyWeightsUsed", {q, kk, v},
       [=](auto& x) { return mha(x, {.mask = float_mask, .need_weights = true}).weights; }},
      {"PackedSelfAttention", {{2, 3, 12}},
       [=](auto& x) {
         return Both(MultiHeadSelfAttention(x[0], 2, {.mask = Causal(3, 3), .need_weights = true}));
       }},
      {"PackedSeqFirst", {{3, 2, 12}},
       [=](auto& x) { return Out(MultiHeadSelfAttention(Transpose(x[0], 0, 1), 2)); }},
  };
}

class AttentionGradCheckTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionGradCheckTest, MatchesFiniteDifferences) {
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

INSTANTIATE_TEST_SUITE_P(Attention, AttentionGradCheckTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// The attention written with differentiable ops (PyTorch 1.13's formula).
Tensor Composed(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads,
                const Tensor& float_mask) {
  auto split = [heads](const Tensor& t) {  // [N, L, H*D] -> [N, H, L, D]
    return Permute(Reshape(t, {t.size(0), t.size(1), heads, t.size(2) / heads}), {0, 2, 1, 3});
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2) / heads));
  Tensor scores = MatMul(split(q) * scale, Transpose(split(k), -1, -2));
  if (float_mask.defined()) scores = scores + float_mask;
  Tensor out = MatMul(Softmax(scores, -1), split(v));  // [N, H, L, Dv]
  return Reshape(Permute(out, {0, 2, 1, 3}), {q.size(0), q.size(1), v.size(2)});
}

// Output and input gradients of the fused op and of `Composed` on the same inputs.
void ExpectSameAsComposed(DType dtype, double tol) {
  const Tensor mask = kernels::ToDType(Fixed({2, 1, 5, 7}, 9), dtype);
  std::vector<Tensor> fused_in, composed_in;
  for (const Shape& s : std::vector<Shape>{{2, 5, 8}, {2, 7, 8}, {2, 7, 12}}) {
    const Tensor t = kernels::ToDType(Fixed(s, s[1] * 10 + s[2]), dtype);
    fused_in.push_back(kernels::Clone(t).set_requires_grad(true));
    composed_in.push_back(kernels::Clone(t).set_requires_grad(true));
  }
  const Tensor g = kernels::ToDType(Fixed({2, 5, 12}, 13), dtype);
  const Tensor fused =
      MultiHeadAttention(fused_in[0], fused_in[1], fused_in[2], 4, {.mask = mask}).output;
  const Tensor composed = Composed(composed_in[0], composed_in[1], composed_in[2], 4, mask);
  autograd::Backward({fused}, {g});
  autograd::Backward({composed}, {g});
  EXPECT_LT(kernels::MaxAbsDiff(fused, composed), tol);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LT(kernels::MaxAbsDiff(fused_in[i].grad(), composed_in[i].grad()), tol) << i;
  }
}

TEST(AttentionTest, Float64MatchesComposedOps) { ExpectSameAsComposed(DType::kFloat64, 1e-13); }

TEST(AttentionTest, Float32MatchesComposedOps) { ExpectSameAsComposed(DType::kFloat32, 1e-5); }

TEST(AttentionTest, PackedGradientIsOneTensorShapedLikeQkv) {
  Tensor base = Fixed({5, 2, 24}, 21, DType::kFloat32);  // seq-first [L, N, 3E]
  base.set_requires_grad(true);
  const Tensor qkv = Transpose(base, 0, 1);
  const AttentionResult r = MultiHeadSelfAttention(qkv, 4, {.need_weights = true});
  EXPECT_EQ(r.output.sizes(), (Shape{2, 5, 8}));
  EXPECT_TRUE(kernels::Transpose(r.output, 0, 1).is_contiguous());  // in q's (seq-first) order
  EXPECT_EQ(r.weights.sizes(), (Shape{2, 4, 5, 5}));
  autograd::Backward({Sum(r.output * r.output)});
  ASSERT_TRUE(base.grad().defined());
  EXPECT_EQ(base.grad().sizes(), base.sizes());
}

TEST(AttentionTest, DropoutDropsAboutPOfTheWeightsAndScalesTheRest) {
  Generator gen(5);
  const Tensor x = Fixed({4, 64, 8}, 6, DType::kFloat32);
  const AttentionOptions options{.dropout_p = 0.3, .gen = &gen, .need_weights = true};
  const AttentionResult kept = MultiHeadAttention(x, x, x, 2, {.need_weights = true});
  const AttentionResult first = MultiHeadAttention(x, x, x, 2, options);
  const AttentionResult second = MultiHeadAttention(x, x, x, 2, options);
  const std::vector<float> all = kept.weights.ToVector<float>();
  const std::vector<float> a = first.weights.ToVector<float>();
  const std::vector<float> b = second.weights.ToVector<float>();
  int64_t dropped = 0, differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == 0) {
      ++dropped;
    } else {
      EXPECT_NEAR(a[i], all[i] / 0.7f, 1e-6f) << i;
    }
    differ += (a[i] == 0) != (b[i] == 0);
  }
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(a.size()), 0.3, 0.02);
  EXPECT_GT(differ, static_cast<int64_t>(a.size() / 4));  // each call draws a new mask
}

TEST(AttentionTest, FullyMaskedRowsGiveNanAsPyTorch) {
  const Tensor x = Fixed({1, 2, 4}, 3);
  const Tensor mask = Tensor::FromVector<bool>({true, true, false, false}, {2, 2});
  const Tensor out = MultiHeadAttention(x, x, x, 1, {.mask = mask}).output;
  const std::vector<double> v = out.ToVector<double>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_FALSE(std::isnan(v[4]));
}

TEST(AttentionTest, ErrorsNameTheOpAndShapes) {
  const Tensor q = Tensor::Zeros({2, 3, 8}), k = Tensor::Zeros({2, 5, 8});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { MultiHeadAttention(q, k, Tensor::Zeros({2, 4, 8}), 2); }),
            "MultiHeadAttention: expected q [N, L, E], k [N, S, E] and v [N, S, Ev], got q "
            "[2, 3, 8], k [2, 5, 8], v [2, 4, 8]");
  EXPECT_EQ(message([&] { MultiHeadAttention(q, k, k, 3); }),
            "MultiHeadAttention: the widths of q [2, 3, 8] and v [2, 5, 8] must be multiples of "
            "num_heads=3");
  EXPECT_EQ(message([&] { MultiHeadAttention(q, k, k, 2, {.mask = Tensor::Zeros({3, 4})}); }),
            "MultiHeadAttention: mask [3, 4] does not broadcast to [N, H, L, S] = [2, 2, 3, 5]");
  EXPECT_EQ(message([&] { MultiHeadAttention(Tensor::Zeros({3, 8}), k, k, 2); }),
            "MultiHeadAttention: expected q [N, L, E], got [3, 8]");
  EXPECT_EQ(message([&] { MultiHeadSelfAttention(q, 2); }),
            "MultiHeadAttention: the width of qkv [2, 3, 8] must be a multiple of 3 * num_heads=6");
  EXPECT_EQ(message([&] { MultiHeadAttention(q, k, k, 2, {.dropout_p = 0.5}); }),
            "MultiHeadAttention: dropout_p > 0 needs a Generator");
}

}  // namespace
}  // namespace gw
