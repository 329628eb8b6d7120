// Benchmarks W6 `param_server_dense` and W7 `sparse_embedding_ps` of
// BENCHMARKS.md for gradwire. One parameter server (rank 0, a child process),
// two trainers (this process is trainer 0, rank 1; a child is trainer 1, rank 2).
//
//   ps_bench [--quick] [dense|sparse|checkpoint]
//
// dense (W6): the server holds an MLP 784-512-512-10 as dense tables (one per parameter,
// all exchanged in one message per step); each step a trainer computes gradients on a
// batch of 64 and pushes them, and the server applies SGD (lr 0.01) once per step with
// both trainers' gradients (synchronous) and answers the pull of the next step with the
// new parameters. As in the PyTorch script, the gradients are taken with respect to the
// received parameter tensors themselves (autograd::Grad through gw::Linear), without
// copying them into a module.
// sparse (W7): the server holds a sparse table of 1,000,000 ids x 64 float32 (rows
// created on first touch, N(0, 1) from seed 0; trainer 0 touches every row before the
// timed steps, so the table exists as PyTorch's does), sparse SGD lr 0.01, asynchronous. Each
// step a trainer pulls 4096 ids uniform in [0, 1e6) (its own generator) and pushes a
// gradient for them, the push overlapping the next step's pull (at most one in flight),
// as the PyTorch script does. rows_per_s_sum = 2 trainers * steps * 4096 * 2 / wall, the
// wall time from the common start to the last trainer's last acknowledged push. The
// server reports its rows and memory (bytes / raw row bytes) on stderr.
// checkpoint (issue 28): W6 for 2,000 timed steps with no checkpoints and with trainer 0
// cutting a checkpoint every second (the server writing versions into a fresh directory
// under /tmp), alternately, three times each: the medians of steps/s of both, their
// ratio, and the server's last checkpoint: the copy that stalls training, the background
// write and the file's size.
#include <cstdlib>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
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
  // GRADWIRE_TRANSPORT picks the transport, as for a launched job (the TLS comparison in
  // BENCHMARKS.md runs tcp; TLS itself comes from GRADWIRE_TLS_*, as Agent::Start reads it).
  if (const char* t = std::getenv("GRADWIRE_TRANSPORT")) o.transport = t;
  return o;
}

void Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "param_server_dense: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

constexpr int64_t kIds = 4096, kDim = 64, kRows = 1000000;

int Serve(int port) {
  std::shared_ptr<ps::ParameterServer> server;
  ps::ServerOptions options;
  if (const char* dir = std::getenv("GW_BENCH_CHECKPOINT_DIR")) options.checkpoint_dir = dir;
  auto agent =
      gw::rpc::Agent::Start(Options(0, port), [&](gw::rpc::Agent& a) { server = *ps::ParameterServer::Install(a, options); });
  if (!agent.ok()) Fail("server start", agent.status());
  const bool ok = (*agent)->Shutdown().ok();
  if (!options.checkpoint_dir.empty()) {
    const ps::CheckpointStats c = server->checkpoint_stats();
    // One line the driver reads (the store is gone by now): versions written, failed, the
    // last copy and write in ms, the last file's bytes.
    std::printf("checkpoints %lld %lld %.3f %.3f %lld\n", static_cast<long long>(c.written),
                static_cast<long long>(c.failed), absl::ToDoubleMilliseconds(c.last_copy),
                absl::ToDoubleMilliseconds(c.last_write), static_cast<long long>(c.last_bytes));
    std::fflush(stdout);
  }
  if (absl::StatusOr<ps::SparseShardStats> s = server->sparse_stats("emb"); s.ok()) {
    std::fprintf(stderr, "sparse_embedding_ps: server holds %lld rows in %.1f MB, %.3fx the raw row bytes\n",
                 static_cast<long long>(s->rows), static_cast<double>(s->bytes) / 1e6,
                 static_cast<double>(s->bytes) / static_cast<double>(s->raw_bytes));
  }
  return ok ? 0 : 1;
}

