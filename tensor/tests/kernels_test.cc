// Unit: gw::kernels — element-wise math with broadcasting, reductions, softmax, indexing.
#include "gradwire/tensor/kernels.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gw::kernels {
namespace {

Tensor F(std::vector<double> v, Shape s = {}) { return Tensor::FromVector<double>(v, s); }

TEST(KernelsTest, BroadcastingArithmetic) {
  Tensor a = F({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row = F({10, 20, 30}, {3});
  Tensor col = F({100, 200}, {2, 1});
  EXPECT_EQ(Add(a, row).ToVector<double>(), std::vector<double>({11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(Add(a, col).ToVector<double>(), std::vector<double>({101, 102, 103, 204, 205, 206}));
  EXPECT_EQ(Mul(col, row).sizes(), Shape({2, 3}));
  EXPECT_EQ(Sub(a, Tensor::Scalar(1, DType::kFloat64)).ToVector<double>()[0], 0);
  EXPECT_EQ(Div(a, F({2}, {1})).ToVector<double>()[5], 3);
  EXPECT_EQ(Pow(F({2, 3}), F({3, 2})).ToVector<double>(), std::vector<double>({8, 9}));
  // Non-contiguous operands.
  Tensor at = Transpose(a, 0, 1);
  EXPECT_EQ(Add(at, at).ToVector<double>(), std::vector<double>({2, 8, 4, 10, 6, 12}));
}

TEST(KernelsTest, MismatchesThrowNamingBothShapes) {
  try {
    Add(Tensor::Zeros({2, 3}), Tensor::Zeros({4}));
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Add"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  }
  EXPECT_THROW(Add(Tensor::Zeros({2}), Tensor::Zeros({2}, DType::kFloat64)), Error);
  EXPECT_THROW(Exp(Tensor::Zeros({2}, DType::kInt64)), Error);
  EXPECT_THROW(Div(Tensor::Ones({1}, DType::kInt64), Tensor::Zeros({1}, DType::kInt64)), Error);
}

TEST(KernelsTest, UnaryMath) {
  Tensor x = F({-1, 0, 2});
  EXPECT_EQ(Relu(x).ToVector<double>(), std::vector<double>({0, 0, 2}));
  EXPECT_DOUBLE_EQ(Exp(x).ToVector<double>()[2], std::exp(2.0));
  EXPECT_DOUBLE_EQ(Log(F({std::exp(1.5)})).item(), 1.5);
  EXPECT_DOUBLE_EQ(Tanh(x).ToVector<double>()[0], std::tanh(-1.0));
  EXPECT_DOUBLE_EQ(Sigmoid(x).ToVector<double>()[0], 1 / (1 + std::exp(1.0)));
  EXPECT_DOUBLE_EQ(Sigmoid(F({-800})).item(), 0.0);  // no overflow
  EXPECT_EQ(PowScalar(x, 3).ToVector<double>(), std::vector<double>({-1, 0, 8}));
  EXPECT_EQ(Neg(x).ToVector<double>(), std::vector<double>({1, -0.0, -2}));
  EXPECT_EQ(Abs(x).ToVector<double>(), std::vector<double>({1, 0, 2}));
  EXPECT_EQ(MulScalar(x, 2).ToVector<double>(), std::vector<double>({-2, 0, 4}));
  EXPECT_EQ(AddScalar(x, 1).ToVector<double>(), std::vector<double>({0, 1, 3}));
}

TEST(KernelsTest, ComparisonsAndWhere) {
  Tensor a = F({1, 2, 3}), b = F({3, 2, 1});
  EXPECT_EQ(Lt(a, b).ToVector<int64_t>(), std::vector<int64_t>({1, 0, 0}));
  EXPECT_EQ(Eq(a, b).ToVector<int64_t>(), std::vector<int64_t>({0, 1, 0}));
  EXPECT_EQ(Ge(a, b).ToVector<int64_t>(), std::vector<int64_t>({0, 1, 1}));
  EXPECT_EQ(Ne(a, b).dtype(), DType::kBool);
  EXPECT_EQ(Where(Gt(a, b), a, b).ToVector<double>(), std::vector<double>({3, 2, 3}));
  EXPECT_EQ(Maximum(a, b).ToVector<double>(), std::vector<double>({3, 2, 3}));
}

TEST(KernelsTest, Reductions) {
  Tensor a = F({1, 5, 3, 4, 2, 6}, {2, 3});
  EXPECT_EQ(Sum(a).item(), 21);
  EXPECT_EQ(Sum(a, {0}).ToVector<double>(), std::vector<double>({5, 7, 9}));
  EXPECT_EQ(Sum(a, {1}, true).sizes(), Shape({2, 1}));
  EXPECT_EQ(Sum(a, {-1}).ToVector<double>(), std::vector<double>({9, 12}));
  EXPECT_EQ(Mean(a, {1}).ToVector<double>(), std::vector<double>({3, 4}));
  auto [values, indices] = Max(a, 1);
  EXPECT_EQ(values.ToVector<double>(), std::vector<double>({5, 6}));
  EXPECT_EQ(indices.ToVector<int64_t>(), std::vector<int64_t>({1, 2}));
  EXPECT_EQ(Argmax(a, 0, true).ToVector<int64_t>(), std::vector<int64_t>({1, 0, 1}));
  EXPECT_EQ(Argmax(a, 0, true).sizes(), Shape({1, 3}));
  EXPECT_EQ(MaxAll(a).item(), 6);
  EXPECT_EQ(SumToShape(a, {3}).ToVector<double>(), std::vector<double>({5, 7, 9}));
  EXPECT_EQ(SumToShape(a, {2, 1}).ToVector<double>(), std::vector<double>({9, 12}));
  Tensor big = Tensor::Ones({3, 4, 5});
  EXPECT_EQ(Sum(big, {0, 2}).ToVector<double>(), std::vector<double>(4, 15));
  EXPECT_THROW(Sum(a, {2}), Error);
  EXPECT_EQ(Sum(Tensor::Arange(0, 5)).item<int64_t>(), 10);
}

TEST(KernelsTest, SoftmaxAndLogSoftmax) {
  Tensor x = F({1, 2, 3, 1000, 1000, 1000}, {2, 3});
  Tensor s = Softmax(x, 1);
  EXPECT_NEAR(Sum(s, {1}).ToVector<double>()[0], 1.0, 1e-12);
  EXPECT_NEAR(s.ToVector<double>()[4], 1.0 / 3, 1e-12);  // stable for large inputs
  Tensor ls = LogSoftmax(x, 1);
  EXPECT_NEAR(ls.ToVector<double>()[2], 3 - std::log(std::exp(1) + std::exp(2) + std::exp(3)), 1e-12);
  Tensor s0 = Softmax(x, 0);
  EXPECT_NEAR(s0.ToVector<double>()[0] + s0.ToVector<double>()[3], 1.0, 1e-12);
}

TEST(KernelsTest, IndexSelectAndIndexAdd) {
  Tensor table = F({0, 1, 10, 11, 20, 21}, {3, 2});
  Tensor ids = Tensor::FromVector<int64_t>({2, 0, 2});
  EXPECT_EQ(IndexSelect(table, 0, ids).ToVector<double>(),
            std::vector<double>({20, 21, 0, 1, 20, 21}));
  EXPECT_EQ(IndexSelect(table, 1, Tensor::FromVector<int64_t>({1})).ToVector<double>(),
            std::vector<double>({1, 11, 21}));
  Tensor acc = IndexAdd(Tensor::Zeros({3, 2}, DType::kFloat64), 0, ids, Tensor::Ones({3, 2}, DType::kFloat64));
  EXPECT_EQ(acc.ToVector<double>(), std::vector<double>({1, 1, 0, 0, 2, 2}));  // duplicates add
  try {
    IndexSelect(table, 0, Tensor::FromVector<int64_t>({3}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos);
  }
  EXPECT_THROW(IndexAdd(table, 0, ids, Tensor::Ones({2, 2}, DType::kFloat64)), Error);
}

TEST(KernelsTest, CatAndStack) {
  Tensor a = F({1, 2}, {1, 2}), b = F({3, 4, 5, 6}, {2, 2});
  EXPECT_EQ(Cat({a, b}, 0).ToVector<double>(), std::vector<double>({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(Cat({b, b}, 1).sizes(), Shape({2, 4}));
  Tensor s = Stack({F({1, 2}), F({3, 4})}, 1);
  EXPECT_EQ(s.sizes(), Shape({2, 2}));
  EXPECT_EQ(s.ToVector<double>(), std::vector<double>({1, 3, 2, 4}));
  EXPECT_THROW(Cat({a, F({1, 2, 3}, {1, 3})}, 0), Error);
}

TEST(KernelsTest, ToDTypeAndCopy) {
  Tensor x = F({1.7, -2.2});
  EXPECT_EQ(ToDType(x, DType::kInt64).ToVector<int64_t>(), std::vector<int64_t>({1, -2}));
  Tensor dst = Tensor::Zeros({2, 2}, DType::kFloat64);
  CopyInPlace(dst, F({5, 6}));
  EXPECT_EQ(dst.ToVector<double>(), std::vector<double>({5, 6, 5, 6}));
  EXPECT_TRUE(AllClose(F({1, 2}), F({1, 2.0000001})));
  EXPECT_FALSE(AllClose(F({1, 2}), F({1, 2.1})));
}

}  // namespace
}  // namespace gw::kernels

namespace gw::kernels {
namespace {

// Regressions found in review.
TEST(KernelsEdgeCaseTest, InPlaceOpsRejectOverlapHazards) {
  Tensor x = Tensor::FromVector<double>({1, 2, 3, 4});
  AddInPlace(Narrow(x, 0, 1, 3), Narrow(x, 0, 0, 3));  // reads the original values
  EXPECT_EQ(x.ToVector<double>(), std::vector<double>({1, 3, 5, 7}));
  Tensor m = Tensor::FromVector<double>({1, 2, 3, 4}, {2, 2});
  CopyInPlace(m, Transpose(m, 0, 1));
  EXPECT_EQ(m.ToVector<double>(), std::vector<double>({1, 3, 2, 4}));
  EXPECT_THROW(AddInPlace(Expand(Tensor::Zeros({1}), {3}), Tensor::Ones({3})), Error);
  try {
    CopyInPlace(Tensor::Zeros({2}), Tensor::Zeros({3}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CopyInPlace"), std::string::npos) << e.what();
  }
}

TEST(KernelsEdgeCaseTest, EmptyInnerDimensionsMultiplyToZeros) {
  Tensor a = Tensor::Ones({2, 3, 0}), b = Tensor::Ones({0, 4});
  Tensor c = MatMul(a, b);
  EXPECT_EQ(c.sizes(), Shape({2, 3, 4}));
  EXPECT_EQ(MaxAll(Abs(c)).item(), 0.0);
  Tensor out = Tensor::Full({2, 2}, 5);
  Gemm(false, false, 1, Tensor::Ones({2, 0}), Tensor::Ones({0, 2}), 0, out);
  EXPECT_EQ(out.ToVector<float>(), std::vector<float>(4, 0.f));
  EXPECT_EQ(Linear(Tensor::Ones({3, 0}), Tensor::Ones({2, 0}), Tensor()).sizes(), Shape({3, 2}));
}

TEST(KernelsEdgeCaseTest, ScalarsHaveNoDimensions) {
  Tensor s = Tensor::Scalar(1);
  EXPECT_THROW(s.size(0), Error);
  EXPECT_FALSE(Squeeze(s, 0).is_same(s));
  EXPECT_THROW(Expand(Tensor::Ones({1}), {-2}), Error);
}

}  // namespace
}  // namespace gw::kernels
