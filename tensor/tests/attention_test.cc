// Unit: attention kernels (tensor/attention.h) and the dropout stream they share with
// DropoutMask: the fused forward against per-head products of kernels::MatMul and
// Softmax (float64, strided and sequence-first operands, a bool mask), float32 against
// float64, the backward's gradient mask, the packed backward against the unpacked one,
// dropout drawing DropoutMask's stream, and the errors. Gradients themselves are
// gradchecked in autograd/tests/attention_gradcheck_test.cc.
#include "gradwire/tensor/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

// max |a - b| <= rtol * max |b|.
void ExpectClose(const Tensor& a, const Tensor& b, double rtol, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double scale = std::max(MaxAll(Abs(ToDType(b, DType::kFloat64))).item(), 1e-300);
  EXPECT_LE(MaxAbsDiff(ToDType(a, DType::kFloat64), ToDType(b, DType::kFloat64)),
            rtol * scale)
      << what;
}

Tensor Randn(const Shape& sizes, uint64_t seed, DType dtype = DType::kFloat64) {
  Generator gen(seed);
  return Tensor::Randn(sizes, gen, dtype);
}

// softmax(scale * q_h k_h^T + mask) v_h head by head, from kernels::MatMul and Softmax.
Tensor Reference(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads,
                 const Tensor& float_mask) {
  const int64_t d = q.size(2) / heads, dv = v.size(2) / heads;
  std::vector<Tensor> outs;
  for (int64_t h = 0; h < heads; ++h) {
    const Tensor qh = Narrow(q, 2, h * d, d), kh = Narrow(k, 2, h * d, d);
    Tensor scores = MulScalar(MatMul(qh, Transpose(kh, 1, 2)), 1 / std::sqrt(double(d)));
    if (float_mask.defined()) scores = Add(scores, float_mask);
    outs.push_back(MatMul(Softmax(scores, -1), Narrow(v, 2, h * dv, dv)));
  }
  return Cat(outs, 2);
}

TEST(AttentionKernelTest, ForwardMatchesPerHeadProductsOnStridedOperands) {
  const int64_t n = 2, l = 5, s = 7, heads = 2;
  // q sequence-first ([L, N, E] transposed), k narrowed out of a wider tensor, v [N, S, 6].
  const Tensor q = Transpose(Randn({l, n, 8}, 1), 0, 1);
  const Tensor k = Narrow(Randn({n, s, 12}, 2), 2, 2, 8);
  const Tensor v = Randn({n, s, 6}, 3);
  const Tensor mask = Gt(Randn({l, s}, 4), Tensor::Full({}, 1.2, DType::kFloat64));
  const Tensor float_mask = MaskedFill(Tensor::Zeros({l, s}, DType::kFloat64), mask,
                                       -std::numeric_limits<double>::infinity());
  const AttentionState f =
      MultiHeadAttentionForward(q, k, v, {.num_heads = heads, .mask = mask});
  ASSERT_EQ(f.output.sizes(), (Shape{n, l, 6}));
  EXPECT_TRUE(Transpose(f.output, 0, 1).is_contiguous());  // in q's order of N and L
  EXPECT_TRUE(f.dropped.is_same(f.weights));               // no dropout: one tensor
  ExpectClose(f.output, Reference(q, k, v, heads, float_mask), 1e-13, "output");
  // A float32 run of the same operands agrees to float32's precision.
  const auto f32 = [](const Tensor& t) { return ToDType(t, DType::kFloat32); };
  const AttentionState g = MultiHeadAttentionForward(f32(q), f32(k), f32(v),
                                                     {.num_heads = heads, .mask = mask});
  ExpectClose(g.output, f.output, 1e-5, "float32 output");
  ExpectClose(g.weights, f.weights, 1e-5, "float32 weights");
}