// W7 as trainer `trainer`: returns (start, end) wall-clock seconds of the timed steps.
std::pair<double, double> TrainSparse(gw::rpc::Agent& agent, int trainer, int warmup, int steps) {
  ps::Client client(agent, {"worker0"}, trainer, 2);
  const ps::SparseOptions options{ps::RowInit{ps::RowInit::Kind::kNormal, 0, 1, 0}};
  if (absl::Status s = client.CreateSparse("emb", kDim, options, gw::optim::Sgd{.lr = 0.01}, ps::Consistency::kAsync);
      !s.ok()) {
    Fail("create", s);
  }
  if (trainer == 0) {
    // The table exists before the timed steps, as PyTorch's does: touch every row once
    // (rows are created on first touch), 4096 ids at a time.
    for (int64_t first = 0; first < kRows; first += kIds) {
      const gw::Tensor ids = gw::Tensor::Arange(static_cast<double>(first), static_cast<double>(std::min(first + kIds, kRows)));
      if (absl::StatusOr<gw::Tensor> rows = client.PullRows("emb", 0, ids).Get(); !rows.ok()) Fail("preload", rows.status());
    }
  }
  gw::Generator gen(static_cast<uint64_t>(1 + trainer));
  const gw::Tensor grad = gw::Tensor::Randn({kIds, kDim}, gen);
  gw::Future<bool> pushed = gw::MakeReadyFuture<bool>(agent.executor(), true);
  double start = 0, pull_s = 0, push_wait_s = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      if (!pushed.Get().ok()) Fail("push", pushed.Get().status());
      // Both trainers start the timed steps together.
      (void)agent.store().Set("w7/ready/" + std::to_string(trainer), "1");
      if (absl::Status s = agent.store().Wait({"w7/ready/0", "w7/ready/1"}, absl::Seconds(60)); !s.ok()) Fail("barrier", s);
      start = absl::ToUnixMicros(absl::Now()) / 1e6;
    }
    gw::Tensor ids = gw::Tensor::Empty({kIds}, gw::DType::kInt64);
    for (int64_t i = 0; i < kIds; ++i) ids.data<int64_t>()[i] = static_cast<int64_t>(gen.NextBelow(kRows));
    const double t0 = gw::bench::NowSeconds();
    absl::StatusOr<gw::Tensor> rows = client.PullRows("emb", step, ids).Get();
    if (!rows.ok()) Fail("pull", rows.status());
    const double t1 = gw::bench::NowSeconds();
    if (absl::StatusOr<bool> p = pushed.Get(); !p.ok()) Fail("push", p.status());
    if (step >= warmup) {
      pull_s += t1 - t0;
      push_wait_s += gw::bench::NowSeconds() - t1;
    }
    pushed = client.PushRows("emb", step, ids, grad);
  }
  if (absl::StatusOr<bool> p = pushed.Get(); !p.ok()) Fail("push", p.status());
  std::fprintf(stderr, "sparse_embedding_ps: trainer %d: pull %.3f ms, waiting for the previous push %.3f ms per step\n",
               trainer, 1e3 * pull_s / steps, 1e3 * push_wait_s / steps);
  return {start, absl::ToUnixMicros(absl::Now()) / 1e6};
}

// Gradients of the cross-entropy loss of the MLP with parameters `params` (w1, b1, w2, b2,
// w3, b3) on the batch (x, y), taken with respect to those tensors as received.
std::vector<gw::Tensor> Gradients(const std::vector<gw::Tensor>& params, const gw::Tensor& x, const gw::Tensor& y) {
  std::vector<gw::Tensor> leaves;
  for (const gw::Tensor& p : params) leaves.push_back(p.detach().set_requires_grad(true));
  gw::Tensor h = x;
  for (size_t i = 0; i < leaves.size(); i += 2) {
    h = gw::Linear(h, leaves[i], leaves[i + 1]);
    if (i + 2 < leaves.size()) h = gw::Relu(h);
  }
  return gw::autograd::Grad({gw::nn::CrossEntropyLoss(h, y)}, leaves);
}

