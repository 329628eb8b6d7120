// Every GPU kernel against the CPU kernel, float32 and float64, on cuda:0: the same inputs on
// both devices, the GPU's result copied back and compared within float tolerance. Skipped,
// with the reason, where there is no GPU (ctest reports them as not run).
#include <gtest/gtest.h>

#include "require_gpu.h"

#include <functional>
#include <string>
#include <vector>

#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"
#include "gradwire/tensor/tensor.h"

namespace gw {
namespace {

namespace k = kernels;

using ::gw::testing::kGpu;

double Tolerance(DType dtype) { return dtype == DType::kFloat32 ? 2e-5 : 1e-12; }

void ExpectSame(const Tensor& gpu, const Tensor& cpu, const std::string& what, double scale = 1) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.sizes(), cpu.sizes()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const Tensor back = k::ToDevice(gpu, kCPU);
  const double tol = Tolerance(cpu.dtype()) * scale;
  EXPECT_TRUE(k::AllClose(back, cpu, tol, tol)) << what << ": max |gpu - cpu| = " << k::MaxAbsDiff(back, cpu);
}

class GpuKernelsTest : public ::testing::TestWithParam<DType> {
 protected:
  Tensor Random(const Shape& sizes, double low = -2, double high = 2) {
    return Tensor::Uniform(sizes, low, high, gen_, GetParam());
  }
  Generator gen_{1234};
};

TEST_P(GpuKernelsTest, CopiesRoundTripAndKeepValues) {
  REQUIRE_GPU();
  const Tensor x = Random({37, 129});
  const Tensor g = k::ToDevice(x, kGpu);
  EXPECT_EQ(g.device(), kGpu);
  EXPECT_EQ(k::MaxAbsDiff(k::ToDevice(g, kCPU), x), 0.0);
  EXPECT_EQ(k::ToDevice(g, kGpu).unsafe_impl(), g.unsafe_impl());  // already there
  // Strided source: made contiguous on the way.
  const Tensor t = k::Transpose(x, 0, 1);
  EXPECT_EQ(k::MaxAbsDiff(k::ToDevice(k::ToDevice(t, kGpu), kCPU), t), 0.0);
  // A view of a GPU tensor copies and clones on the GPU.
  const Tensor gt = k::Transpose(g, 0, 1);
  ExpectSame(k::Contiguous(gt), k::Contiguous(t), "Contiguous of a transpose");
  ExpectSame(k::Narrow(g, 1, 5, 17), k::Narrow(x, 1, 5, 17), "Narrow");
  EXPECT_NE(g.ToString().find("device=cuda:0"), std::string::npos);
  EXPECT_DOUBLE_EQ(k::Select(k::Select(g, 0, 3), 0, 4).item(), k::Select(k::Select(x, 0, 3), 0, 4).item());
}

TEST_P(GpuKernelsTest, CreationAndInPlaceOps) {
  REQUIRE_GPU();
  EXPECT_EQ(
      k::MaxAbsDiff(k::ToDevice(Tensor::Zeros({5, 7}, GetParam(), kGpu), kCPU), Tensor::Zeros({5, 7}, GetParam())),
      0.0);
  const Tensor full = Tensor::Full({3, 4}, 2.5, GetParam(), kGpu);
  EXPECT_EQ(full.ToVector<double>(), std::vector<double>(12, 2.5));

  const Tensor x = Random({16, 33}), y = Random({33});
  Tensor gx = k::ToDevice(x, kGpu);
  Tensor cx = k::Clone(x);
  k::AddInPlace(gx, k::ToDevice(y, kGpu), -0.5);
  k::AddInPlace(cx, y, -0.5);
  ExpectSame(gx, cx, "AddInPlace with broadcast");
  k::ScaleInPlace(gx, 3);
  k::ScaleInPlace(cx, 3);
  ExpectSame(gx, cx, "ScaleInPlace");
  const uint64_t version = gx.storage()->version();
  k::CopyInPlace(k::Narrow(gx, 0, 2, 4), k::ToDevice(k::Narrow(x, 0, 0, 4), kGpu));
  k::CopyInPlace(k::Narrow(cx, 0, 2, 4), k::Narrow(x, 0, 0, 4));
  ExpectSame(gx, cx, "CopyInPlace into a view");
  EXPECT_EQ(gx.storage()->version(), version + 2);
  k::Fill(k::Select(gx, 1, 3), -1);
  k::Fill(k::Select(cx, 1, 3), -1);
  ExpectSame(gx, cx, "Fill of a strided column");
  ExpectSame(k::ToDType(gx, DType::kInt64), k::ToDType(cx, DType::kInt64), "ToDType to int64");
}

TEST_P(GpuKernelsTest, BinaryOpsWithBroadcastingMatchTheCpu) {
  REQUIRE_GPU();
  const Tensor a = Random({4, 1, 33}), b = Random({5, 33}, 0.5, 2);
  const Tensor ga = k::ToDevice(a, kGpu), gb = k::ToDevice(b, kGpu);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"Add", k::Add},
      {"Sub", k::Sub},
      {"Mul", k::Mul},
      {"Div", k::Div},
      {"Maximum", k::Maximum},
      {"ReluBackward", k::ReluBackward},
      {"TanhBackward", k::TanhBackward},
      {"SigmoidBackward", k::SigmoidBackward}};
  for (const auto& [name, op] : ops) ExpectSame(op(ga, gb), op(a, b), name);
  for (const auto& [name, op] :
       std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>>{
           {"Eq", k::Eq}, {"Lt", k::Lt}, {"Gt", k::Gt}}) {
    const Tensor g = op(ga, k::Narrow(ga, 0, 1, 1)), c = op(a, k::Narrow(a, 0, 1, 1));
    EXPECT_EQ(g.dtype(), DType::kBool);
    EXPECT_EQ(g.ToVector<bool>(), c.ToVector<bool>()) << name;
  }
  // A transposed (non-contiguous) operand.
  const Tensor m = Random({17, 9}), n = Random({9, 17});
  ExpectSame(k::Add(k::Transpose(k::ToDevice(m, kGpu), 0, 1), k::ToDevice(n, kGpu)), k::Add(k::Transpose(m, 0, 1), n),
             "Add with a transposed operand");
}

