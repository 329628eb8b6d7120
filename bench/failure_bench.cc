// Benchmark W14 `failure_detection` of BENCHMARKS.md for gradwire: a parameter-server job
// whose server is frozen mid-run, then restarted from its checkpoint.
//
//   failure_bench [--quick]
//
// Five processes (this program re-run in roles): rank 0 drives and hosts the rendezvous
// store; ranks 1 and 2 ("worker1", "worker2") are parameter servers holding one dense
// table of 1M floats (W6's order of size) in shards, synchronous SGD, checkpoints every
// 0.5 s; ranks 3 and 4 are trainers pulling and pushing it every step (a client with
// reconnection, as the README's main job runs). Once both trainers took 20 steps (and
// trainer 0 asked for a checkpoint, so that one holds the table) the driver freezes
// worker2 (SIGSTOP): each trainer's agent reports worker2 dead (the
// heartbeats; its pending pull fails UNAVAILABLE naming it and the client starts
// retrying), and frozen_reported_s is the latest trainer's report after the freeze. The
// driver then kills the frozen process and starts worker2 again (same rank, same
// checkpoint directory): resumed_after_restart_s is from that start until both trainers
// completed a step again. Default heartbeats (500 ms interval, 2.5 s peer timeout).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "bench_util.h"
#include "gradwire/gradwire.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"