// Runs warm-up + timed steps as trainer `trainer`; returns the timed steps' wall seconds
// and the parameter bytes of the model.
// The timed steps' durations of the last Train in this process (ms), for the checkpoint
// comparison's percentiles.
std::vector<double> g_step_ms;

std::pair<double, int64_t> Train(int port, int trainer, int warmup, int steps,
                                 absl::Duration checkpoint_every = absl::ZeroDuration()) {
  g_step_ms.clear();
  auto agent = gw::rpc::Agent::Start(Options(1 + trainer, port));
  if (!agent.ok()) Fail("trainer start", agent.status());
  ps::Client client(**agent, {"worker0"}, trainer, 2, ps::ClientOptions{.checkpoint_every = checkpoint_every});
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
  double t0 = 0, compute_s = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) t0 = gw::bench::NowSeconds();
    const double c0 = gw::bench::NowSeconds();
    const std::vector<gw::Tensor> grads = Gradients(values, x, y);
    if (step >= warmup) compute_s += gw::bench::NowSeconds() - c0;
    // This step's gradients out, the parameters the server computed from both trainers'
    // gradients back: one message each way.
    absl::StatusOr<std::vector<gw::Tensor>> next = client.PushPullMany(names, step, grads).Get();
    if (!next.ok()) Fail("push/pull", next.status());
    values = *std::move(next);
    if (step >= warmup) g_step_ms.push_back(1e3 * (gw::bench::NowSeconds() - c0));
  }
  const double secs = gw::bench::NowSeconds() - t0;
  // For the profile: the trainer's own forward/backward, with the other trainer and the
  // server sharing the machine's cores.
  std::fprintf(stderr, "param_server_dense: trainer %d: forward/backward %.3f ms of %.3f ms per step\n", trainer,
               1e3 * compute_s / steps, 1e3 * secs / steps);
  if (absl::Status s = (*agent)->Shutdown(); !s.ok()) Fail("shutdown", s);
  return {secs, bytes};
}

}  // namespace

// The q-quantile of `v` (sorted copy).
double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// One W6 run with fresh processes: steps/s summed over both trainers, and the server's
// "checkpoints ..." line (empty without `checkpoint_dir`); trainer 0's step times in
// g_step_ms.
std::pair<double, std::string> DenseRun(int warmup, int steps, const std::string& checkpoint_dir) {
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok()) Fail("port", port.status());
  std::vector<std::pair<std::string, std::string>> env = {{"GW_BENCH_PORT", std::to_string(*port)},
                                                          {"GW_BENCH_WORKLOAD", "dense"},
                                                          {"GW_BENCH_STEPS", std::to_string(steps)}};
  if (!checkpoint_dir.empty()) env.emplace_back("GW_BENCH_CHECKPOINT_DIR", checkpoint_dir);
  env.emplace_back("GW_BENCH_ROLE", "server");
  int out[2];
  if (::pipe(out) != 0) Fail("pipe", absl::ErrnoToStatus(errno, "pipe"));
  const int saved = ::dup(1);
  ::dup2(out[1], 1);  // the server's stdout: its checkpoint line
  const pid_t server = gw::bench::SpawnSelf(env);
  ::dup2(saved, 1);
  ::close(saved);
  ::close(out[1]);
  env.back().second = "trainer";
  const pid_t other = gw::bench::SpawnSelf(env);
  auto [secs, bytes] =
      Train(*port, 0, warmup, steps, checkpoint_dir.empty() ? absl::ZeroDuration() : absl::Seconds(1));
  int status = 0;
  for (pid_t child : {server, other}) {
    ::waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail("child", absl::InternalError("a child process failed"));
  }
  std::string line;
  char buf[256];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) line.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  return {2.0 * steps / secs, line};
}

