// Pipelines over RemoteModules on agents on threads of this process: with 1, 4 and 8
// micro-batches and both schedules, training equals the same model trained in one
// process (float64, parameter by parameter, every step); so do two replicas of a pipeline
// (DDP of pipelines) on the concatenated batch; a stage that fails is named.
#include "gradwire/parallel/pipeline.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives_job.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/loss.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/tensor/kernels.h"
#include "nlohmann/json.hpp"

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

// Stage 0 and stage 1 of a float32 MLP wide enough that the order in which a stage adds
// its micro-batches' gradients shows in the bits of the sums.
std::shared_ptr<nn::Module> WideStage(int64_t which, int64_t seed) {
  Generator gen(static_cast<uint64_t>(seed));
  if (which == 0) {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(kIn, 64, gen), std::make_shared<nn::ReLU>()});
  }
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(64, 32, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, kClasses, gen)});
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
  w->job = Job::Start(n, {}, [engines](rpc::Agent& agent, const std::shared_ptr<collectives::Collectives>& layer) -> absl::Status {
    auto& engine = (*engines)[static_cast<size_t>(agent.self().rank)];
    if (absl::Status s = rpc::Assign(dist_autograd::DistAutograd::Install(agent), engine); !s.ok()) return s;
    if (absl::Status s = ServeStageReplicas(agent, layer, engine); !s.ok()) return s;
    if (absl::Status s = dist_nn::RegisterModuleFactory(agent, "stage", Stage); !s.ok()) return s;
    if (absl::Status s = dist_nn::RegisterModuleFactory(agent, "wide_stage", WideStage); !s.ok()) return s;
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

// DDP of pipelines: two replicas of a 2-stage pipeline (replica r's driver on worker 2r;
// replica 0's stages on workers 2 and 3, replica 1's on 0 and 1, so replica 0 is not the
// lowest rank of its stage groups), each on its own batch, starting from different
// parameters; BroadcastParameters, then per step ForwardBackward, AverageGradients and
// each replica's DistributedOptimizer step equal one model trained on the concatenated
// batch, both replicas, every parameter, every step. A replica whose backward did not
// reach its stages fails every replica's sync.
TEST(PipelineTest, ReplicatedPipelinesTrainAsOneOnTheConcatenatedBatch) {
  constexpr int kReplicas = 2;
  auto w = Start(2 * kReplicas);
  const std::vector<std::vector<int>> stage_hosts = {{2, 0}, {3, 1}};
  struct Replica {
    std::vector<dist_nn::RemoteModule> stages;
    std::unique_ptr<Pipeline> pipe;
    std::unique_ptr<dist_autograd::DistributedOptimizer> opt;
  };
  std::vector<Replica> replicas(kReplicas);
  for (int r = 0; r < kReplicas; ++r) {
    rpc::Agent& driver = (*w->job.agents)[2 * r];
    std::vector<rpc::RRef<Tensor>> params;
    for (int s = 0; s < 2; ++s) {
      auto m = dist_nn::RemoteModule::Create(driver, absl::StrCat("worker", stage_hosts[s][r]), "stage", int64_t{s},
                                             int64_t{s + 5 + 10 * r});  // replica 1 starts elsewhere
      ASSERT_TRUE(m.ok()) << m.status();
      replicas[r].stages.push_back(*m);
      auto p = m->RemoteParameters();
      ASSERT_TRUE(p.ok()) << p.status();
      params.insert(params.end(), p->begin(), p->end());
    }
    auto opt = dist_autograd::DistributedOptimizer::Create(driver, kSgd, params);
    ASSERT_TRUE(opt.ok()) << opt.status();
    replicas[r].opt = *std::move(opt);
    replicas[r].pipe = std::make_unique<Pipeline>(replicas[r].stages, PipelineOptions{.chunks = 4});
  }
  auto local = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{Stage(0, 5), Stage(1, 6)});
  optim::Optimizer local_opt(local->Parameters(), kSgd);

  auto replica_step = [&](int r, int step) {
    dist_autograd::Context ctx(*w->engines[static_cast<size_t>(2 * r)]);
    Batch b = MakeBatch(10 * step + r);
    absl::StatusOr<double> loss = replicas[r].pipe->ForwardBackward(ctx, b.x, b.y, Loss);
    ASSERT_TRUE(loss.ok()) << loss.status();
    absl::Status averaged = replicas[r].pipe->AverageGradients(ctx, stage_hosts);
    ASSERT_TRUE(averaged.ok()) << averaged;
    ASSERT_TRUE(replicas[r].opt->Step(ctx).ok());
  };
  auto on_every_replica = [&](const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < kReplicas; ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  };
  on_every_replica([&](int r) { EXPECT_TRUE(replicas[r].pipe->BroadcastParameters(stage_hosts).ok()); });
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> xs, ys;
    for (int r = 0; r < kReplicas; ++r) {
      Batch b = MakeBatch(10 * step + r);
      xs.push_back(b.x);
      ys.push_back(b.y);
    }
    local_opt.ZeroGrad();
    autograd::Backward({Loss(local->Forward(kernels::Cat(xs, 0)), kernels::Cat(ys, 0))});
    local_opt.Step();
    on_every_replica([&](int r) { replica_step(r, step); });

    for (int r = 0; r < kReplicas; ++r) {
      for (int s = 0; s < 2; ++s) {
        auto fetched = replicas[r].stages[s].FetchParameters();
        ASSERT_TRUE(fetched.ok()) << fetched.status();
        for (const auto& [name, want] : local->children()[s].second->NamedParameters()) {
          EXPECT_LT(kernels::MaxAbsDiff(fetched->at(name), want), 1e-6)
              << "replica " << r << " stage " << s << " " << name << " step " << step;
        }
      }
    }
  }
  // Replica 0 syncs a context its backward never reached: every replica is told.
  on_every_replica([&](int r) {
    dist_autograd::Context ctx(*w->engines[static_cast<size_t>(2 * r)]);
    if (r == 1) {
      Batch b = MakeBatch(99);
      ASSERT_TRUE(replicas[r].pipe->ForwardBackward(ctx, b.x, b.y, Loss).ok());
    }
    absl::Status s = replicas[r].pipe->AverageGradients(ctx, stage_hosts);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << "replica " << r << ": " << s;
    EXPECT_NE(s.message().find("missing"), std::string::npos) << s;
  });
  // Hosts that do not hold the stage are refused, naming the stage.
  dist_autograd::Context ctx(*w->engines[0]);
  absl::Status wrong = replicas[0].pipe->AverageGradients(ctx, {{1, 3}, {0, 2}});
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument) << wrong;
  EXPECT_NE(wrong.message().find("pipeline stage 0 (on worker2)"), std::string::npos) << wrong;
  EXPECT_EQ(replicas[0].pipe->AverageGradients(ctx, {{2, 0}}).code(), absl::StatusCode::kInvalidArgument);
}