TEST(AttentionKernelTest, BackwardComputesOnlyWhatIsAskedAndPackedEqualsUnpacked) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    const int64_t n = 2, l = 4, e = 6, heads = 3;
    const Tensor qkv = Randn({n, l, 3 * e}, 5, dtype);
    const Tensor q = Narrow(qkv, 2, 0, e), k = Narrow(qkv, 2, e, e), v = Narrow(qkv, 2, 2 * e, e);
    const Tensor go = Randn({n, l, e}, 6, dtype), gw = Randn({n, heads, l, l}, 7, dtype);
    const AttentionArgs args{.num_heads = heads, .scale = 0.7};
    const AttentionState f = MultiHeadAttentionForward(q, k, v, args);
    const AttentionGrads all = MultiHeadAttentionBackward(f, go, gw);
    const AttentionGrads only_k = MultiHeadAttentionBackward(f, go, gw, {.q = false, .v = false});
    EXPECT_FALSE(only_k.q.defined());
    EXPECT_FALSE(only_k.v.defined());
    ASSERT_TRUE(only_k.k.defined());
    EXPECT_EQ(MaxAbsDiff(only_k.k, all.k), 0);
    const AttentionGrads none = MultiHeadAttentionBackward(f, Tensor(), Tensor());
    EXPECT_FALSE(none.q.defined() || none.k.defined() || none.v.defined());
    // The packed forward and backward give the same numbers, the gradient in one tensor.
    const AttentionState p = MultiHeadSelfAttentionForward(qkv, args);
    EXPECT_EQ(MaxAbsDiff(p.output, f.output), 0);
    const Tensor packed = MultiHeadSelfAttentionBackward(p, go, gw);
    EXPECT_EQ(MaxAbsDiff(packed, Cat({all.q, all.k, all.v}, 2)), 0);
    // Only the weights' gradient: v gets zeros.
    const AttentionGrads weights_only = MultiHeadAttentionBackward(f, Tensor(), gw);
    EXPECT_EQ(MaxAll(Abs(weights_only.v)).item(), 0);
  }
}

TEST(AttentionKernelTest, DropoutDrawsDropoutMasksStream) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Tensor x = Randn({3, 9, 8}, 8, dtype);
    Generator a(11), b(11);
    const AttentionState f =
        MultiHeadAttentionForward(x, x, x, {.num_heads = 2, .dropout_p = 0.4, .gen = &a});
    const Tensor mask = DropoutMask(f.weights.sizes(), 0.4, dtype, b);
    EXPECT_EQ(MaxAbsDiff(f.dropped, Mul(f.weights, mask)), 0);
    EXPECT_EQ(a.NextU64(), b.NextU64());  // one draw each
  }
}

TEST(DropoutMaskTest, ReproducibleFromTheSeedAndNewOnEveryCall) {
  Generator a(21), b(21);
  const Tensor first = DropoutMask({1000, 37}, 0.5, DType::kFloat32, a);
  EXPECT_EQ(first.ToVector<float>(),
            DropoutMask({1000, 37}, 0.5, DType::kFloat32, b).ToVector<float>());
  const std::vector<float> x = first.ToVector<float>();
  const std::vector<float> y = DropoutMask({1000, 37}, 0.5, DType::kFloat32, a).ToVector<float>();
  int64_t differ = 0, kept = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    differ += (x[i] == 0) != (y[i] == 0);
    kept += x[i] != 0;
  }
  EXPECT_NEAR(static_cast<double>(differ) / x.size(), 0.5, 0.02);  // independent masks
  EXPECT_NEAR(static_cast<double>(kept) / x.size(), 0.5, 0.02);
  // float64 masks decide alike from the same seed.
  Generator c(21);
  const Tensor f64 = DropoutMask({1000, 37}, 0.5, DType::kFloat64, c);
  EXPECT_EQ(MaxAbsDiff(ToDType(first, DType::kFloat64), f64), 0);
  // p = 0 keeps everything at scale 1.
  EXPECT_EQ(MaxAbsDiff(DropoutMask({5, 3}, 0, DType::kFloat64, c),
                       Tensor::Ones({5, 3}, DType::kFloat64)),
            0);
}

TEST(AttentionKernelTest, ErrorsNameTheOpAndShapes) {
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor x = Tensor::Zeros({2, 3, 8});
  const Tensor x64 = Tensor::Zeros({2, 3, 8}, DType::kFloat64);
  EXPECT_EQ(message([&] { MultiHeadAttentionForward(x, x, x64, {}); }),
            "MultiHeadAttention: dtype mismatch: q float32, k float32, v float64");
  EXPECT_EQ(message([&] { MultiHeadAttentionForward(x, x, x, {.num_heads = 0}); }),
            "MultiHeadAttention: the widths of q [2, 3, 8] and v [2, 3, 8] must be multiples of "
            "num_heads=0");
  const AttentionState f = MultiHeadAttentionForward(x, x, x, {.num_heads = 2});
  EXPECT_EQ(message([&] { MultiHeadAttentionBackward(f, Tensor::Zeros({2, 3, 4}), Tensor()); }),
            "MultiHeadAttentionBackward: expected a float32 output gradient [2, 3, 8], got "
            "float32 [2, 3, 4]");
}

}  // namespace
}  // namespace gw::kernels