int CheckpointCost(bool quick) {
  const int warmup = 5, steps = quick ? 300 : 2000;
  std::fprintf(stderr, "param_server_checkpoint: W6, %d timed steps, no checkpoints vs one a second, 3 runs each\n",
               steps);
  std::vector<double> none, every, p99_none, p99_every, max_none, max_every;
  std::string last;
  for (int round = 0; round < 3; ++round) {
    none.push_back(DenseRun(warmup, steps, "").first);
    p99_none.push_back(Quantile(g_step_ms, 0.99));
    max_none.push_back(Quantile(g_step_ms, 1.0));
    char dir_template[] = "/tmp/gw_bench_ckpt_XXXXXX";
    if (::mkdtemp(dir_template) == nullptr) Fail("mkdtemp", absl::ErrnoToStatus(errno, "mkdtemp"));
    auto [rate, line] = DenseRun(warmup, steps, dir_template);
    std::error_code ec;
    std::filesystem::remove_all(dir_template, ec);
    every.push_back(rate);
    p99_every.push_back(Quantile(g_step_ms, 0.99));
    max_every.push_back(Quantile(g_step_ms, 1.0));
    last = line;
    std::fprintf(stderr, "param_server_checkpoint: round %d: %.1f steps/s without, %.1f with (server: %s)\n", round,
                 none.back(), every.back(), line.empty() ? "no line" : line.substr(0, line.size() - 1).c_str());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  gw::bench::Report("param_server_checkpoint", "steps_per_s_none", median(none), "steps/s");
  gw::bench::Report("param_server_checkpoint", "steps_per_s_every_1s", median(every), "steps/s");
  gw::bench::Report("param_server_checkpoint", "steps_ratio", median(every) / median(none), "fraction");
  // Trainer 0's step times: a cut's stall (its plan, registration and the copy) would
  // show in the slowest steps.
  gw::bench::Report("param_server_checkpoint", "step_ms_p99_none", median(p99_none), "ms");
  gw::bench::Report("param_server_checkpoint", "step_ms_p99_every_1s", median(p99_every), "ms");
  gw::bench::Report("param_server_checkpoint", "step_ms_max_none", median(max_none), "ms");
  gw::bench::Report("param_server_checkpoint", "step_ms_max_every_1s", median(max_every), "ms");
  long long written = 0, failed = 0, bytes = 0;
  double copy_ms = 0, write_ms = 0;
  if (std::sscanf(last.c_str(), "checkpoints %lld %lld %lf %lf %lld", &written, &failed, &copy_ms, &write_ms, &bytes) ==
      5) {
    gw::bench::Report("param_server_checkpoint", "versions_written", static_cast<double>(written), "versions");
    gw::bench::Report("param_server_checkpoint", "copy_ms", copy_ms, "ms");
    gw::bench::Report("param_server_checkpoint", "write_ms", write_ms, "ms");
    gw::bench::Report("param_server_checkpoint", "file_mb", static_cast<double>(bytes) / 1e6, "MB");
  }
  return 0;
}

int main(int argc, char** argv) {
  bool quick = false, sparse = false, checkpoint = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "sparse") == 0) {
      sparse = true;
    } else if (std::strcmp(argv[i], "checkpoint") == 0) {
      checkpoint = true;
    } else if (std::strcmp(argv[i], "dense") != 0) {
      std::fprintf(stderr, "usage: ps_bench [--quick] [dense|sparse|checkpoint]\n");
      return 2;
    }
  }
  // Children get the parent's choices through the environment.
  if (const char* w = std::getenv("GW_BENCH_WORKLOAD")) sparse = std::strcmp(w, "sparse") == 0;
  if (std::getenv("GW_BENCH_QUICK")) quick = true;
  int warmup = quick ? 2 : 5, steps = sparse ? (quick ? 20 : 200) : (quick ? 10 : 100);
  if (const char* n = std::getenv("GW_BENCH_STEPS")) {
    if (!absl::SimpleAtoi(n, &steps)) return 2;
    warmup = 5;
  }
  if (checkpoint && std::getenv("GW_BENCH_ROLE") == nullptr) return CheckpointCost(quick);
  if (const char* role = std::getenv("GW_BENCH_ROLE")) {
    int port = 0;
    if (!absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port)) return 2;
    if (std::strcmp(role, "server") == 0) return Serve(port);
    if (!sparse) {
      Train(port, 1, warmup, steps);
      return 0;
    }
    auto agent = gw::rpc::Agent::Start(Options(2, port));
    if (!agent.ok()) Fail("trainer start", agent.status());
    auto [start, end] = TrainSparse(**agent, 1, warmup, steps);
    (void)(*agent)->store().Set("w7/end/1", std::to_string(end));
    (void)(*agent)->store().Set("w7/start/1", std::to_string(start));
    return (*agent)->Shutdown().ok() ? 0 : 1;
  }
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok()) Fail("port", port.status());
  const std::string p = std::to_string(*port);
  std::vector<std::pair<std::string, std::string>> env = {{"GW_BENCH_PORT", p},
                                                          {"GW_BENCH_WORKLOAD", sparse ? "sparse" : "dense"}};
  if (quick) env.emplace_back("GW_BENCH_QUICK", "1");
  env.emplace_back("GW_BENCH_ROLE", "server");
  const pid_t server = gw::bench::SpawnSelf(env);
  env.back().second = "trainer";
  const pid_t other = gw::bench::SpawnSelf(env);
  if (sparse) {
    std::fprintf(stderr, "sparse_embedding_ps: gradwire, 1 server + 2 trainers, %d warm-up + %d timed steps each\n",
                 warmup, steps);
    auto agent = gw::rpc::Agent::Start(Options(1, *port));
    if (!agent.ok()) Fail("trainer start", agent.status());
    auto [start, end] = TrainSparse(**agent, 0, warmup, steps);
    absl::StatusOr<std::string> end1 = (*agent)->store().Get("w7/end/1", absl::Seconds(120));
    absl::StatusOr<std::string> start1 = (*agent)->store().Get("w7/start/1", absl::Seconds(10));
    double e1 = 0, s1 = 0;
    if (!end1.ok() || !start1.ok() || !absl::SimpleAtod(*end1, &e1) || !absl::SimpleAtod(*start1, &s1)) {
      Fail("trainer 1's times", end1.ok() ? start1.status() : end1.status());
    }
    const double wall = std::max(end, e1) - std::min(start, s1);
    gw::bench::Report("sparse_embedding_ps", "rows_per_s_sum", 2.0 * steps * kIds * 2 / wall, "rows/s");
    gw::bench::Report("sparse_embedding_ps", "step_ms_mean", 1e3 * (end - start) / steps, "ms");
    if (absl::Status s = (*agent)->Shutdown(); !s.ok()) Fail("shutdown", s);
  } else {
    std::fprintf(stderr, "param_server_dense: gradwire, 1 server + 2 trainers, %d warm-up + %d timed steps each\n",
                 warmup, steps);
    auto [secs, bytes] = Train(*port, 0, warmup, steps);
    const double steps_sum = 2.0 * steps / secs;  // synchronous: both trainers advance together
    gw::bench::Report("param_server_dense", "steps_per_s_sum", steps_sum, "steps/s");
    gw::bench::Report("param_server_dense", "param_bytes_per_s", 2.0 * static_cast<double>(bytes) * steps_sum / 1e6, "MB/s");
    gw::bench::Report("param_server_dense", "step_ms_mean", 1e3 * secs / steps, "ms");
  }
  int status = 0, ok = 1;
  for (pid_t child : {server, other}) {
    ::waitpid(child, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok ? 0 : 1;
}
