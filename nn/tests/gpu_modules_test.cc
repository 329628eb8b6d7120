// On a GPU: autograd through gw::To, a module moved with Module::To whose forward and
// backward equal the CPU's, MseLoss on the GPU, and a state dict loaded from the CPU into a
// GPU module. Skipped, with the reason, where there is no GPU.
#include <gtest/gtest.h>

#include "require_gpu.h"

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/loss.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

using ::gw::testing::kGpu;

std::shared_ptr<Sequential> MakeMlp(uint64_t seed, DType dtype) {
  Generator gen(seed);
  return std::make_shared<Sequential>(
      std::vector<std::shared_ptr<Module>>{std::make_shared<Linear>(20, 32, gen, true, dtype), std::make_shared<ReLU>(),
                                           std::make_shared<Linear>(32, 32, gen, true, dtype), std::make_shared<Tanh>(),
                                           std::make_shared<Linear>(32, 3, gen, true, dtype)});
}

TEST(GpuModulesTest, GradientsFlowBackThroughTo) {
  REQUIRE_GPU();
  Generator gen(1);
  const Tensor x = Tensor::Randn({4, 5}, gen).set_requires_grad(true);
  const Tensor on_gpu = gw::To(x, kGpu);
  EXPECT_EQ(on_gpu.device(), kGpu);
  const Tensor back = gw::To(Mul(on_gpu, on_gpu), kCPU);
  autograd::Backward({Sum(back)});
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), kCPU);
  EXPECT_TRUE(kernels::AllClose(x.grad(), kernels::MulScalar(x.detach(), 2), 1e-6, 1e-6));
}

class GpuMlpTest : public ::testing::TestWithParam<DType> {};

TEST_P(GpuMlpTest, ForwardAndBackwardOnTheGpuEqualTheCpu) {
  REQUIRE_GPU();
  const DType dtype = GetParam();
  const double tol = dtype == DType::kFloat32 ? 1e-4 : 1e-10;
  auto cpu = MakeMlp(7, dtype), gpu = MakeMlp(7, dtype);
  gpu->To(kGpu);
  EXPECT_EQ(gpu->device(), kGpu);
  Generator gen(2);
  const Tensor x = Tensor::Randn({16, 20}, gen, dtype), y = Tensor::Randn({16, 3}, gen, dtype);
  const Tensor loss_cpu = MseLoss(cpu->Forward(x), y);
  const Tensor loss_gpu = MseLoss(gpu->Forward(gw::To(x, kGpu)), gw::To(y, kGpu));
  EXPECT_EQ(loss_gpu.device(), kGpu);
  EXPECT_NEAR(loss_gpu.item(), loss_cpu.item(), tol);
  autograd::Backward({loss_cpu});
  autograd::Backward({loss_gpu});
  const NamedTensors pc = cpu->NamedParameters(), pg = gpu->NamedParameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    ASSERT_TRUE(pg[i].second.grad().defined()) << pg[i].first;
    EXPECT_EQ(pg[i].second.grad().device(), kGpu) << pg[i].first;
    const Tensor g = kernels::ToDevice(pg[i].second.grad(), kCPU);
    EXPECT_TRUE(kernels::AllClose(g, pc[i].second.grad(), tol, tol))
        << pg[i].first << ": max |gpu - cpu| = " << kernels::MaxAbsDiff(g, pc[i].second.grad());
  }
  // Back to the CPU: the same tensors, the same values.
  const Tensor w = gpu->NamedParameters()[0].second;
  gpu->To(kCPU);
  EXPECT_TRUE(w.is_same(gpu->NamedParameters()[0].second));
  EXPECT_EQ(w.device(), kCPU);
  EXPECT_TRUE(kernels::AllClose(w, cpu->NamedParameters()[0].second, 0, 0));
}

TEST_P(GpuMlpTest, StateDictFromTheCpuLoadsIntoAGpuModule) {
  REQUIRE_GPU();
  auto source = MakeMlp(11, GetParam()), target = MakeMlp(12, GetParam());
  target->To(kGpu);
  ASSERT_TRUE(target->LoadStateDict(source->StateDict()).ok());
  EXPECT_EQ(target->device(), kGpu);
  const NamedTensors a = source->StateDict(), b = target->StateDict();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(kernels::MaxAbsDiff(kernels::ToDevice(b[i].second, kCPU), a[i].second), 0.0) << a[i].first;
  }
}

TEST_P(GpuMlpTest, CrossEntropyOnTheGpuEqualsTheCpu) {
  REQUIRE_GPU();
  const DType dtype = GetParam();
  const double tol = dtype == DType::kFloat32 ? 1e-5 : 1e-12;
  Generator gen(4);
  const Tensor logits = Tensor::Randn({12, 10}, gen, dtype).set_requires_grad(true);
  const Tensor targets = Tensor::FromVector<int64_t>({0, 3, 9, 2, 2, 7, 5, 1, 8, 3, 4, 6});
  for (const int64_t ignore : {int64_t{-100}, int64_t{3}}) {
    for (const Reduction reduction : {Reduction::kMean, Reduction::kSum}) {
      ClassLossOptions o;
      o.ignore_index = ignore;
      o.reduction = reduction;
      logits.set_grad(Tensor());
      const Tensor cpu_loss = CrossEntropyLoss(logits, targets, o);
      autograd::Backward({cpu_loss});
      const Tensor cpu_grad = logits.grad();
      logits.set_grad(Tensor());
      const Tensor gpu_loss = CrossEntropyLoss(gw::To(logits, kGpu), gw::To(targets, kGpu), o);
      EXPECT_EQ(gpu_loss.device(), kGpu);
      EXPECT_NEAR(gpu_loss.item(), cpu_loss.item(), tol * 10) << "ignore " << ignore;
      autograd::Backward({gpu_loss});
      EXPECT_TRUE(kernels::AllClose(logits.grad(), cpu_grad, tol, tol)) << "ignore " << ignore;
    }
  }
  const Tensor bad = Tensor::FromVector<int64_t>({0, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  try {
    CrossEntropyLoss(gw::To(logits, kGpu), gw::To(bad, kGpu));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 10 at position 1"), std::string::npos) << e.what();
  }
  EXPECT_NEAR(Accuracy(kernels::ToDevice(logits.detach(), kGpu), kernels::ToDevice(targets, kGpu)),
              Accuracy(logits.detach(), targets), 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMlpTest, ::testing::Values(DType::kFloat32, DType::kFloat64),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace gw::nn
