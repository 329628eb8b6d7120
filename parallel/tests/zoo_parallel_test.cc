// The zoo's models under the parallel wrappers, on agents on threads of this process:
//   - the SmallResNet cut in two pipeline stages (examples/pipeline_stages.h, what
//     pipeline_fashion_mnist --model=resnet runs) with 1, 4 and 8 micro-batches, GPipe and
//     1F1B, gives per step the same gradients (every parameter) and the same BatchNorm
//     running statistics as the same model run in one process over the same micro-batches
//     one after another (gradients accumulated), float32 to 1e-5 relative;
//   - DDP with 2 replicas of the TutorialCnn gives the same gradients as one process on the
//     concatenated batch (float64 to 1e-10 relative; eval mode, so that dropout draws
//     nothing: the replicas' masks could not match one process's);
//   - a SmallResNet computes on threads that did not make the cached oneDNN primitives.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives_job.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/models/resnet.h"
#include "gradwire/models/zoo.h"
#include "gradwire/nn/loss.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/parallel/distributed_data_parallel.h"
#include "gradwire/parallel/pipeline.h"
#include "gradwire/tensor/kernels.h"
#include "pipeline_stages.h"

namespace gw::parallel {
namespace {

using collectives::testing::Job;

// |got - want| <= tol * max(1, max |want|), element by element.
void ExpectClose(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no value";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = std::max(1.0, kernels::MaxAbsDiff(want, Tensor::Zeros(want.sizes(), want.dtype())));
  EXPECT_LE(kernels::MaxAbsDiff(got, want), tol * scale) << what;
}

// The batch of step `step`: images in [0, 1) and labels.
struct Batch {
  Tensor x, y;
};
Batch MakeBatch(int step, int64_t rows, DType dtype) {
  Generator gen(static_cast<uint64_t>(step + 7));
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < rows; ++i) labels.push_back((i * 3 + step) % 10);
  return {Tensor::Uniform({rows, 784}, 0, 1, gen, dtype), Tensor::FromVector(labels)};
}

// The pipeline's split of `rows` into `chunks` (parallel/pipeline.h: sizes differ by at
// most one, the larger first).
std::vector<std::pair<int64_t, int64_t>> Split(int64_t rows, int chunks) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int c = 0; c < chunks; ++c) {
    const int64_t n = rows / chunks + (c < rows % chunks ? 1 : 0);
    out.emplace_back(begin, n);
    begin += n;
  }
  return out;
}

const optim::Sgd kSgd{.lr = 0.05, .momentum = 0.9};

// (micro-batches, schedule, ordered_backward)
class ResNetPipelineEqualsOneProcess : public ::testing::TestWithParam<std::tuple<int, Schedule, bool>> {};

