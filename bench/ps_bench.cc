// Benchmark W6 `param_server_dense` of ../shared/BENCHMARKS.md for gradwire: one
// parameter server (rank 0, a child process) holds an MLP 784-512-512-10 as dense tables
// (one per parameter, all exchanged in one message per step); two trainers (this process is trainer 0, rank 1; a child is
// trainer 1, rank 2) each step compute gradients on a batch of 64 and push them, and the
// server applies SGD (lr 0.01) once per step with both trainers' gradients (synchronous)
// and answers the pull of the next step with the new parameters.
//
//   ps_bench [--quick]
#include <sys/wait.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "bench_util.h"
#include "gradwire/gradwire.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"

namespace {

namespace ps = gw::param_server;

gw::rpc::AgentOptions Options(int rank, int port) {
  gw::rpc::AgentOptions o;
  o.rank = rank;
  o.world_size = 3;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.host_store = rank == 0;
  o.start_timeout = absl::Seconds(60);
  o.shutdown_timeout = absl::Seconds(300);
  return o;
}

void Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "param_server_dense: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

int Serve(int port) {
  std::shared_ptr<ps::ParameterServer> server;
  auto agent = gw::rpc::Agent::Start(Options(0, port), [&](gw::rpc::Agent& a) { server = *ps::ParameterServer::Install(a); });
  if (!agent.ok()) Fail("server start", agent.status());
  return (*agent)->Shutdown().ok() ? 0 : 1;
}

// Runs warm-up + timed steps as trainer `trainer`; returns the timed steps' wall seconds
// and the parameter bytes of the model.
std::pair<double, int64_t> Train(int port, int trainer, int warmup, int steps) {
  auto agent = gw::rpc::Agent::Start(Options(1 + trainer, port));
  if (!agent.ok()) Fail("trainer start", agent.status());
  ps::Client client(**agent, {"worker0"}, trainer, 2);
  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{
      std::make_shared<gw::nn::Linear>(784, 512, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(512, 512, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(512, 10, gen)});
  const gw::nn::NamedTensors params = model->NamedParameters();
  int64_t bytes = 0;
  for (const auto& [name, p] : params) {
    bytes += p.nbytes();
    if (absl::Status s = client.CreateDense(name, p, gw::optim::Sgd{.lr = 0.01}, ps::Consistency::kSync); !s.ok()) {
      Fail("create", s);
    }
  }
  gw::Generator data(static_cast<uint64_t>(10 + trainer));
  const gw::Tensor x = gw::Tensor::Randn({64, 784}, data);
  std::vector<int64_t> labels(64);
  for (auto& l : labels) l = static_cast<int64_t>(data.NextBelow(10));
  const gw::Tensor y = gw::Tensor::FromVector<int64_t>(labels);

  std::vector<std::string> names;
  for (const auto& [name, p] : params) names.push_back(name);
  std::vector<gw::Future<gw::Tensor>> first;
  for (const auto& name : names) first.push_back(client.Pull(name, 0));
  std::vector<gw::Tensor> values;
  for (auto& f : first) {
    absl::StatusOr<gw::Tensor> v = f.Get();
    if (!v.ok()) Fail("pull", v.status());
    values.push_back(*v);
  }
  double t0 = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) t0 = gw::bench::NowSeconds();
    for (size_t i = 0; i < params.size(); ++i) gw::kernels::CopyInPlace(params[i].second, values[i]);
    model->ZeroGrad();
    gw::autograd::Backward({gw::nn::CrossEntropyLoss(model->Forward(x), y)});
    // This step's gradients out, the parameters the server computed from both trainers'
    // gradients back: one message each way.
    std::vector<gw::Tensor> grads;
    for (const auto& [name, p] : params) grads.push_back(p.grad());
    absl::StatusOr<std::vector<gw::Tensor>> next = client.PushPullMany(names, step, grads).Get();
    if (!next.ok()) Fail("push/pull", next.status());
    values = *std::move(next);
  }
  const double secs = gw::bench::NowSeconds() - t0;
  if (absl::Status s = (*agent)->Shutdown(); !s.ok()) Fail("shutdown", s);
  return {secs, bytes};
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int warmup = quick ? 2 : 5, steps = quick ? 10 : 100;
  if (const char* role = std::getenv("GW_BENCH_ROLE")) {
    int port = 0;
    if (!absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port)) return 2;
    if (std::strcmp(role, "server") == 0) return Serve(port);
    Train(port, 1, warmup, steps);
    return 0;
  }
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok()) Fail("port", port.status());
  const std::string p = std::to_string(*port);
  const pid_t server = gw::bench::SpawnSelf({{"GW_BENCH_ROLE", "server"}, {"GW_BENCH_PORT", p}});
  const pid_t other = gw::bench::SpawnSelf({{"GW_BENCH_ROLE", "trainer"}, {"GW_BENCH_PORT", p}});
  std::fprintf(stderr, "param_server_dense: gradwire, 1 server + 2 trainers, %d warm-up + %d timed steps each\n",
               warmup, steps);
  auto [secs, bytes] = Train(*port, 0, warmup, steps);
  const double steps_sum = 2.0 * steps / secs;  // synchronous: both trainers advance together
  gw::bench::Report("param_server_dense", "steps_per_s_sum", steps_sum, "steps/s");
  gw::bench::Report("param_server_dense", "param_bytes_per_s", 2.0 * static_cast<double>(bytes) * steps_sum / 1e6, "MB/s");
  gw::bench::Report("param_server_dense", "step_ms_mean", 1e3 * secs / steps, "ms");
  int status = 0, ok = 1;
  for (pid_t child : {server, other}) {
    ::waitpid(child, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok ? 0 : 1;
}