// Training through a pipeline is deterministic: two pipelines of the same stages (same
// seeds) trained on the same batches end with bitwise the same parameters, whatever the
// order in which their micro-batches' forwards and backwards happened to finish, and
// GPipe and 1F1B give the same bits. (One backward pass over all micro-batches used to
// add them in arrival order: the README's pipeline example differed from run to run.)
TEST(PipelineTest, TwoRunsGiveBitIdenticalParametersAndBothSchedulesTheSame) {
  auto w = Start(3);
  rpc::Agent& driver = (*w->job.agents)[0];
  struct Run {
    std::vector<dist_nn::RemoteModule> stages;
    std::unique_ptr<Pipeline> pipe;
    std::unique_ptr<dist_autograd::DistributedOptimizer> opt;
  };
  auto make = [&](Schedule schedule, dist_autograd::Mode mode = dist_autograd::Mode::kSmart) {
    Run run;
    std::vector<rpc::RRef<Tensor>> params;
    for (int s = 0; s < 2; ++s) {
      auto m = dist_nn::RemoteModule::Create(driver, absl::StrCat("worker", s + 1), "wide_stage", int64_t{s},
                                             int64_t{s + 21});
      EXPECT_TRUE(m.ok()) << m.status();
      if (!m.ok()) return run;
      auto p = m->RemoteParameters();
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) return run;
      params.insert(params.end(), p->begin(), p->end());
      run.stages.push_back(*m);
    }
    auto opt = dist_autograd::DistributedOptimizer::Create(driver, kSgd, params);
    EXPECT_TRUE(opt.ok()) << opt.status();
    if (opt.ok()) run.opt = std::move(*opt);
    run.pipe = std::make_unique<Pipeline>(
        run.stages,
        PipelineOptions{.chunks = 16, .schedule = schedule,
                        .backward = {.mode = mode, .timeout = absl::Seconds(20)}});
    return run;
  };
  std::vector<Run> runs;
  runs.push_back(make(Schedule::kGPipe));
  runs.push_back(make(Schedule::kGPipe));
  runs.push_back(make(Schedule::k1F1B));
  runs.push_back(make(Schedule::kGPipe, dist_autograd::Mode::kFast));  // runs as SMART (pipeline.h)
  for (const Run& run : runs) ASSERT_TRUE(run.opt != nullptr && run.stages.size() == 2);
  for (int step = 0; step < 6; ++step) {
    Generator gen(static_cast<uint64_t>(step + 100));
    const int64_t rows = 64;
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < rows; ++i) labels.push_back((i * 7 + step) % kClasses);
    const Tensor x = Tensor::Randn({rows, kIn}, gen);
    const Tensor y = Tensor::FromVector(labels);
    for (Run& run : runs) {
      dist_autograd::Context ctx(*w->engines[0]);
      absl::StatusOr<double> loss = run.pipe->ForwardBackward(ctx, x, y, Loss);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE(run.opt->Step(ctx).ok());
    }
  }
  std::vector<std::vector<std::map<std::string, Tensor>>> got(runs.size());
  for (size_t r = 0; r < runs.size(); ++r) {
    for (const auto& stage : runs[r].stages) {
      auto fetched = stage.FetchParameters();
      ASSERT_TRUE(fetched.ok()) << fetched.status();
      got[r].push_back(*fetched);
    }
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    for (size_t s = 0; s < 2; ++s) {
      ASSERT_EQ(got[r][s].size(), got[0][s].size());
      for (const auto& [name, t] : got[0][s]) {
        const Tensor& other = got[r][s].at(name);
        ASSERT_EQ(other.nbytes(), t.nbytes());
        EXPECT_EQ(std::memcmp(other.raw_data(), t.raw_data(), t.nbytes()), 0)
            << (r == 1 ? "a second GPipe run" : r == 2 ? "the 1F1B run" : "the run asking for FAST mode") << ", stage " << s << " " << name
            << " differs from the first run's (max difference " << kernels::MaxAbsDiff(other, t) << ")";
      }
    }
  }
}