TEST_P(GpuKernelsTest, UnaryOpsMatchTheCpu) {
  REQUIRE_GPU();
  const Tensor x = Random({65, 31}), pos = Random({65, 31}, 0.1, 3);
  const Tensor gx = k::ToDevice(x, kGpu), gpos = k::ToDevice(pos, kGpu);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"Neg", k::Neg},
      {"Abs", k::Abs},
      {"Exp", k::Exp},
      {"Relu", k::Relu},
      {"Tanh", k::Tanh},
      {"Sigmoid", k::Sigmoid},
      {"AddScalar", [](const Tensor& t) { return k::AddScalar(t, 0.75); }},
      {"MulScalar", [](const Tensor& t) { return k::MulScalar(t, -1.5); }}};
  for (const auto& [name, op] : ops) ExpectSame(op(gx), op(x), name, 4);
  ExpectSame(k::Log(gpos), k::Log(pos), "Log", 4);
  ExpectSame(k::Sqrt(gpos), k::Sqrt(pos), "Sqrt", 4);
}

TEST_P(GpuKernelsTest, ReductionsMatchTheCpu) {
  REQUIRE_GPU();
  const Tensor x = Random({6, 50, 7});
  const Tensor gx = k::ToDevice(x, kGpu);
  ExpectSame(k::Sum(gx, {}, false), k::Sum(x, {}, false), "Sum of all", 50);
  ExpectSame(k::Sum(gx, {1}, true), k::Sum(x, {1}, true), "Sum over dim 1", 10);
  ExpectSame(k::Sum(gx, {0, 2}, false), k::Sum(x, {0, 2}, false), "Sum over dims 0, 2", 10);
  ExpectSame(k::Mean(gx, {2}, false), k::Mean(x, {2}, false), "Mean", 10);
  ExpectSame(k::SumToShape(gx, {50, 1}), k::SumToShape(x, {50, 1}), "SumToShape", 10);
  const Tensor big = Random({1 << 20});
  ExpectSame(k::Sum(k::ToDevice(big, kGpu), {}, false), k::Sum(big, {}, false), "Sum of 2^20", 1000);
  const Tensor empty = Random({0, 4});
  ExpectSame(k::Sum(k::ToDevice(empty, kGpu), {0}, false), k::Sum(empty, {0}, false), "Sum of nothing");
}

TEST_P(GpuKernelsTest, SoftmaxFamilyMatchesTheCpu) {
  REQUIRE_GPU();
  const Tensor x = Random({9, 300}, -8, 8), g = Random({9, 300});
  const Tensor gx = k::ToDevice(x, kGpu), gg = k::ToDevice(g, kGpu);
  for (int64_t dim : {1, 0}) {
    const std::string d = " over dim " + std::to_string(dim);
    ExpectSame(k::Softmax(gx, dim), k::Softmax(x, dim), "Softmax" + d, 4);
    ExpectSame(k::LogSoftmax(gx, dim), k::LogSoftmax(x, dim), "LogSoftmax" + d, 4);
    ExpectSame(k::SoftmaxBackward(gg, k::Softmax(gx, dim), dim), k::SoftmaxBackward(g, k::Softmax(x, dim), dim),
               "SoftmaxBackward" + d, 16);
    ExpectSame(k::LogSoftmaxBackward(gg, k::LogSoftmax(gx, dim), dim),
               k::LogSoftmaxBackward(g, k::LogSoftmax(x, dim), dim), "LogSoftmaxBackward" + d, 16);
  }
  const Tensor huge = Tensor::Full({2, 3}, 1e4, GetParam());  // max-shifted: no overflow
  ExpectSame(k::Softmax(k::ToDevice(huge, kGpu), 1), k::Softmax(huge, 1), "Softmax of large values");
}

