// On a GPU: every optimizer's update of a parameter on cuda:0 equals the CPU's, step by
// step, with its state buffers on the GPU. Skipped, with the reason, where there is no GPU.
#include <gtest/gtest.h>

#include "require_gpu.h"

#include "gradwire/optim/functional.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"

namespace gw::optim {
namespace {

TEST(GpuOptimTest, EveryOptimizerOnTheGpuEqualsTheCpu) {
  REQUIRE_GPU();
  const Device gpu = Cuda(0);
  const std::vector<OptimizerConfig> configs = {
      Sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}, Adam{.lr = 0.01, .amsgrad = true},
      AdamW{.lr = 0.02, .weight_decay = 0.1}, Adagrad{.lr = 0.1, .lr_decay = 0.01}};
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const double tol = dtype == DType::kFloat32 ? 1e-5 : 1e-12;
    for (const OptimizerConfig& config : configs) {
      Generator gen(5);
      const Tensor cpu = Tensor::Randn({129, 33}, gen, dtype);
      const Tensor on_gpu = kernels::ToDevice(cpu, gpu);
      ParamState cpu_state, gpu_state;
      for (int step = 0; step < 4; ++step) {
        const Tensor grad = Tensor::Randn({129, 33}, gen, dtype);
        Update(config, cpu, grad, cpu_state);
        Update(config, on_gpu, kernels::ToDevice(grad, gpu), gpu_state);
      }
      EXPECT_LT(kernels::MaxAbsDiff(kernels::ToDevice(on_gpu, kCPU), cpu), tol)
          << Name(config) << " " << DTypeName(dtype);
      for (const auto& [name, buffer] : gpu_state.buffers) EXPECT_EQ(buffer.device(), gpu) << name;
      // A gradient left on the CPU is an error naming both devices.
      EXPECT_THROW(Update(config, on_gpu, Tensor::Zeros({129, 33}, dtype), gpu_state), Error);
    }
  }
}

}  // namespace
}  // namespace gw::optim