// A stage that records the first row's first value of each micro-batch it gets (its
// output: the input times a parameter of 1).
class Recorder : public nn::Module {
 public:
  Recorder() : nn::Module("Recorder") { w_ = RegisterParameter("w", Tensor::Ones({1}, DType::kFloat64)); }
  Tensor Forward(const Tensor& x) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(kernels::Contiguous(x).ToVector<double>()[0]);
    }
    return x * w_;
  }
  std::vector<double> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  Tensor w_;
  std::mutex mu_;
  std::vector<double> seen_;
};

TEST(PipelineTest, EveryStageReceivesTheMicroBatchesInOrder) {
  struct Kept {
    std::mutex mu;
    std::map<int, std::shared_ptr<Recorder>> by_rank;
  };
  auto kept = std::make_shared<Kept>();
  std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines(3);
  auto* engines_ptr = &engines;
  Job job = Job::Start(3, {}, [kept, engines_ptr](rpc::Agent& agent) -> absl::Status {
    const int rank = agent.self().rank;
    if (absl::Status s = rpc::Assign(dist_autograd::DistAutograd::Install(agent),
                                     (*engines_ptr)[static_cast<size_t>(rank)]);
        !s.ok()) {
      return s;
    }
    return dist_nn::RegisterModuleFactory(agent, "recorder", [kept, rank] {
      auto m = std::make_shared<Recorder>();
      std::lock_guard<std::mutex> lock(kept->mu);
      kept->by_rank[rank] = m;
      return m;
    });
  });
  rpc::Agent& driver = (*job.agents)[0];
  std::vector<dist_nn::RemoteModule> stages;
  for (int s = 1; s <= 2; ++s) {
    auto m = dist_nn::RemoteModule::Create(driver, absl::StrCat("worker", s), "recorder");
    ASSERT_TRUE(m.ok()) << m.status();
    stages.push_back(*m);
  }
  constexpr int64_t kRows = 64, kChunks = 16;
  std::vector<double> rows(kRows * 2);
  for (int64_t i = 0; i < kRows; ++i) rows[static_cast<size_t>(2 * i)] = static_cast<double>(i);
  const Tensor x = Tensor::FromVector(rows, {kRows, 2});
  const Tensor y = Tensor::Zeros({kRows}, DType::kInt64);
  const auto mean = [](const Tensor& out, const Tensor&) { return Mean(out); };
  std::vector<double> want;
  for (bool ordered : {true, false}) {
    for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B}) {
      const Pipeline pipe(stages, PipelineOptions{.chunks = kChunks, .schedule = schedule, .ordered_backward = ordered});
      dist_autograd::Context ctx(*engines[0]);
      absl::StatusOr<double> loss = pipe.ForwardBackward(ctx, x, y, mean);
      ASSERT_TRUE(loss.ok()) << loss.status();
      for (int64_t c = 0; c < kChunks; ++c) want.push_back(static_cast<double>(c * (kRows / kChunks)));
    }
  }
  std::lock_guard<std::mutex> lock(kept->mu);
  for (int rank : {1, 2}) EXPECT_EQ(kept->by_rank.at(rank)->seen(), want) << "the stage on worker" << rank;
}

