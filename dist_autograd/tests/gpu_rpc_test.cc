// On a GPU: CUDA tensors through RPC with device maps (agents on threads of this process,
// real loopback connections; the bytes are staged through host memory): a mapped tensor
// arrives on the mapped GPU and its reply comes back on the caller's GPU, an unmapped one
// arrives on the CPU, and distributed autograd across a mapped call gives the gradient on
// the GPU the input was on, equal to the same computation run locally. Skipped, with the
// reason, where there is no GPU.
#include <gtest/gtest.h>

#include "require_gpu.h"

#include "agent_group.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"

namespace gw::dist_autograd {
namespace {

using rpc::Agent;
using rpc::AgentOptions;
using rpc::DeviceMap;

using ::gw::testing::kGpu;

// Two workers; with `mapped`, each maps its cuda:0 onto the other's cuda:0.
struct Pair {
  std::vector<std::shared_ptr<DistAutograd>> engines{2};
  std::unique_ptr<rpc::testing::AgentGroup> group;

  explicit Pair(bool mapped) {
    group = rpc::testing::AgentGroup::Start(
        2,
        [this](Agent& a) {
          if (absl::Status s = rpc::Assign(DistAutograd::Install(a), engines[static_cast<size_t>(a.self().rank)]);
              !s.ok()) {
            return s;
          }
          if (absl::Status s = a.Register("device_of", [](Tensor x) { return x.device().ToString(); }); !s.ok()) {
            return s;
          }
          return a.Register("square", [](Tensor x) { return Mul(x, x); });
        },
        {},
        [mapped](int rank, AgentOptions& o) {
          if (!mapped) return;
          absl::StatusOr<DeviceMap> map =
              DeviceMap::Make(absl::StrCat("worker", rank), absl::StrCat("worker", 1 - rank), {{kGpu, kGpu}});
          ASSERT_TRUE(map.ok()) << map.status();
          o.device_maps.Set(*std::move(map));
        });
  }
  ~Pair() {
    if (group) (void)group->ShutdownAll();
  }
  Agent& agent(int r) { return (*group)[r]; }
};

Tensor Input(DType dtype) {
  Generator gen(5);
  return gw::To(Tensor::Randn({64, 33}, gen, dtype), kGpu);
}

TEST(GpuRpcTest, AMappedTensorArrivesOnTheMappedGpuAndItsReplyComesBackThere) {
  REQUIRE_GPU();
  Pair p(/*mapped=*/true);
  ASSERT_NE(p.group, nullptr);
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Tensor x = Input(dtype);
    EXPECT_EQ(p.agent(0).Sync<std::string>("worker1", "device_of", x).value_or("?"), "cuda:0");
    absl::StatusOr<Tensor> y = p.agent(0).Sync<Tensor>("worker1", "square", x);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->device(), kGpu);
    EXPECT_EQ(kernels::MaxAbsDiff(gw::To(*y, kCPU), gw::To(Mul(x, x), kCPU)), 0.0);
  }
}

TEST(GpuRpcTest, AnUnmappedGpuTensorArrivesOnTheCpu) {
  REQUIRE_GPU();
  Pair p(/*mapped=*/false);
  ASSERT_NE(p.group, nullptr);
  const Tensor x = Input(DType::kFloat32);
  EXPECT_EQ(p.agent(0).Sync<std::string>("worker1", "device_of", x).value_or("?"), "cpu");
  absl::StatusOr<Tensor> y = p.agent(0).Sync<Tensor>("worker1", "square", x);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->device(), kCPU);
  EXPECT_LT(kernels::MaxAbsDiff(*y, gw::To(Mul(x, x), kCPU)), 1e-6);
}

TEST(GpuRpcTest, DistributedBackwardAcrossAMappedCallGivesTheGradientOnTheInputsGpu) {
  REQUIRE_GPU();
  for (bool mapped : {true, false}) {
    Pair p(mapped);
    ASSERT_NE(p.group, nullptr);
    const Tensor x = Input(DType::kFloat64).set_requires_grad(true);
    Context ctx(*p.engines[0]);
    absl::StatusOr<Tensor> y = p.agent(0).Sync<Tensor>("worker1", "square", x);
    ASSERT_TRUE(y.ok()) << y.status();
    const Tensor loss = Sum(gw::To(*y, kGpu));
    ASSERT_TRUE(ctx.Backward({loss}).ok());
    const Tensor grad = ctx.GradOf(x);
    ASSERT_TRUE(grad.defined());
    EXPECT_EQ(grad.device(), kGpu) << (mapped ? "mapped" : "unmapped");
    // d/dx sum(x * x) = 2x.
    EXPECT_LT(kernels::MaxAbsDiff(gw::To(grad, kCPU), kernels::MulScalar(gw::To(x.detach(), kCPU), 2.0)), 1e-12);
  }
}

}  // namespace
}  // namespace gw::dist_autograd