TEST_P(GpuKernelsTest, MatrixProductsMatchTheCpu) {
  REQUIRE_GPU();
  const Tensor a = Random({37, 64}), b = Random({64, 45});
  const Tensor ga = k::ToDevice(a, kGpu), gb = k::ToDevice(b, kGpu);
  ExpectSame(k::MatMul(ga, gb), k::MatMul(a, b), "MatMul", 64);
  ExpectSame(k::MatMul(k::Transpose(gb, 0, 1), k::Transpose(ga, 0, 1)),
             k::MatMul(k::Transpose(b, 0, 1), k::Transpose(a, 0, 1)), "MatMul of transposes", 64);
  // Batched with a broadcast batch, and a 3-D x 2-D product.
  const Tensor p = Random({3, 1, 8, 16}), q = Random({4, 16, 5});
  ExpectSame(k::MatMul(k::ToDevice(p, kGpu), k::ToDevice(q, kGpu)), k::MatMul(p, q), "batched MatMul", 16);
  const Tensor r = Random({16, 6});
  ExpectSame(k::MatMul(k::ToDevice(p, kGpu), k::ToDevice(r, kGpu)), k::MatMul(p, r), "4-D x 2-D", 16);
  // Gemm with alpha, beta and transposes, into a strided output.
  Tensor c = Random({45, 37});
  Tensor gc = k::ToDevice(c, kGpu);
  k::Gemm(true, true, 0.5, gb, ga, 2.0, gc);
  k::Gemm(true, true, 0.5, b, a, 2.0, c);
  ExpectSame(gc, c, "Gemm^T^T", 64);
  const Tensor x = Random({10, 64}), w = Random({20, 64}), bias = Random({20});
  ExpectSame(k::Linear(k::ToDevice(x, kGpu), k::ToDevice(w, kGpu), k::ToDevice(bias, kGpu)), k::Linear(x, w, bias),
             "Linear", 64);
}

TEST_P(GpuKernelsTest, MixingDevicesOrMissingKernelsIsAClearError) {
  REQUIRE_GPU();
  const Tensor x = Random({4, 4});
  const Tensor gx = k::ToDevice(x, kGpu);
  try {
    k::Add(gx, x);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0 and cpu"), std::string::npos) << e.what();
  }
  // An op without a GPU kernel yet says so, naming the device.
  try {
    k::Pow(gx, gx);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

TEST(GpuRuntimeTest, StreamsOrderWorkAndTheAllocatorCountsIt) {
  REQUIRE_GPU();
  std::printf("GPU: %s\n", cuda::Describe(kGpu).c_str());
  const cuda::Stream side = cuda::NewStream(kGpu);
  EXPECT_NE(side.id, 0u);
  Generator gen(7);
  const Tensor x = Tensor::Randn({1024, 256}, gen);
  Tensor on_side;
  {
    cuda::StreamGuard guard(side);
    EXPECT_EQ(cuda::CurrentStream(kGpu), side);
    on_side = k::Mul(k::ToDevice(x, kGpu), k::ToDevice(x, kGpu));
    EXPECT_EQ(cuda::Allocator(kGpu).StreamOf(on_side.storage()->data()), side.id);
    cuda::Synchronize(side);
  }
  EXPECT_EQ(cuda::CurrentStream(kGpu).id, 0u);
  ExpectSame(on_side, k::Mul(x, x), "Mul on a side stream");
  const DeviceMemoryStats before = cuda::Allocator(kGpu).stats();
  for (int i = 0; i < 10; ++i) Tensor::Empty({1024, 256}, DType::kFloat32, kGpu);
  const DeviceMemoryStats after = cuda::Allocator(kGpu).stats();
  EXPECT_EQ(after.allocations - before.allocations, 10u);
  EXPECT_GE(after.cache_hits - before.cache_hits, 9u);  // one block, handed out ten times
  cuda::RecordStream(on_side, cuda::CurrentStream(kGpu));
  on_side = Tensor();
  cuda::SynchronizeDevice(kGpu);
  cuda::Allocator(kGpu).EmptyCache();
  EXPECT_LE(cuda::Allocator(kGpu).stats().reserved_bytes, before.reserved_bytes + (size_t{4} << 20));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuKernelsTest, ::testing::Values(DType::kFloat32, DType::kFloat64),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace gw
