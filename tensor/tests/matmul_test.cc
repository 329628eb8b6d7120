// Unit: matrix products — Gemm layouts, MatMul semantics, Linear — against a naive loop.
#include <gtest/gtest.h>

#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

Tensor Naive(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  std::vector<double> av = a.ToVector<double>(), bv = b.ToVector<double>(), out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) out[i * n + j] += av[i * k + p] * bv[p * n + j];
  return ToDType(Tensor::FromVector<double>(out, {m, n}), a.dtype());
}

// Every other column of `wide`: a view that is neither row- nor column-major.
Tensor Slice(const Tensor& wide, int64_t k) {
  return Tensor::FromStorage(wide.storage(), wide.dtype(), {wide.size(0), k},
                             {wide.stride(0), 2}, wide.storage_offset());
}

class MatMulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatMulTest, AllOperandLayoutsMatchNaive) {
  Generator gen(1);
  const DType dt = GetParam();
  const double tol = dt == DType::kFloat32 ? 1e-4 : 1e-12;
  for (auto [m, k, n] : {std::tuple{1, 1, 1}, {3, 5, 7}, {65, 130, 67}, {128, 64, 1}, {1, 64, 9}}) {
    Tensor a = Tensor::Randn({m, k}, gen, dt), b = Tensor::Randn({k, n}, gen, dt);
    Tensor want = Naive(a, b);
    EXPECT_LT(MaxAbsDiff(MatMul(a, b), want), tol * k);
    // Transposed (column-major) views are used without copies.
    Tensor at = Contiguous(Transpose(a, 0, 1)), bt = Contiguous(Transpose(b, 0, 1));
    EXPECT_LT(MaxAbsDiff(MatMul(Transpose(at, 0, 1), Transpose(bt, 0, 1)), want), tol * k);
    // Strided (neither row- nor column-major) views are copied.
    Tensor wide = Tensor::Randn({m, 2 * k}, gen, dt);
    Tensor strided = Slice(wide, k);
    EXPECT_LT(MaxAbsDiff(MatMul(strided, b), Naive(Contiguous(strided), b)), tol * k);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MatMulTest, ::testing::Values(DType::kFloat32, DType::kFloat64));

TEST(MatMulSemanticsTest, VectorsAndBatches) {
  Tensor a = Tensor::FromVector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v = Tensor::FromVector<double>({1, 0, -1});
  EXPECT_EQ(MatMul(a, v).ToVector<double>(), std::vector<double>({-2, -2}));
  EXPECT_EQ(MatMul(Tensor::FromVector<double>({1, 1}), a).ToVector<double>(),
            std::vector<double>({5, 7, 9}));
  EXPECT_EQ(MatMul(v, v).dim(), 0);
  EXPECT_EQ(MatMul(v, v).item(), 2);
  Generator gen(3);
  Tensor x = Tensor::Randn({4, 2, 3, 5}, gen, DType::kFloat64);
  Tensor y = Tensor::Randn({2, 5, 6}, gen, DType::kFloat64);  // broadcast over the leading 4
  Tensor z = MatMul(x, y);
  ASSERT_EQ(z.sizes(), Shape({4, 2, 3, 6}));
  Tensor z12 = MatMul(Select(Select(x, 0, 1), 0, 1), Select(y, 0, 1));
  EXPECT_LT(MaxAbsDiff(Select(Select(z, 0, 1), 0, 1), z12), 1e-12);
  Tensor w = Tensor::Randn({5, 6}, gen, DType::kFloat64);  // folded into one GEMM
  EXPECT_LT(MaxAbsDiff(Select(Select(MatMul(x, w), 0, 3), 0, 0),
                       MatMul(Select(Select(x, 0, 3), 0, 0), w)), 1e-12);
  EXPECT_THROW(MatMul(a, a), Error);
}

TEST(MatMulSemanticsTest, LinearFusesBias) {
  Generator gen(4);
  Tensor x = Tensor::Randn({7, 5}, gen), w = Tensor::Randn({3, 5}, gen), b = Tensor::Randn({3}, gen);
  Tensor want = Add(MatMul(x, Transpose(w, 0, 1)), b);
  EXPECT_LT(MaxAbsDiff(Linear(x, w, b), want), 1e-5);
  EXPECT_LT(MaxAbsDiff(Linear(x, w, Tensor()), MatMul(x, Transpose(w, 0, 1))), 1e-5);
  EXPECT_EQ(Linear(Tensor::Randn({2, 7, 5}, gen), w, b).sizes(), Shape({2, 7, 3}));
  EXPECT_THROW(Linear(Tensor::Randn({7, 4}, gen), w, b), Error);
}

TEST(MatMulSemanticsTest, GemmAccumulatesWithBeta) {
  Tensor a = Tensor::Ones({2, 3}), b = Tensor::Ones({3, 2}), c = Tensor::Full({2, 2}, 10);
  Gemm(false, false, 2.0, a, b, 1.0, c);
  EXPECT_EQ(c.ToVector<float>(), std::vector<float>(4, 16.f));
  Gemm(true, true, 1.0, Tensor::Ones({3, 2}), Tensor::Ones({2, 3}), 0.0, c);
  EXPECT_EQ(c.ToVector<float>(), std::vector<float>(4, 3.f));
}

}  // namespace
}  // namespace gw::kernels
