// Unit: devices above the tensor layer that need no GPU: gw::To and Module::To to the CPU
// are no-ops, and to a GPU this process cannot use they fail naming it, changing nothing.
// (On a GPU: nn/tests/gpu_modules_test.cc.)
#include <gtest/gtest.h>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/nn/layers.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

Device MissingGpu() { return cuda::Available() ? Cuda(static_cast<int16_t>(cuda::DeviceCount())) : Cuda(0); }

TEST(DeviceTest, ToTheTensorsOwnDeviceIsTheTensorAndKeepsItsGradient) {
  const Tensor x = Tensor::Ones({3}).set_requires_grad(true);
  const Tensor y = gw::To(x, kCPU);
  EXPECT_TRUE(y.is_same(x));
  autograd::Backward({Sum(Mul(y, y))});
  EXPECT_EQ(x.grad().ToVector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(DeviceTest, ToAMissingGpuNamesIt) {
  const Tensor x = Tensor::Ones({3}).set_requires_grad(true);
  try {
    gw::To(x, MissingGpu());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(MissingGpu().ToString()), std::string::npos) << e.what();
  }
}

TEST(DeviceTest, ModuleToMovesNothingWhenTheDeviceIsMissing) {
  Generator gen(3);
  Linear layer(4, 2, gen);
  EXPECT_EQ(layer.device(), kCPU);
  const std::vector<float> before = layer.weight().ToVector<float>();
  const void* data = layer.weight().storage()->data();
  EXPECT_THROW(layer.To(MissingGpu()), Error);
  EXPECT_EQ(layer.device(), kCPU);
  EXPECT_EQ(layer.weight().storage()->data(), data);
  layer.To(kCPU);  // already there: nothing moves
  EXPECT_EQ(layer.weight().storage()->data(), data);
  EXPECT_EQ(layer.weight().ToVector<float>(), before);
}

}  // namespace
}  // namespace gw::nn
