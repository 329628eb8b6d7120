// DataParallel on CPUs: one device runs the module unchanged; several CPU replicas (on
// threads) give the module alone's outputs and gradients, step after step of training, for
// batches that split evenly or not, and fewer replicas for a small batch; the errors
// (module elsewhere, no factory, another structure, a replica that throws, a GPU where
// there is none). The same on a GPU: gradwire_parallel_gpu_tests (label gpu).
#include "gradwire/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/loss.h"
#include "gradwire/nn/normalization.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"

namespace gw::parallel {
namespace {

std::shared_ptr<nn::Sequential> MakeMlp(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 16, gen, true, DType::kFloat64), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(16, 3, gen, true, DType::kFloat64)});
}

std::shared_ptr<DataParallel> Wrap(std::shared_ptr<nn::Module> module, std::vector<Device> devices) {
  absl::StatusOr<std::shared_ptr<DataParallel>> dp =
      DataParallel::Create(std::move(module), [] { return MakeMlp(99); }, {.devices = std::move(devices)});
  EXPECT_TRUE(dp.ok()) << dp.status();
  return dp.ok() ? *dp : nullptr;
}

Tensor Batch(int64_t n, uint64_t seed) {
  Generator gen(seed);
  return Tensor::Randn({n, 6}, gen, DType::kFloat64);
}

void ExpectSameParametersAndGradients(nn::Module& got, nn::Module& want, double tol) {
  const nn::NamedTensors g = got.NamedParameters(), w = want.NamedParameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LT(kernels::MaxAbsDiff(g[i].second, w[i].second), tol) << g[i].first;
    ASSERT_TRUE(g[i].second.grad().defined()) << g[i].first;
    EXPECT_LT(kernels::MaxAbsDiff(g[i].second.grad(), w[i].second.grad()), tol) << g[i].first;
  }
}

TEST(DataParallelTest, OnOneDeviceItRunsTheModuleUnchanged) {
  auto module = MakeMlp(1), alone = MakeMlp(1);
  absl::StatusOr<std::shared_ptr<DataParallel>> dp = DataParallel::Create(module, nullptr);
  ASSERT_TRUE(dp.ok()) << dp.status();
  // Without a GPU: the module's own device alone.
  if (!cuda::Available()) {
    EXPECT_EQ((*dp)->devices(), std::vector<Device>{kCPU});
  }
  EXPECT_EQ(&(*dp)->module(), module.get());
  EXPECT_EQ((*dp)->NamedParameters().front().first, "module.0.weight");
  if (cuda::Available()) GTEST_SKIP() << "a GPU is present: DataParallel's default devices are the GPUs";
  const Tensor x = Batch(8, 2);
  const Tensor y = (*dp)->Forward(x), want = alone->Forward(x);
  EXPECT_EQ(kernels::MaxAbsDiff(y, want), 0.0);
  autograd::Backward({Sum(y)});
  autograd::Backward({Sum(want)});
  ExpectSameParametersAndGradients(*module, *alone, 1e-15);
}

class CpuReplicasTest : public ::testing::TestWithParam<int> {};

// Three steps of SGD with momentum: the replicas take the stepped parameters each time.
TEST_P(CpuReplicasTest, TrainingEqualsTheModuleAlone) {
  const int replicas = GetParam();
  auto module = MakeMlp(1), alone = MakeMlp(1);
  auto dp = Wrap(module, std::vector<Device>(static_cast<size_t>(replicas), kCPU));
  ASSERT_NE(dp, nullptr);
  const optim::Sgd sgd{.lr = 0.1, .momentum = 0.9};
  optim::Optimizer opt(dp->Parameters(), sgd), opt_alone(alone->Parameters(), sgd);
  Generator gen(5);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Batch(10, 10 + static_cast<uint64_t>(step));  // 10 over 3 replicas: 4, 4, 2
    const Tensor target = Tensor::Randn({10, 3}, gen, DType::kFloat64);
    opt.ZeroGrad();
    opt_alone.ZeroGrad();
    const Tensor loss = nn::MseLoss(dp->Forward(x), target), want = nn::MseLoss(alone->Forward(x), target);
    EXPECT_NEAR(loss.item(), want.item(), 1e-12) << "step " << step;
    autograd::Backward({loss});
    autograd::Backward({want});
    ExpectSameParametersAndGradients(*module, *alone, 1e-12);
    opt.Step();
    opt_alone.Step();
  }
}

INSTANTIATE_TEST_SUITE_P(Replicas, CpuReplicasTest, ::testing::Values(2, 3, 4));