TEST_P(ResNetPipelineEqualsOneProcess, GradientsAndRunningStatisticsEveryStep) {
  const auto [chunks, schedule, ordered] = GetParam();
  constexpr int64_t kRows = 16, kSeed = 3;
  constexpr double kTol = 1e-5;
  // The stages the workers build (as pipeline_fashion_mnist's factory does), kept here too.
  struct Built {
    std::mutex mu;
    std::map<int, std::shared_ptr<nn::Module>> by_rank;
  };
  auto built = std::make_shared<Built>();
  std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines(3);
  auto* engines_ptr = &engines;
  Job job = Job::Start(3, {}, [built, engines_ptr](rpc::Agent& agent) -> absl::Status {
    const int rank = agent.self().rank;
    auto& engine = (*engines_ptr)[static_cast<size_t>(rank)];
    if (absl::Status s = rpc::Assign(dist_autograd::DistAutograd::Install(agent), engine); !s.ok()) return s;
    if (absl::Status s = examples::RegisterPipelineStages(agent); !s.ok()) return s;
    return dist_nn::RegisterModuleFactory(agent, "kept_stage", [built, rank](int64_t stage) {
      std::shared_ptr<nn::Module> m = examples::MakeStage("resnet", stage, kSeed);
      std::lock_guard<std::mutex> lock(built->mu);
      built->by_rank[rank] = m;
      return m;
    });
  });
  rpc::Agent& driver = (*job.agents)[0];
  std::vector<dist_nn::RemoteModule> stages;
  std::vector<rpc::RRef<Tensor>> params;
  for (int64_t s = 0; s < 2; ++s) {
    auto m = dist_nn::RemoteModule::Create(driver, absl::StrCat("worker", s + 1), "kept_stage", s);
    ASSERT_TRUE(m.ok()) << m.status();
    auto p = m->RemoteParameters();
    ASSERT_TRUE(p.ok()) << p.status();
    params.insert(params.end(), p->begin(), p->end());
    stages.push_back(*m);
  }
  auto opt = dist_autograd::DistributedOptimizer::Create(driver, kSgd, params);
  ASSERT_TRUE(opt.ok()) << opt.status();
  const Pipeline pipe(stages, PipelineOptions{.chunks = chunks, .schedule = schedule, .ordered_backward = ordered});
  std::vector<std::shared_ptr<nn::Module>> remote;
  {
    std::lock_guard<std::mutex> lock(built->mu);
    remote = {built->by_rank.at(1), built->by_rank.at(2)};
  }

  // One process: the same model (same seed), cut the same way for the names.
  Generator gen(kSeed);
  models::SmallResNet local(gen);
  const std::vector<std::shared_ptr<examples::PipelineStage>> local_stages = examples::CutResNet(local, DType::kFloat32);
  optim::Optimizer local_opt(local.Parameters(), kSgd);
  const auto loss = [](const Tensor& out, const Tensor& y) { return models::Loss("resnet", out, y); };

  for (int step = 0; step < 2; ++step) {
    const Batch b = MakeBatch(step, kRows, DType::kFloat32);
    local_opt.ZeroGrad();
    double local_loss = 0;
    for (const auto& [begin, n] : Split(kRows, chunks)) {
      Tensor l = loss(local.Forward(Narrow(b.x, 0, begin, n)), Narrow(b.y, 0, begin, n)) *
                 (static_cast<double>(n) / static_cast<double>(kRows));
      local_loss += l.item<double>();
      autograd::Backward({l});
    }
    dist_autograd::Context ctx(*engines[0]);
    absl::StatusOr<double> got_loss = pipe.ForwardBackward(ctx, examples::TagRows(b.x), b.y, loss);
    ASSERT_TRUE(got_loss.ok()) << got_loss.status();
    EXPECT_NEAR(*got_loss, local_loss, kTol * std::max(1.0, std::abs(local_loss))) << "step " << step;
    for (size_t s = 0; s < 2; ++s) {
      const nn::NamedTensors want = local_stages[s]->NamedParameters();
      const nn::NamedTensors have = remote[s]->NamedParameters();
      ASSERT_EQ(have.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(have[i].first, want[i].first);
        ExpectClose(engines[s + 1]->GradOf(ctx.id(), have[i].second), want[i].second.grad(), kTol,
                    absl::StrCat("step ", step, " stage ", s, " gradient of ", want[i].first));
      }
      const nn::NamedTensors want_buffers = local_stages[s]->NamedBuffers();
      const nn::NamedTensors have_buffers = remote[s]->NamedBuffers();
      ASSERT_EQ(have_buffers.size(), want_buffers.size());
      ASSERT_FALSE(want_buffers.empty());
      for (size_t i = 0; i < want_buffers.size(); ++i) {
        if (want_buffers[i].second.dtype() == DType::kInt64) {  // num_batches_tracked
          EXPECT_EQ(have_buffers[i].second.item<int64_t>(), want_buffers[i].second.item<int64_t>())
              << "step " << step << " stage " << s << " " << want_buffers[i].first;
        } else {
          ExpectClose(have_buffers[i].second, want_buffers[i].second, kTol,
                      absl::StrCat("step ", step, " stage ", s, " buffer ", want_buffers[i].first));
        }
      }
    }
    ASSERT_TRUE((*opt)->Step(ctx).ok());
    local_opt.Step();
    if (!ordered) {
      // One backward pass over every micro-batch adds their gradients in arrival order, so
      // its rounding differs from the one process's, and batch norm over a few rows
      // magnifies that into the next step's gradients (up to 1e-4 at 4 rows). Each step is
      // compared from the same weights: the stages' are copied into the one process.
      for (size_t s = 0; s < 2; ++s) {
        for (auto [want, have] : {std::pair(local_stages[s]->NamedParameters(), remote[s]->NamedParameters()),
                                  std::pair(local_stages[s]->NamedBuffers(), remote[s]->NamedBuffers())}) {
          for (size_t i = 0; i < want.size(); ++i) kernels::CopyInPlace(want[i].second, have[i].second);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ZooPipeline, ResNetPipelineEqualsOneProcess,
                         ::testing::Combine(::testing::Values(1, 4, 8),
                                            ::testing::Values(Schedule::kGPipe, Schedule::k1F1B),
                                            ::testing::Values(true)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<1>(info.param) == Schedule::kGPipe ? "GPipe" : "OneFOneB",
                                               std::get<0>(info.param), "MicroBatches");
                         });
// One backward pass over every micro-batch (the stages' backward overlaps): the stages
// add the micro-batches' gradients in arrival order, so they equal the one process's up
// to float rounding, each step from the same weights (the test copies them).
INSTANTIATE_TEST_SUITE_P(ZooPipelineOverlappedBackward, ResNetPipelineEqualsOneProcess,
                         ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values(Schedule::kGPipe),
                                            ::testing::Values(false)),
                         [](const auto& info) { return absl::StrCat("GPipe", std::get<0>(info.param), "MicroBatches"); });

// The replay itself, without RPC: micro-batches of a batch handed to a stage in the order
// 2, 0, 3, 1 give the outputs and leave the running statistics that 0, 1, 2, 3 give.
TEST(PipelineStageTest, MicroBatchesOutOfOrderLeaveTheStatisticsOfBatchOrder) {
  constexpr int64_t kRows = 8;
  Generator gen_a(5), gen_b(5);
  const models::SmallResNet net_a(gen_a), net_b(gen_b);
  const auto in_order = examples::CutResNet(net_a, DType::kFloat32)[0];
  const auto shuffled = examples::CutResNet(net_b, DType::kFloat32)[0];
  const Tensor tagged = examples::TagRows(MakeBatch(0, kRows, DType::kFloat32).x);
  const auto parts = Split(kRows, 4);
  auto micro = [&](size_t m) { return kernels::Narrow(tagged, 0, parts[m].first, parts[m].second); };
  std::vector<Tensor> want(4), got(4);
  for (size_t m : {0, 1, 2, 3}) want[m] = in_order->Forward(micro(m));
  for (size_t m : {2, 0, 3, 1}) got[m] = shuffled->Forward(micro(m));
  for (size_t m = 0; m < 4; ++m) EXPECT_EQ(kernels::MaxAbsDiff(got[m], want[m]), 0.0) << "micro-batch " << m;
  const nn::NamedTensors a = in_order->NamedBuffers(), b = shuffled->NamedBuffers();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(kernels::MaxAbsDiff(kernels::ToDType(b[i].second, DType::kFloat64),
                                  kernels::ToDType(a[i].second, DType::kFloat64)),
              0.0)
        << a[i].first;
  }
}

// The DDP tutorials' models (the README's ddp_fashion_mnist --model=cnn and --model=vit).
class ZooDdpTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooDdpTest, TwoReplicasGiveTheGradientsOfTheConcatenatedBatch) {
  const std::string model = GetParam();
  constexpr int kReplicas = 2;
  constexpr int64_t kPerReplica = 3;
  constexpr double kTol = 1e-10;
  auto make = [&](uint64_t seed) {
    Generator gen(seed);
    absl::StatusOr<std::shared_ptr<nn::Module>> m = models::Create(model, gen, DType::kFloat64);
    EXPECT_TRUE(m.ok()) << m.status();
    (*m)->Eval();  // dropout off (see the file comment)
    return *m;
  };
  auto batch = [](int step, int replica) { return MakeBatch(10 * step + replica, kPerReplica, DType::kFloat64); };
  const auto loss = [&](const Tensor& out, const Tensor& y) { return models::Loss(model, out, y); };

