// On a GPU: DataParallel with replicas on cuda:0 (one GPU can only host them all; with
// several, list them) gives the CPU module's outputs and gradients, step after step, with
// the output on the GPU or gathered on the CPU. Skipped, with the reason, where there is
// no GPU.
#include <gtest/gtest.h>

#include "require_gpu.h"

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/loss.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/parallel/data_parallel.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"

namespace gw::parallel {
namespace {

using ::gw::testing::kGpu;

std::shared_ptr<nn::Sequential> MakeMlp(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(12, 32, gen, true, DType::kFloat64), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(32, 4, gen, true, DType::kFloat64)});
}

class GpuDataParallelTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GpuDataParallelTest, TrainingOnGpuReplicasEqualsTheCpuModule) {
  REQUIRE_GPU();
  const auto [replicas, output_on_cpu] = GetParam();
  auto module = MakeMlp(1), cpu = MakeMlp(1);
  module->To(kGpu);
  DataParallel::Options options{.devices = std::vector<Device>(static_cast<size_t>(replicas), kGpu)};
  if (output_on_cpu) options.output_device = kCPU;
  absl::StatusOr<std::shared_ptr<DataParallel>> dp = DataParallel::Create(
      module, [] { return MakeMlp(2); }, options);
  ASSERT_TRUE(dp.ok()) << dp.status();
  const optim::Sgd sgd{.lr = 0.05, .momentum = 0.9};
  optim::Optimizer opt((*dp)->Parameters(), sgd), opt_cpu(cpu->Parameters(), sgd);
  Generator gen(3);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Tensor::Randn({33, 12}, gen, DType::kFloat64),
                 target = Tensor::Randn({33, 4}, gen, DType::kFloat64);
    opt.ZeroGrad();
    opt_cpu.ZeroGrad();
    const Tensor out = (*dp)->Forward(gw::To(x, kGpu));
    EXPECT_EQ(out.device(), output_on_cpu ? kCPU : kGpu);
    const Tensor loss = nn::MseLoss(out, gw::To(target, out.device())), want = nn::MseLoss(cpu->Forward(x), target);
    EXPECT_NEAR(loss.item(), want.item(), 1e-10) << "step " << step;
    autograd::Backward({loss});
    autograd::Backward({want});
    const nn::NamedTensors got = module->NamedParameters(), ref = cpu->NamedParameters();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].second.grad().defined()) << got[i].first;
      EXPECT_EQ(got[i].second.grad().device(), kGpu) << got[i].first;
      EXPECT_LT(kernels::MaxAbsDiff(gw::To(got[i].second.grad(), kCPU), ref[i].second.grad()), 1e-10) << got[i].first;
    }
    opt.Step();
    opt_cpu.Step();
  }
}

INSTANTIATE_TEST_SUITE_P(Replicas, GpuDataParallelTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

}  // namespace
}  // namespace gw::parallel