TEST(PipelineTest, MicroBatchesAreSpansOfTheDriversTrace) {
  auto w = Start(3);
  rpc::Agent& driver = (*w->job.agents)[0];
  auto first = dist_nn::RemoteModule::Create(driver, "worker1", "stage", int64_t{0}, int64_t{5});
  auto second = dist_nn::RemoteModule::Create(driver, "worker2", "stage", int64_t{1}, int64_t{6});
  ASSERT_TRUE(first.ok() && second.ok());
  char dir[] = "/tmp/gw-pipeline-trace-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::unique_ptr<rpc::Tracer> tracer = rpc::Tracer::Open(dir, "driver", 0);
  std::string context;
  for (bool ordered : {true, false}) {
    const Pipeline pipe({*first, *second},
                        PipelineOptions{.chunks = 4, .ordered_backward = ordered, .tracer = tracer.get()});
    dist_autograd::Context ctx(*w->engines[0]);
    if (ordered) context = ctx.id().ToString();
    Batch b = MakeBatch(0);
    ASSERT_TRUE(pipe.ForwardBackward(ctx, b.x, b.y, Loss).ok());
  }
  ASSERT_TRUE(tracer->Close().ok());
  std::ifstream in(std::string(dir) + "/driver.trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(trace.is_discarded());
  // The ordered run (the first): each micro-batch's forward, 2 rows, in the step's
  // context, ends before its backward pass begins. The other: one pass over all four.
  std::map<std::string, double> forward_end, backward_begin;
  std::map<std::string, std::string> forward_of;  // async id -> name
  int all_four = 0;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.value("cat", "") != "pipeline") continue;
    const std::string name = e.at("name");
    // The file holds the spans in the order they were spilled, not in time: the ordered
    // run's are told apart by their context.
    if (e.at("ph") == "b") {
      EXPECT_EQ(e.at("args").at("rows"), 2) << name;
      if (e.at("args").at("context") == context) forward_of[e.at("id")] = name;
    } else if (e.at("ph") == "e") {
      if (forward_of.contains(e.at("id"))) forward_end[forward_of.at(e.at("id"))] = e.at("ts");
    } else if (e.at("ph") == "X" && name == "4 micro-batches' backward") {
      ++all_four;
    } else if (e.at("ph") == "X") {
      EXPECT_EQ(e.at("args").at("context"), context) << name;
      backward_begin[name] = e.at("ts");
    }
  }
  EXPECT_EQ(all_four, 1);
  for (int m = 0; m < 4; ++m) {
    const std::string forward = absl::StrCat("micro-batch ", m, " forward"),
                      backward = absl::StrCat("micro-batch ", m, " backward");
    ASSERT_TRUE(forward_end.contains(forward)) << forward;
    ASSERT_TRUE(backward_begin.contains(backward)) << backward;
    EXPECT_LE(forward_end[forward], backward_begin[backward]) << m;
  }
}

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