TEST(DataParallelTest, GradientsFlowBackToTheInputAndABatchSmallerThanTheDevicesUsesFewerReplicas) {
  auto module = MakeMlp(1), alone = MakeMlp(1);
  auto dp = Wrap(module, {kCPU, kCPU, kCPU});
  ASSERT_NE(dp, nullptr);
  const Tensor x = Batch(2, 3).set_requires_grad(true);
  const Tensor lx = kernels::Clone(x).set_requires_grad(true);
  const Tensor y = dp->Forward(x);
  EXPECT_EQ(y.sizes(), (Shape{2, 3}));
  EXPECT_LT(kernels::MaxAbsDiff(y, alone->Forward(lx)), 1e-12);
  autograd::Backward({Sum(Mul(y, y))});
  autograd::Backward({Sum(Mul(alone->Forward(lx), alone->Forward(lx)))});
  ASSERT_TRUE(x.grad().defined());
  EXPECT_LT(kernels::MaxAbsDiff(x.grad(), lx.grad()), 1e-12);
}

TEST(DataParallelTest, WithoutGradientRecordingItOnlyComputes) {
  auto module = MakeMlp(1), alone = MakeMlp(1);
  auto dp = Wrap(module, {kCPU, kCPU});
  ASSERT_NE(dp, nullptr);
  autograd::NoGradGuard no_grad;
  const Tensor y = dp->Forward(Batch(5, 4));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_LT(kernels::MaxAbsDiff(y, alone->Forward(Batch(5, 4))), 1e-12);
}

TEST(DataParallelTest, BatchNormBuffersKeepWhatTheModuleMadeOfItsChunk) {
  auto make = [] {
    return std::make_shared<nn::Sequential>(
        std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::BatchNorm1d>(6)});
  };
  auto module = make(), alone = make();
  absl::StatusOr<std::shared_ptr<DataParallel>> dp = DataParallel::Create(module, make, {.devices = {kCPU, kCPU}});
  ASSERT_TRUE(dp.ok()) << dp.status();
  Generator gen(8);
  const Tensor x = Tensor::Randn({8, 6}, gen);
  (void)(*dp)->Forward(x);
  (void)alone->Forward(Narrow(x, 0, 0, 4));  // replica 0's chunk
  const nn::NamedTensors got = module->NamedBuffers(), want = alone->NamedBuffers();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LT(kernels::MaxAbsDiff(kernels::ToDType(got[i].second, DType::kFloat64),
                                  kernels::ToDType(want[i].second, DType::kFloat64)),
              1e-6)
        << got[i].first;
  }
}

class Throws final : public nn::Module {
 public:
  Throws() : Module("Throws") {}
  Tensor Forward(const Tensor& x) override {
    GW_CHECK(x.size(0) > 3, "Throws", "a chunk of ", x.size(0), " rows is too small");
    return x;
  }
};

TEST(DataParallelTest, AReplicaThatThrowsIsNamed) {
  absl::StatusOr<std::shared_ptr<DataParallel>> dp = DataParallel::Create(
      std::make_shared<Throws>(), [] { return std::make_shared<Throws>(); }, {.devices = {kCPU, kCPU}});
  ASSERT_TRUE(dp.ok()) << dp.status();
  try {
    (void)(*dp)->Forward(Batch(7, 1));  // chunks of 4 and 3
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DataParallel: the replica on cpu (chunk 1 of 2) failed: Throws: a chunk "
                                         "of 3 rows is too small"),
              std::string::npos)
        << e.what();
  }
}

TEST(DataParallelTest, BadSetupsSayWhatIsWrong) {
  auto expect = [](const absl::StatusOr<std::shared_ptr<DataParallel>>& dp, std::string_view needle) {
    EXPECT_EQ(dp.status().code(), absl::StatusCode::kInvalidArgument) << dp.status();
    EXPECT_NE(dp.status().message().find(absl::string_view(needle.data(), needle.size())), absl::string_view::npos)
        << dp.status();
  };
  expect(DataParallel::Create(MakeMlp(1), nullptr, {.devices = {kCPU, kCPU}}), "needs make_replica");
  expect(DataParallel::Create(MakeMlp(1),
                              [] {
                                Generator gen(1);
                                return std::make_shared<nn::Linear>(6, 3, gen, true, DType::kFloat64);
                              },
                              {.devices = {kCPU, kCPU}}),
         "make_replica built a module of another structure: entry 0 of its state is weight [3, 6] float64, the "
         "module's is 0.weight [16, 6] float64");
  if (!cuda::Available()) {
    expect(DataParallel::Create(MakeMlp(1), nullptr, {.devices = {Cuda(0)}}), "cuda:0");
    expect(DataParallel::Create(MakeMlp(1), nullptr, {.devices = {Cuda(0)}}), "no GPU");
  } else {
    expect(DataParallel::Create(MakeMlp(1), nullptr, {.devices = {Cuda(0)}}),
           "the module is on cpu but devices[0] "
           "is cuda:0");
  }
}

}  // namespace
}  // namespace gw::parallel
