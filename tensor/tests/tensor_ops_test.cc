// Unit: kernels added for issue 29 — batched MatMul (oneDNN matmul in float32, strided and
// broadcast operands) against float64, Split/Chunk/Flatten views, Gather/ScatterAdd,
// Where/MaskedFill, Var, GELU/SiLU float32 (oneDNN) against float64, dropout masks.
#include <gtest/gtest.h>

#include <cmath>

#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

// a x b computed in float64 batch by batch (the reference for the float32 path).
Tensor BatchedReference(const Tensor& a, const Tensor& b) {
  return MatMul(ToDType(a, DType::kFloat64), ToDType(b, DType::kFloat64));
}

TEST(BatchedMatMulTest, Float32MatchesFloat64ForAttentionLayouts) {
  Generator gen(1);
  Tensor q = Tensor::Randn({8, 4, 49, 32}, gen);
  Tensor k = Tensor::Randn({8, 4, 49, 32}, gen);
  Tensor v = Tensor::Randn({8, 49, 4, 32}, gen);
  // q k^T with k transposed (a column-major view), then scores x v with v's heads permuted.
  Tensor scores = MatMul(q, Transpose(k, -1, -2));
  ASSERT_EQ(scores.sizes(), Shape({8, 4, 49, 49}));
  EXPECT_LT(MaxAbsDiff(ToDType(scores, DType::kFloat64), BatchedReference(q, Transpose(k, -1, -2))),
            1e-4);
  Tensor vh = Permute(v, {0, 2, 1, 3});
  Tensor out = MatMul(scores, vh);
  EXPECT_LT(MaxAbsDiff(ToDType(out, DType::kFloat64), BatchedReference(scores, vh)), 1e-3);
}

TEST(BatchedMatMulTest, BroadcastExpandedAndNarrowedOperands) {
  Generator gen(2);
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    const double tol = dt == DType::kFloat32 ? 1e-5 : 1e-13;
    Tensor a = Tensor::Randn({2, 1, 3, 4}, gen, dt), b = Tensor::Randn({5, 4, 6}, gen, dt);
    Tensor c = MatMul(a, b);
    ASSERT_EQ(c.sizes(), Shape({2, 5, 3, 6}));
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < 5; ++j) {
        Tensor want = MatMul(Select(Select(a, 0, i), 0, 0), Select(b, 0, j));
        EXPECT_LT(MaxAbsDiff(Select(Select(c, 0, i), 0, j), want), tol);
      }
    }
    // An expanded (stride 0) batch equals the broadcast one; a narrowed operand is copied.
    EXPECT_LT(MaxAbsDiff(MatMul(Expand(a, {2, 5, 3, 4}), b), c), tol);
    Tensor wide = Tensor::Randn({5, 4, 9}, gen, dt);
    Tensor narrowed = Narrow(wide, 2, 2, 6);
    EXPECT_LT(MaxAbsDiff(MatMul(a, narrowed), MatMul(a, Contiguous(narrowed))), tol);
    // Empty inner dimension: zeros.
    EXPECT_EQ(MaxAll(Abs(MatMul(Tensor::Ones({2, 3, 0}, dt), Tensor::Ones({2, 0, 4}, dt)))).item(), 0);
  }
}

TEST(ViewsTest, FlattenSplitChunk) {
  Tensor x = Reshape(Tensor::Arange(0, 24, 1, DType::kFloat32), {2, 3, 4});
  EXPECT_EQ(Flatten(x).sizes(), Shape({2, 12}));
  EXPECT_EQ(Flatten(x, 0).sizes(), Shape({24}));
  EXPECT_EQ(Flatten(Tensor::Scalar(3)).sizes(), Shape({1}));
  auto pieces = Split(x, 2, 2);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1].storage(), x.storage());  // views
  EXPECT_EQ(pieces[1].ToVector<float>()[0], 2.f);
  auto uneven = Split(x, 2, 1);
  ASSERT_EQ(uneven.size(), 2u);
  EXPECT_EQ(uneven[1].sizes(), Shape({2, 1, 4}));
  auto chunks = Chunk(Tensor::Zeros({5}), 3);  // ceil(5 / 3) = 2: sizes 2, 2, 1
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2].sizes(), Shape({1}));
  EXPECT_EQ(Chunk(Tensor::Zeros({2}), 3).size(), 2u);  // fewer pieces, as PyTorch
  EXPECT_EQ(Split(x, Shape{1, 0, 2}, 1)[1].sizes(), Shape({2, 0, 4}));
}

