// Benchmark W5 `model_parallel_mlp` of BENCHMARKS.md for gradwire: worker 0
// (this process) holds Linear(1024,1024)+ReLU+Linear(1024,1024)+ReLU, worker 1 (a copy of
// this program started with GW_BENCH_ROLE=server) holds Linear(1024,1024)+ReLU+
// Linear(1024,10) as a RemoteModule; batch 128, cross-entropy on worker 0. One iteration
// = a distributed-autograd context, forward, backward, DistributedOptimizer(SGD lr 0.01)
// step. Also the same model in one process (the floor), and the difference.
//
//   model_parallel_bench [--quick]
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "bench_util.h"
#include "gradwire/gradwire.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"

namespace {

constexpr int64_t kBatch = 128, kWidth = 1024, kClasses = 10;

std::shared_ptr<gw::nn::Module> Stage(bool first, uint64_t seed) {
  gw::Generator gen(seed);
  std::vector<std::shared_ptr<gw::nn::Module>> layers{std::make_shared<gw::nn::Linear>(kWidth, kWidth, gen),
                                                      std::make_shared<gw::nn::ReLU>()};
  layers.push_back(std::make_shared<gw::nn::Linear>(kWidth, first ? kWidth : kClasses, gen));
  if (first) layers.push_back(std::make_shared<gw::nn::ReLU>());
  return std::make_shared<gw::nn::Sequential>(layers);
}

gw::rpc::AgentOptions Options(int rank, int port) {
  gw::rpc::AgentOptions o;
  o.rank = rank;
  o.world_size = 2;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.start_timeout = absl::Seconds(60);
  o.default_timeout = absl::Seconds(120);
  return o;
}

absl::Status Setup(gw::rpc::Agent& a, std::shared_ptr<gw::dist_autograd::DistAutograd>* engine) {
  if (absl::Status s = gw::rpc::Assign(gw::dist_autograd::DistAutograd::Install(a), *engine); !s.ok()) return s;
  return gw::dist_nn::RegisterModuleFactory(a, "stage2", [] { return Stage(false, 2); });
}

int Server(int port) {
  std::shared_ptr<gw::dist_autograd::DistAutograd> engine;
  auto agent = gw::rpc::Agent::Start(Options(1, port), [&](gw::rpc::Agent& a) { return Setup(a, &engine); });
  if (!agent.ok()) return 1;
  return (*agent)->Shutdown().ok() ? 0 : 1;
}

void Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "model_parallel_mlp: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_BENCH_ROLE")) {
    int port = 0;
    if (std::strcmp(role, "server") != 0 || !absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port)) return 2;
    return Server(port);
  }
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int warmup = quick ? 2 : 5, iters = quick ? 5 : 50;
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok()) Fail("port", port.status());
  const pid_t child = gw::bench::SpawnSelf({{"GW_BENCH_ROLE", "server"}, {"GW_BENCH_PORT", std::to_string(*port)}});

  std::shared_ptr<gw::dist_autograd::DistAutograd> engine;
  auto agent = gw::rpc::Agent::Start(Options(0, *port), [&](gw::rpc::Agent& a) { return Setup(a, &engine); });
  if (!agent.ok()) Fail("start", agent.status());
  gw::rpc::Agent& w0 = **agent;

  gw::Generator gen(0);
  const gw::Tensor x = gw::Tensor::Randn({kBatch, kWidth}, gen);
  std::vector<int64_t> labels(kBatch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.NextBelow(kClasses));
  const gw::Tensor y = gw::Tensor::FromVector<int64_t>(labels);

  double dist_median = 0, local_median = 0;
  {
    auto stage1 = Stage(true, 1);
    absl::StatusOr<gw::dist_nn::RemoteModule> stage2 = gw::dist_nn::RemoteModule::Create(w0, "worker1", "stage2");
    if (!stage2.ok()) Fail("remote module", stage2.status());
    std::vector<gw::rpc::RRef<gw::Tensor>> params;
    for (const gw::Tensor& p : stage1->Parameters()) params.push_back(w0.Own(p));
    absl::StatusOr<std::vector<gw::rpc::RRef<gw::Tensor>>> remote = stage2->RemoteParameters();
    if (!remote.ok()) Fail("remote parameters", remote.status());
    params.insert(params.end(), remote->begin(), remote->end());
    auto opt = gw::dist_autograd::DistributedOptimizer::Create(w0, gw::optim::Sgd{.lr = 0.01}, params);
    if (!opt.ok()) Fail("optimizer", opt.status());

    std::fprintf(stderr, "model_parallel_mlp: gradwire, %d warm-up + %d timed iterations (SMART mode)\n", warmup,
                 iters);
    double last_loss = 0;
    const std::vector<double> ms = gw::bench::TimeMs(warmup, iters, [&] {
      gw::dist_autograd::Context ctx(*engine);
      absl::StatusOr<gw::Tensor> logits = stage2->Forward(stage1->Forward(x));
      if (!logits.ok()) Fail("forward", logits.status());
      gw::Tensor loss = gw::nn::CrossEntropyLoss(*logits, y);
      if (absl::Status s = ctx.Backward({loss}); !s.ok()) Fail("backward", s);
      if (absl::Status s = (*opt)->Step(ctx); !s.ok()) Fail("step", s);
      last_loss = loss.item();
    });
    dist_median = gw::bench::Quantile(ms, 0.5);
    gw::bench::Report("model_parallel_mlp", "dist_ms_per_iter_median", dist_median, "ms");
    gw::bench::Report("model_parallel_mlp", "dist_ms_per_iter_p90", gw::bench::Quantile(ms, 0.9), "ms");
    std::fprintf(stderr, "model_parallel_mlp: distributed loss after %d steps %.4f\n", warmup + iters, last_loss);
  }
  {
    // The same 4-layer model in one process.
    auto s1 = Stage(true, 1), s2 = Stage(false, 2);
    auto model = std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{s1, s2});
    gw::optim::Optimizer opt(model->Parameters(), gw::optim::Sgd{.lr = 0.01});
    const std::vector<double> ms = gw::bench::TimeMs(warmup, iters, [&] {
      opt.ZeroGrad();
      gw::Tensor loss = gw::nn::CrossEntropyLoss(model->Forward(x), y);
      gw::autograd::Backward({loss});
      opt.Step();
    });
    local_median = gw::bench::Quantile(ms, 0.5);
    gw::bench::Report("model_parallel_mlp", "local_ms_per_iter_median", local_median, "ms");
  }
  gw::bench::Report("model_parallel_mlp", "dist_overhead_ms", dist_median - local_median, "ms");
  const bool ok = w0.Shutdown().ok();
  int status = 0;
  ::waitpid(child, &status, 0);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
