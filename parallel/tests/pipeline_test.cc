// Pipelines over RemoteModules on agents on threads of this process: with 1, 4 and 8
// micro-batches and both schedules, training equals the same model trained in one
// process (float64, parameter by parameter, every step); a stage that fails is named.
#include "gradwire/parallel/pipeline.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "collectives_job.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/loss.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/tensor/kernels.h"

namespace gw::parallel {
namespace {

using collectives::testing::Job;

constexpr int64_t kIn = 6, kClasses = 3, kBatch = 8;

// Stage 0 and stage 1 of a float64 MLP, the same on any worker for the same seed.
std::shared_ptr<nn::Module> Stage(int64_t which, int64_t seed) {
  Generator gen(static_cast<uint64_t>(seed));
  if (which == 0) {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(kIn, 8, gen, true, DType::kFloat64), std::make_shared<nn::Tanh>()});
  }
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 5, gen, true, DType::kFloat64), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(5, kClasses, gen, true, DType::kFloat64)});
}

// A stage whose forward always fails.
class Broken : public nn::Module {
 public:
  Broken() : nn::Module("Broken") {}
  Tensor Forward(const Tensor&) override { throw Error("Broken::Forward: this stage is out of order"); }
};

struct Workers {
  Job job;
  std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines;
};

std::unique_ptr<Workers> Start(int n) {
  auto w = std::make_unique<Workers>();
  w->engines.resize(static_cast<size_t>(n));
  auto* engines = &w->engines;
  w->job = Job::Start(n, {}, [engines](rpc::Agent& agent) -> absl::Status {
    if (absl::Status s = rpc::Assign(dist_autograd::DistAutograd::Install(agent),
                                     (*engines)[static_cast<size_t>(agent.self().rank)]);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = dist_nn::RegisterModuleFactory(agent, "stage", Stage); !s.ok()) return s;
    return dist_nn::RegisterModuleFactory(agent, "broken", [] { return std::make_shared<Broken>(); });
  });
  return w;
}

struct Batch {
  Tensor x, y;
};
Batch MakeBatch(int step) {
  Generator gen(static_cast<uint64_t>(step + 11));
  std::vector<int64_t> labels;
  for (double u : Tensor::Uniform({kBatch}, 0, kClasses, gen, DType::kFloat64).ToVector<double>()) {
    labels.push_back(std::min<int64_t>(static_cast<int64_t>(u), kClasses - 1));
  }
  return {Tensor::Randn({kBatch, kIn}, gen, DType::kFloat64), Tensor::FromVector(labels)};
}

Tensor Loss(const Tensor& out, const Tensor& y) { return nn::CrossEntropyLoss(out, y); }

const optim::Sgd kSgd{.lr = 0.1, .momentum = 0.9};

class PipelineEqualsLocal : public ::testing::TestWithParam<std::tuple<int, Schedule>> {};

TEST_P(PipelineEqualsLocal, ParameterByParameterEveryStep) {
  const auto [chunks, schedule] = GetParam();
  auto w = Start(3);
  rpc::Agent& driver = (*w->job.agents)[0];
  std::vector<dist_nn::RemoteModule> stages;
  for (int s = 0; s < 2; ++s) {
    auto m = dist_nn::RemoteModule::Create(driver, absl::StrCat("worker", s + 1), "stage", int64_t{s}, int64_t{s + 5});
    ASSERT_TRUE(m.ok()) << m.status();
    stages.push_back(*m);
  }
  std::vector<rpc::RRef<Tensor>> params;
  for (const auto& stage : stages) {
    auto p = stage.RemoteParameters();
    ASSERT_TRUE(p.ok()) << p.status();
    params.insert(params.end(), p->begin(), p->end());
  }
  auto opt = dist_autograd::DistributedOptimizer::Create(driver, kSgd, params);
  ASSERT_TRUE(opt.ok()) << opt.status();
  Pipeline pipe(stages, PipelineOptions{.chunks = chunks, .schedule = schedule});

  auto local = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{Stage(0, 5), Stage(1, 6)});
  optim::Optimizer local_opt(local->Parameters(), kSgd);
  for (int step = 0; step < 3; ++step) {
    Batch b = MakeBatch(step);
    Tensor local_loss = Loss(local->Forward(b.x), b.y);
    local_opt.ZeroGrad();
    autograd::Backward({local_loss});
    local_opt.Step();
    {
      dist_autograd::Context ctx(*w->engines[0]);
      absl::StatusOr<double> loss = pipe.ForwardBackward(ctx, b.x, b.y, Loss);
      ASSERT_TRUE(loss.ok()) << loss.status();
      EXPECT_NEAR(*loss, local_loss.item<double>(), 1e-12) << "step " << step;
      ASSERT_TRUE((*opt)->Step(ctx).ok());
    }
    std::vector<Tensor> remote;
    for (const auto& stage : stages) {
      auto fetched = stage.FetchParameters();
      ASSERT_TRUE(fetched.ok()) << fetched.status();
      // Sequential names "0.weight", "0.bias", "2.weight", ...: by layer, weight first.
      for (const auto& [name, t] : local->children()[remote.empty() ? 0 : 1].second->NamedParameters()) {
        remote.push_back(fetched->at(name));
      }
    }
    const std::vector<Tensor> want = local->Parameters();
    ASSERT_EQ(remote.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_LT(kernels::MaxAbsDiff(remote[i], want[i]), 1e-6) << "step " << step << " parameter " << i;
    }
  }
  // Evaluation through the pipeline equals the local model too.
  Batch b = MakeBatch(9);
  absl::StatusOr<Tensor> out = pipe.Forward(b.x);
  ASSERT_TRUE(out.ok()) << out.status();
  autograd::NoGradGuard no_grad;
  EXPECT_LT(kernels::MaxAbsDiff(*out, local->Forward(b.x)), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Pipeline, PipelineEqualsLocal,
                         ::testing::Combine(::testing::Values(1, 4, 8),
                                            ::testing::Values(Schedule::kGPipe, Schedule::k1F1B)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<1>(info.param) == Schedule::kGPipe ? "GPipe" : "OneFOneB",
                                               std::get<0>(info.param), "MicroBatches");
                         });

TEST(PipelineTest, AFailingStageIsNamedWithItsWorker) {
  auto w = Start(3);
  rpc::Agent& driver = (*w->job.agents)[0];
  auto first = dist_nn::RemoteModule::Create(driver, "worker1", "stage", int64_t{0}, int64_t{5});
  auto broken = dist_nn::RemoteModule::Create(driver, "worker2", "broken");
  ASSERT_TRUE(first.ok() && broken.ok());
  for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B}) {
    Pipeline pipe({*first, *broken}, PipelineOptions{.chunks = 4, .schedule = schedule});
    dist_autograd::Context ctx(*w->engines[0]);
    Batch b = MakeBatch(0);
    absl::StatusOr<double> loss = pipe.ForwardBackward(ctx, b.x, b.y, Loss);
    ASSERT_FALSE(loss.ok());
    const std::string msg(loss.status().message());
    EXPECT_NE(msg.find("pipeline stage 1 (on worker2)"), std::string::npos) << loss.status();
    EXPECT_NE(msg.find("out of order"), std::string::npos) << loss.status();
  }
  EXPECT_THROW(Pipeline({*first}, PipelineOptions{.chunks = 0}), Error);
}

}  // namespace
}  // namespace gw::parallel