namespace {

namespace ps = gw::param_server;

constexpr int kWorld = 5;
constexpr int64_t kFloats = 1 << 20;
constexpr int64_t kSteps = 200;  // synchronous: both trainers end at the same step
const std::vector<std::string> kServers = {"worker1", "worker2"};

// The servers' checkpoint directory, removed when the driver exits, Fail()'s std::exit
// included (a static's destructor runs then; only the driver's pid removes it).
struct CheckpointDir {
  std::string path;
  pid_t maker = ::getpid();
  ~CheckpointDir() {
    std::error_code ignored;
    if (!path.empty() && ::getpid() == maker) std::filesystem::remove_all(path, ignored);
  }
};
CheckpointDir g_checkpoint_dir;

[[noreturn]] void Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "failure_detection: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

gw::rpc::AgentOptions Options(int rank, int port) {
  gw::rpc::AgentOptions o;
  o.rank = rank;
  o.world_size = kWorld;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.host_store = rank == 0;
  o.start_timeout = absl::Seconds(60);
  o.shutdown_timeout = absl::Seconds(120);
  return o;
}

double UnixSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

int Serve(int rank, int port, const std::string& dir) {
  std::shared_ptr<ps::ParameterServer> server;
  auto agent = gw::rpc::Agent::Start(Options(rank, port), [&](gw::rpc::Agent& a) -> absl::Status {
    auto s = ps::ParameterServer::Install(a, ps::ServerOptions{.checkpoint_dir = dir});
    if (!s.ok()) return s.status();
    server = *s;
    return absl::OkStatus();
  });
  if (!agent.ok()) Fail("server start", agent.status());
  return (*agent)->Shutdown().ok() ? 0 : 1;
}

int Train(int rank, int port) {
  auto agent = gw::rpc::Agent::Start(Options(rank, port));
  if (!agent.ok()) Fail("trainer start", agent.status());
  gw::rpc::Agent& a = **agent;
  const int trainer = rank - 3;
  // Trainer 0 cuts a checkpoint every 500 ms (one version: every table at one step).
  ps::Client client(a, kServers, trainer, 2,
                    ps::ClientOptions{.reconnect_timeout = absl::Seconds(120),
                                      .checkpoint_every = trainer == 0 ? absl::Milliseconds(500) : absl::ZeroDuration()});
  if (absl::Status s = client.CreateDense("w", gw::Tensor::Zeros({kFloats}), gw::optim::Sgd{.lr = 0.01},
                                          ps::Consistency::kSync);
      !s.ok()) {
    Fail("create", s);
  }
  // worker2's death, as this agent learns it (from its transport thread: just note it).
  std::atomic<double> reported{0};
  absl::Notification died;
  gw::rpc::Agent::PeerWatch watch = a.WatchPeers([&](int dead) {
    double none = 0;
    if (dead == 2 && reported.compare_exchange_strong(none, UnixSeconds())) died.Notify();
  });
  // The steps block while worker2 is down: another thread passes the report on.
  std::thread reporter([&] {
    if (died.WaitForNotificationWithTimeout(absl::Minutes(10)) && reported.load() > 0) {
      (void)a.store().Set(absl::StrCat("w14/reported/", rank), absl::StrFormat("%.6f", reported.load()));
    }
  });
  const gw::Tensor grad = gw::Tensor::Full({kFloats}, 0.001);
  bool resumed = false;
  for (int64_t clock = 0; clock < kSteps; ++clock) {
    if (absl::StatusOr<gw::Tensor> p = client.PushPull("w", clock, grad).Get(); !p.ok()) Fail("step", p.status());
    if (clock == 20) {
      // The periodic checkpoints may not have caught the table yet: one now.
      if (trainer == 0) {
        if (auto paths = client.Checkpoint().Get(); !paths.ok()) Fail("checkpoint", paths.status());
      }
      (void)a.store().Set(absl::StrCat("w14/started/", rank), "1");
    }
    // A step that completes once worker2 was restarted needed the new worker2.
    if (!resumed && reported.load() > 0 && a.store().Get("w14/restarted", absl::ZeroDuration()).ok()) {
      (void)a.store().Set(absl::StrCat("w14/resumed/", rank), absl::StrFormat("%.6f", UnixSeconds()));
      resumed = true;
    }
  }
  double none = 0;
  if (reported.compare_exchange_strong(none, -1)) died.Notify();  // never reported: end the reporter
  reporter.join();
  return a.Shutdown().ok() ? 0 : 1;
}

pid_t SpawnRole(const std::string& role, int rank, int port, const std::string& dir) {
  return gw::bench::SpawnSelf({{"GW_BENCH_ROLE", role},
                               {"GW_BENCH_RANK", std::to_string(rank)},
                               {"GW_BENCH_PORT", std::to_string(port)},
                               {"GW_BENCH_DIR", dir}});
}

double LatestOf(gw::rpc::Store& store, const std::string& prefix) {
  double latest = 0;
  for (int rank : {3, 4}) {
    absl::StatusOr<std::string> v = store.Get(absl::StrCat(prefix, rank), absl::Seconds(180));
    double t = 0;
    if (!v.ok() || !absl::SimpleAtod(*v, &t)) Fail(prefix.c_str(), v.ok() ? absl::InternalError(*v) : v.status());
    latest = std::max(latest, t);
  }
  return latest;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") != 0) {
      std::fprintf(stderr, "usage: failure_bench [--quick]\n");
      return 2;
    }
  }
  if (const char* role = std::getenv("GW_BENCH_ROLE")) {
    int rank = 0, port = 0;
    if (!absl::SimpleAtoi(std::getenv("GW_BENCH_RANK"), &rank) || !absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port)) {
      return 2;
    }
    return std::strcmp(role, "server") == 0 ? Serve(rank, port, std::getenv("GW_BENCH_DIR")) : Train(rank, port);
  }
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok()) Fail("port", port.status());
  char dir_template[] = "/tmp/gradwire_w14.XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) Fail("mkdtemp", absl::InternalError(std::strerror(errno)));
  g_checkpoint_dir.path = dir_template;
  const std::string dir = g_checkpoint_dir.path;
  std::vector<pid_t> children = {SpawnRole("server", 1, *port, dir), SpawnRole("server", 2, *port, dir),
                                 SpawnRole("trainer", 3, *port, dir), SpawnRole("trainer", 4, *port, dir)};
  auto agent = gw::rpc::Agent::Start(Options(0, *port));
  if (!agent.ok()) Fail("driver start", agent.status());
  gw::rpc::Store& store = (*agent)->store();
  std::fprintf(stderr, "failure_detection: gradwire, 2 servers + 2 trainers; freezing worker2 after 20 steps\n");
  if (absl::Status s = store.Wait({"w14/started/3", "w14/started/4"}, absl::Seconds(120)); !s.ok()) Fail("start", s);
  const double frozen = UnixSeconds();
  ::kill(children[1], SIGSTOP);
  const double reported = LatestOf(store, "w14/reported/");
  std::fprintf(stderr, "failure_detection: both trainers reported worker2 dead; restarting it from its checkpoint\n");
  ::kill(children[1], SIGKILL);
  ::waitpid(children[1], nullptr, 0);
  const double restarted = UnixSeconds();
  children[1] = SpawnRole("server", 2, *port, dir);
  (void)store.Set("w14/restarted", "1");
  const double resumed = LatestOf(store, "w14/resumed/");
  gw::bench::Report("failure_detection", "frozen_reported_s", reported - frozen, "s");
  gw::bench::Report("failure_detection", "resumed_after_restart_s", resumed - restarted, "s");
  const bool ok = (*agent)->Shutdown().ok();
  int all = ok ? 0 : 1;
  for (pid_t c : children) {
    int status = 0;
    ::waitpid(c, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) all = 1;
  }
  return all;  // g_checkpoint_dir goes at exit
}