  std::shared_ptr<nn::Module> local = make(0);
  optim::Optimizer local_opt(local->Parameters(), kSgd);
  constexpr int kSteps = 2;
  std::vector<nn::NamedTensors> want(kSteps);  // the gradients of each step, by name
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Tensor> xs, ys;
    for (int r = 0; r < kReplicas; ++r) {
      xs.push_back(batch(step, r).x);
      ys.push_back(batch(step, r).y);
    }
    local_opt.ZeroGrad();
    autograd::Backward({loss(local->Forward(kernels::Cat(xs, 0)), kernels::Cat(ys, 0))});
    for (const auto& [name, p] : local->NamedParameters()) want[step].emplace_back(name, kernels::Clone(p.grad()));
    local_opt.Step();
  }

  Job job = Job::Start(kReplicas);
  auto groups = job.Groups();
  job.OnEveryRank([&](int r) {
    // Replica 1 starts elsewhere: DDP broadcasts replica 0's parameters.
    auto ddp = DistributedDataParallel::Create(make(static_cast<uint64_t>(r) * 5), groups[static_cast<size_t>(r)]);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    optim::Optimizer opt((*ddp)->Parameters(), kSgd);
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = batch(step, r);
      opt.ZeroGrad();
      autograd::Backward({loss((*ddp)->Forward(b.x), b.y)});
      const nn::NamedTensors got = (*ddp)->NamedParameters();  // "module.conv1.weight", ...
      ASSERT_EQ(got.size(), want[step].size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].first, "module." + want[step][i].first);
        ExpectClose(got[i].second.grad(), want[step][i].second, kTol,
                    absl::StrCat("replica ", r, " step ", step, " gradient of ", want[step][i].first));
      }
      opt.Step();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Models, ZooDdpTest, ::testing::Values("cnn", "vit"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Pipeline stages compute on threads that did not make the cached oneDNN primitives: RPC
// handlers and backward passes on pool threads. With one OpenMP thread (what `gradwire
// launch` gives each worker on a small machine) such a run wrote through a null pointer
// (oneDNN's library scratchpad belongs to the thread that made the primitive; the kernels
// now pass their own, tensor/src/dnnl_util.h UserScratchpad). Each step here runs forward
// and backward on fresh threads.
TEST(ZooThreadsTest, ResNetForwardAndBackwardOnThreadsThatDidNotMakeThePrimitives) {
  // omp_set_num_threads from the OpenMP runtime oneDNN loaded (this binary does not link it).
  using SetThreads = void (*)(int);
  const auto set_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  auto one_thread = [set_threads] {
    if (set_threads != nullptr) set_threads(1);
  };
  Generator gen(3);
  models::SmallResNet net(gen);
  for (int step = 0; step < 3; ++step) {
    const Batch b = MakeBatch(step, 32, DType::kFloat32);
    Tensor out;
    std::thread([&] {
      one_thread();
      out = net.Forward(b.x);
    }).join();
    std::thread([&] {
      one_thread();
      autograd::Backward({models::Loss("resnet", out, b.y)});
    }).join();
    for (const Tensor& p : net.Parameters()) ASSERT_TRUE(p.grad().defined()) << "step " << step;
    net.ZeroGrad();
  }
}

}  // namespace
}  // namespace gw::parallel