TEST(IndexingTest, GatherAndScatterAddAreAdjoint) {
  Tensor t = Tensor::FromVector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor idx = Tensor::FromVector<int64_t>({2, 2, 0, 1}, {2, 2});
  EXPECT_EQ(Gather(t, 1, idx).ToVector<double>(), std::vector<double>({3, 3, 4, 5}));
  Tensor src = Tensor::FromVector<double>({1, 10, 100, 1000}, {2, 2});
  EXPECT_EQ(ScatterAdd(Tensor::Zeros({2, 3}, DType::kFloat64), 1, idx, src).ToVector<double>(),
            std::vector<double>({0, 0, 11, 100, 1000, 0}));  // duplicates accumulate
  // A transposed input and index.
  EXPECT_EQ(Gather(Transpose(t, 0, 1), 0, Transpose(idx, 0, 1)).ToVector<double>(),
            std::vector<double>({3, 4, 3, 5}));
  EXPECT_THROW(Gather(t, 1, Tensor::FromVector<int64_t>({-1}, {1, 1})), Error);
  EXPECT_THROW(Gather(t, 0, Tensor::Zeros({3, 4}, DType::kInt64)), Error);  // larger than t
}

TEST(SelectionTest, WhereAndMaskedFillBroadcast) {
  Tensor mask = Tensor::FromVector<bool>({true, false}, {2, 1});
  Tensor a = Tensor::FromVector<float>({1, 2, 3});
  Tensor b = Tensor::Full({2, 3}, -1);
  EXPECT_EQ(Where(mask, a, b).ToVector<float>(), std::vector<float>({1, 2, 3, -1, -1, -1}));
  EXPECT_EQ(MaskedFill(a, mask, 9).ToVector<float>(), std::vector<float>({9, 9, 9, 1, 2, 3}));
  EXPECT_EQ(Where(Transpose(Expand(mask, {2, 2}), 0, 1), Tensor::Ones({2, 2}), Tensor::Zeros({2, 2}))
                .ToVector<float>(),
            std::vector<float>({1, 0, 1, 0}));
}

TEST(ReduceTest, VarCorrectionAndDegenerateCounts) {
  Tensor x = Tensor::FromVector<double>({1, 2, 3, 4}, {2, 2});
  EXPECT_DOUBLE_EQ(Var(x).item(), 5.0 / 3);
  EXPECT_DOUBLE_EQ(Var(x, {}, 0).item(), 1.25);
  EXPECT_EQ(Var(x, {1}, 1, true).sizes(), Shape({2, 1}));
  EXPECT_TRUE(std::isnan(Var(Tensor::Ones({1}, DType::kFloat64)).item()));  // 0 / 0
}

TEST(ActivationKernelsTest, Float32OneDnnMatchesFloat64AndStridedInputs) {
  Generator gen(3);
  Tensor x64 = Tensor::Uniform({37, 129}, -6, 6, gen, DType::kFloat64);
  Tensor g64 = Tensor::Randn({37, 129}, gen, DType::kFloat64);
  Tensor x = ToDType(x64, DType::kFloat32), g = ToDType(g64, DType::kFloat32);
  auto close = [](const Tensor& f32, const Tensor& f64) {
    return MaxAbsDiff(ToDType(f32, DType::kFloat64), f64) < 2e-5 * (1 + MaxAll(Abs(f64)).item());
  };
  for (GeluApproximate ap : {GeluApproximate::kNone, GeluApproximate::kTanh}) {
    EXPECT_TRUE(close(Gelu(x, ap), Gelu(x64, ap)));
    EXPECT_TRUE(close(GeluBackward(g, x, ap), GeluBackward(g64, x64, ap)));
  }
  EXPECT_TRUE(close(Silu(x), Silu(x64)));
  EXPECT_TRUE(close(SiluBackward(g, x), SiluBackward(g64, x64)));
  // A strided float32 input gives the values of its contiguous copy.
  Tensor xt = Transpose(x, 0, 1);
  EXPECT_EQ(Gelu(xt).ToVector<float>(), Gelu(Contiguous(xt)).ToVector<float>());
  EXPECT_EQ(Silu(xt).sizes(), Shape({129, 37}));
}

TEST(DropoutMaskTest, KeepsWithProbabilityOneMinusPAndScales) {
  Generator gen(4);
  Tensor m = DropoutMask({100000}, 0.3, DType::kFloat32, gen);
  const std::vector<float> v = m.ToVector<float>();
  int64_t zeros = 0;
  for (float e : v) {
    EXPECT_TRUE(e == 0.f || e == static_cast<float>(1 / 0.7));
    zeros += e == 0.f;
  }
  EXPECT_NEAR(static_cast<double>(zeros) / v.size(), 0.3, 0.01);
  EXPECT_EQ(MaxAll(DropoutMask({5}, 1.0, DType::kFloat64, gen)).item(), 0);
  EXPECT_THROW(DropoutMask({5}, 1.5, DType::kFloat64, gen), Error);
}

}  // namespace
}  // namespace gw::kernels
