// Unit: gw::Tensor — creation, metadata, views over shared storage, printing, errors.
#include "gradwire/tensor/tensor.h"

#include <gtest/gtest.h>

#include "gradwire/tensor/kernels.h"

namespace gw {
namespace {

using kernels::Contiguous;

TEST(TensorTest, CreationFillsValues) {
  EXPECT_EQ(Tensor::Zeros({2, 3}).ToVector<float>(), std::vector<float>(6, 0.f));
  EXPECT_EQ(Tensor::Ones({2}, DType::kFloat64).ToVector<double>(), std::vector<double>({1, 1}));
  EXPECT_EQ(Tensor::Full({3}, 2.5).ToVector<float>(), std::vector<float>({2.5f, 2.5f, 2.5f}));
  EXPECT_EQ(Tensor::Arange(0, 5).ToVector<int64_t>(), std::vector<int64_t>({0, 1, 2, 3, 4}));
  EXPECT_EQ(Tensor::Arange(1, 2, 0.25, DType::kFloat64).ToVector<double>(),
            std::vector<double>({1, 1.25, 1.5, 1.75}));
  Tensor s = Tensor::Scalar(7, DType::kInt64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<int64_t>(), 7);
  Tensor v = Tensor::FromVector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(v.sizes(), Shape({2, 3}));
  EXPECT_EQ(v.strides(), Shape({3, 1}));
  EXPECT_EQ(v.dtype(), DType::kFloat64);
  EXPECT_THROW(Tensor::FromVector<float>({1, 2, 3}, {2, 2}), Error);
}

TEST(TensorTest, SeededRandomIsReproducibleAndWellDistributed) {
  Generator g1(42), g2(42), g3(43);
  Tensor a = Tensor::Randn({10000}, g1, DType::kFloat64);
  Tensor b = Tensor::Randn({10000}, g2, DType::kFloat64);
  Tensor c = Tensor::Randn({10000}, g3, DType::kFloat64);
  EXPECT_EQ(a.ToVector<double>(), b.ToVector<double>());
  EXPECT_NE(a.ToVector<double>(), c.ToVector<double>());
  const double mean = kernels::Mean(a).item();
  const double var = kernels::Mean(kernels::PowScalar(kernels::AddScalar(a, -mean), 2)).item();
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.05);
  Tensor u = Tensor::Uniform({10000}, -2, 3, g1, DType::kFloat64);
  EXPECT_GE(kernels::MaxAll(kernels::Neg(u)).item(), -3.0);  // min >= -2 -> -min <= 2
  EXPECT_LE(kernels::MaxAll(u).item(), 3.0);
  EXPECT_NEAR(kernels::Mean(u).item(), 0.5, 0.05);
}

TEST(TensorTest, ViewsShareStorageWithoutCopies) {
  Tensor t = Tensor::Arange(0, 24, 1, DType::kFloat32);
  Tensor r = kernels::Reshape(t, {2, 3, 4});
  EXPECT_EQ(r.storage(), t.storage());
  Tensor tr = kernels::Transpose(r, 0, 2);
  EXPECT_EQ(tr.storage(), t.storage());
  EXPECT_EQ(tr.sizes(), Shape({4, 3, 2}));
  EXPECT_FALSE(tr.is_contiguous());
  Tensor n = kernels::Narrow(r, 1, 1, 2);
  EXPECT_EQ(n.storage(), t.storage());
  EXPECT_EQ(n.sizes(), Shape({2, 2, 4}));
  EXPECT_EQ(n.ToVector<float>()[0], 4.f);
  Tensor e = kernels::Expand(kernels::Reshape(Tensor::Arange(0, 3, 1, DType::kFloat32), {3, 1}),
                             {3, 5});
  EXPECT_EQ(e.strides(), Shape({1, 0}));
  EXPECT_EQ(e.ToVector<float>()[7], 1.f);
  Tensor p = kernels::Permute(r, {2, 0, 1});
  EXPECT_EQ(p.sizes(), Shape({4, 2, 3}));
  EXPECT_EQ(kernels::Contiguous(p).ToVector<float>()[1], 4.f);
  // Writes through a view are visible in the base.
  kernels::Fill(kernels::Select(r, 0, 1), -1);
  EXPECT_EQ(t.ToVector<float>()[12], -1.f);
  EXPECT_EQ(t.ToVector<float>()[11], 11.f);
}

TEST(TensorTest, ReshapeOfNonContiguousCopiesOnlyWhenNeeded) {
  Tensor t = kernels::Reshape(Tensor::Arange(0, 6, 1, DType::kFloat32), {2, 3});
  Tensor tt = kernels::Transpose(t, 0, 1);  // [3, 2], not contiguous
  Tensor flat = kernels::Reshape(tt, {-1});
  EXPECT_NE(flat.storage(), t.storage());
  EXPECT_EQ(flat.ToVector<float>(), std::vector<float>({0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(kernels::View(tt, {6}), Error);
  Tensor u = kernels::Unsqueeze(tt, 0);  // still a view
  EXPECT_EQ(u.storage(), t.storage());
  EXPECT_EQ(kernels::View(u, {3, 2}).storage(), t.storage());
}

TEST(TensorTest, ContiguousKeepsLogicalOrder) {
  Tensor t = kernels::Reshape(Tensor::Arange(0, 6, 1, DType::kInt64), {2, 3});
  Tensor c = Contiguous(kernels::Transpose(t, 0, 1));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.ToVector<int64_t>(), std::vector<int64_t>({0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(Contiguous(t).is_same(t));
}

TEST(TensorTest, PrinterIsReadable) {
  Tensor t = Tensor::FromVector<float>({1, 2.5f, -3, 4}, {2, 2});
  EXPECT_EQ(t.ToString(), "tensor([[1.0000, 2.5000],\n        [-3.0000, 4.0000]], dtype=float32, shape=[2, 2])");
  EXPECT_EQ(Tensor::Arange(0, 3).ToString(), "tensor([0, 1, 2], dtype=int64)");
  const std::string big = Tensor::Zeros({2000}).ToString();
  EXPECT_NE(big.find("..."), std::string::npos);
  EXPECT_LT(big.size(), 200u);
  EXPECT_EQ(Tensor().ToString(), "tensor(undefined)");
}

TEST(TensorTest, ErrorsNameTheOpAndShapes) {
  Tensor a = Tensor::Zeros({2, 3});
  try {
    kernels::Narrow(a, 1, 2, 5);
    FAIL() << "expected gw::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Narrow"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos);
  }
  EXPECT_THROW(a.size(2), Error);
  EXPECT_THROW(a.data<double>(), Error);
  EXPECT_THROW(Tensor().sizes(), Error);
  EXPECT_THROW(Tensor::Zeros({2}, DType::kInt64).set_requires_grad(true), Error);
}

TEST(TensorTest, StorageVersionCountsInPlaceWrites) {
  Tensor a = Tensor::Zeros({4});
  const uint64_t v0 = a.storage()->version();
  kernels::AddInPlace(a, Tensor::Ones({4}));
  const uint64_t v1 = a.storage()->version();
  kernels::Fill(a, 3);
  EXPECT_GT(v1, v0);
  EXPECT_GT(a.storage()->version(), v1);
  EXPECT_EQ(a.ToVector<float>(), std::vector<float>(4, 3.f));
}

TEST(TensorTest, WrapCallsDeleterOnce) {
  int calls = 0;
  {
    static float buffer[4] = {1, 2, 3, 4};
    auto storage = Storage::Wrap(buffer, sizeof(buffer), kCPU, [&](void*) { ++calls; });
    Tensor t = Tensor::FromStorage(storage, DType::kFloat32, {2, 2}, {2, 1});
    Tensor v = kernels::Transpose(t, 0, 1);
    EXPECT_EQ(v.ToVector<float>(), std::vector<float>({1, 3, 2, 4}));
    EXPECT_THROW(Tensor::FromStorage(storage, DType::kFloat32, {3, 2}, {2, 1}), Error);
  }
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace gw
