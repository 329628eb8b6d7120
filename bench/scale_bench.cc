// Benchmark W15 `scale_out` of BENCHMARKS.md for gradwire: N = 8, 16, 32 worker processes
// on this host (this program re-run; rank 0, this process, hosts the rendezvous store).
//
//   scale_bench [--quick] [N ...]      (default N: 8 16 32)
//
// For each N: rendezvous_s_w<N> is from the first process started until rank 0's
// Agent::Start returned (every worker announced and seen); then every worker calls every
// other worker kCalls times ("noop", pipelined: all its calls to all peers in flight at
// once, in rounds of one call per peer), all workers at once: calls_per_s_w<N> = N (N-1)
// kCalls / the wall time from the common start (a store barrier) to the last worker's
// last answer; shutdown_s_w<N> is rank 0's graceful Shutdown (every worker reached it and
// the group closed); threads_w<N> and fds_w<N> are the most any worker but rank 0 had
// after its calls (rank 0 also hosts the store).
#include <sys/wait.h>

#include <cstring>
#include <dirent.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench_util.h"
#include "gradwire/gradwire.h"

namespace {

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "scale_out: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  std::exit(1);
}

int CountEntries(const char* path) {
  int n = 0;
  if (DIR* d = ::opendir(path)) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

gw::rpc::AgentOptions Options(int rank, int world, int port) {
  gw::rpc::AgentOptions o;
  o.rank = rank;
  o.world_size = world;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.host_store = rank == 0;
  o.start_timeout = absl::Seconds(120);
  o.shutdown_timeout = absl::Seconds(120);
  return o;
}

// Every other worker `calls` times, a round of one call to each peer at a time in flight.
absl::Status CallAll(gw::rpc::Agent& agent, int calls) {
  for (int round = 0; round < calls; ++round) {
    std::vector<gw::Future<int64_t>> pending;
    for (const gw::rpc::WorkerInfo& w : agent.workers()) {
      if (w.rank != agent.self().rank) pending.push_back(agent.Async<int64_t>(w.name, "noop"));
    }
    for (auto& f : pending) {
      if (absl::StatusOr<int64_t> r = f.Get(absl::Seconds(60)); !r.ok()) return r.status();
    }
  }
  return absl::OkStatus();
}

absl::Status Register(gw::rpc::Agent& a) { return a.Register("noop", [] { return int64_t{0}; }); }

// Rank > 0: meet, wait for the start, call everyone, report, shut down.
int Work(int rank, int world, int port, int calls) {
  auto agent = gw::rpc::Agent::Start(Options(rank, world, port), Register);
  if (!agent.ok()) Fail("start", agent.status());
  gw::rpc::Agent& a = **agent;
  if (absl::Status s = a.store().Wait({"w15/go"}, absl::Seconds(120)); !s.ok()) Fail("go", s);
  if (absl::Status s = CallAll(a, calls); !s.ok()) Fail("calls", s);
  (void)a.store().Set(absl::StrCat("w15/done/", rank),
                      absl::StrFormat("%.6f %d %d", gw::bench::NowSeconds(), CountEntries("/proc/self/task"),
                                      CountEntries("/proc/self/fd") - 1));
  return a.Shutdown().ok() ? 0 : 1;
}

void Measure(int world, int calls) {
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok()) Fail("port", port.status());
  const double start = gw::bench::NowSeconds();
  std::vector<pid_t> children;
  for (int r = 1; r < world; ++r) {
    children.push_back(gw::bench::SpawnSelf({{"GW_BENCH_RANK", std::to_string(r)},
                                             {"GW_BENCH_WORLD", std::to_string(world)},
                                             {"GW_BENCH_PORT", std::to_string(*port)},
                                             {"GW_BENCH_CALLS", std::to_string(calls)}}));
  }
  auto agent = gw::rpc::Agent::Start(Options(0, world, *port), Register);
  if (!agent.ok()) Fail("start", agent.status());
  const double met = gw::bench::NowSeconds();
  gw::rpc::Store& store = (*agent)->store();
  const double go = gw::bench::NowSeconds();
  (void)store.Set("w15/go", "1");
  if (absl::Status s = CallAll(**agent, calls); !s.ok()) Fail("calls", s);
  double last = gw::bench::NowSeconds();
  int threads = 0, fds = 0;
  for (int r = 1; r < world; ++r) {
    absl::StatusOr<std::string> done = store.Get(absl::StrCat("w15/done/", r), absl::Seconds(120));
    if (!done.ok()) Fail("report", done.status());
    std::vector<std::string> f = absl::StrSplit(*done, ' ');
    double t = 0;
    int th = 0, fd = 0;
    if (f.size() != 3 || !absl::SimpleAtod(f[0], &t) || !absl::SimpleAtoi(f[1], &th) || !absl::SimpleAtoi(f[2], &fd)) {
      Fail("report", absl::InternalError(*done));
    }
    last = std::max(last, t);
    threads = std::max(threads, th);
    fds = std::max(fds, fd);
  }
  const double stop = gw::bench::NowSeconds();
  if (absl::Status s = (*agent)->Shutdown(); !s.ok()) Fail("shutdown", s);
  for (pid_t c : children) {
    int status = 0;
    ::waitpid(c, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail("a worker", absl::InternalError("exited non-zero"));
  }
  const double shutdown = gw::bench::NowSeconds() - stop;
  const std::string w = absl::StrCat("_w", world);
  gw::bench::Report("scale_out", "rendezvous_s" + w, met - start, "s");
  gw::bench::Report("scale_out", "calls_per_s" + w, static_cast<double>(world) * (world - 1) * calls / (last - go),
                    "calls/s");
  gw::bench::Report("scale_out", "shutdown_s" + w, shutdown, "s");
  gw::bench::Report("scale_out", "threads" + w, threads, "threads");
  gw::bench::Report("scale_out", "fds" + w, fds, "fds");
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::vector<int> worlds;
  for (int i = 1; i < argc; ++i) {
    int n = 0;
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (absl::SimpleAtoi(argv[i], &n) && n >= 2 && n <= 1024) {
      worlds.push_back(n);
    } else {
      std::fprintf(stderr, "usage: scale_bench [--quick] [N ...] (N: workers, 2 to 1024)\n");
      return 2;
    }
  }
  if (worlds.empty()) worlds = {8, 16, 32};
  if (const char* rank = std::getenv("GW_BENCH_RANK")) {
    int r = 0, world = 0, port = 0, calls = 0;
    if (!absl::SimpleAtoi(rank, &r) || !absl::SimpleAtoi(std::getenv("GW_BENCH_WORLD"), &world) ||
        !absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port) || !absl::SimpleAtoi(std::getenv("GW_BENCH_CALLS"), &calls)) {
      return 2;
    }
    return Work(r, world, port, calls);
  }
  const int calls = quick ? 10 : 100;
  for (int world : worlds) {
    std::fprintf(stderr, "scale_out: gradwire, %d workers, %d calls to each peer\n", world, calls);
    Measure(world, calls);
  }
  return 0;
}
