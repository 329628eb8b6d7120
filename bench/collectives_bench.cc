// W10 allreduce (BENCHMARKS.md): collective allreduce (sum) of a float32 tensor of 4 KiB,
// 1 MiB and 64 MiB among 2 and 4 processes on this host (the shm transport: the
// shared-memory arena for large pieces); 20 warm-up, then 200 / 50 / 10 timed (--quick:
// 5 warm-up, 20 / 10 / 3). Every timed allreduce starts right after a barrier; rank 0
// reports the median and the bus bandwidth (NCCL-tests: bytes / time x 2(n-1)/n).
//
//   bench_collectives [--quick]
// For tuning: GW_BENCH_SPIN_US and GW_BENCH_PIECE_KB set GroupOptions::spin and piece_bytes.
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench_util.h"
#include "gradwire/collectives/collectives.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/worker/launcher.h"

namespace {

struct Size {
  const char* name;
  int64_t bytes;
  int timed;
  int timed_quick;
};
constexpr Size kSizes[] = {{"4KiB", 4 << 10, 200, 20}, {"1MiB", 1 << 20, 50, 10}, {"64MiB", 64 << 20, 10, 3}};

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "bench_collectives: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// One member of a world of n; rank 0 reports.
int RunMember(int rank, int n, int port, bool quick) {
  gw::rpc::AgentOptions o;
  o.rank = rank;
  o.world_size = n;
  o.rendezvous = absl::StrCat("127.0.0.1:", port);
  o.run_id = absl::StrCat("w10-", n);
  std::shared_ptr<gw::collectives::Collectives> layer;
  auto agent = gw::rpc::Agent::Start(
      o, [&](gw::rpc::Agent& a) { return gw::rpc::Assign(gw::collectives::Collectives::Install(a), layer); });
  if (!agent.ok()) Fail("start", agent.status());
  gw::collectives::GroupOptions go;
  if (const char* v = std::getenv("GW_BENCH_SPIN_US")) go.spin = absl::Microseconds(std::atoi(v));
  if (const char* v = std::getenv("GW_BENCH_PIECE_KB")) go.piece_bytes = static_cast<size_t>(std::atoi(v)) << 10;
  auto group = layer->NewGroup({}, go);
  if (!group.ok()) Fail("group", group.status());
  gw::collectives::ProcessGroup& g = **group;
  for (const Size& size : kSizes) {
    const int64_t numel = size.bytes / 4;
    // Correct once (each member adds rank + 1), then zeros so sums stay finite.
    gw::Tensor t = gw::Tensor::Full({numel}, rank + 1);
    auto checked = g.AllReduce(t).Get(absl::Seconds(120));
    if (!checked.ok()) Fail("allreduce", checked.status());
    const float want = static_cast<float>(n * (n + 1) / 2);
    if (t.ToVector<float>()[static_cast<size_t>(numel - 1)] != want) {
      std::fprintf(stderr, "bench_collectives: wrong allreduce result\n");
      return 1;
    }
    t = gw::Tensor::Zeros({numel});
    const int warmup = quick ? 5 : 20;
    const int timed = quick ? size.timed_quick : size.timed;
    std::vector<double> ms;
    for (int i = 0; i < warmup + timed; ++i) {
      if (auto b = g.Barrier().Get(absl::Seconds(120)); !b.ok()) Fail("barrier", b.status());
      const double t0 = gw::bench::NowSeconds();
      if (auto r = g.AllReduce(t).Get(absl::Seconds(120)); !r.ok()) Fail("allreduce", r.status());
      if (i >= warmup) ms.push_back((gw::bench::NowSeconds() - t0) * 1e3);
    }
    if (rank == 0) {
      const double median = gw::bench::Quantile(ms, 0.5);
      const double busbw = static_cast<double>(size.bytes) / (median * 1e-3) * 2.0 * (n - 1) / n / 1e9;
      gw::bench::Report("allreduce", absl::StrCat("allreduce_w", n, "_", size.name, "_ms_median"), median, "ms");
      gw::bench::Report("allreduce", absl::StrCat("allreduce_w", n, "_", size.name, "_busbw"), busbw, "GB/s");
    }
  }
  g.Close();
  return (*agent)->Shutdown().ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (const char* role = std::getenv("GW_BENCH_ROLE")) {
    int rank = 0, n = 0, port = 0;
    if (!absl::SimpleAtoi(std::getenv("GW_BENCH_RANK"), &rank) || !absl::SimpleAtoi(std::getenv("GW_BENCH_N"), &n) ||
        !absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port)) {
      return 2;
    }
    (void)role;
    return RunMember(rank, n, port, std::getenv("GW_BENCH_QUICK") != nullptr);
  }
  for (int n : {2, 4}) {
    std::fprintf(stderr, "allreduce: gradwire, %d processes (shm transport)%s\n", n, quick ? ", quick" : "");
    absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
    if (!port.ok()) Fail("port", port.status());
    std::vector<pid_t> children;
    for (int r = 1; r < n; ++r) {
      std::vector<std::pair<std::string, std::string>> env = {
          {"GW_BENCH_ROLE", "member"}, {"GW_BENCH_RANK", std::to_string(r)}, {"GW_BENCH_N", std::to_string(n)},
          {"GW_BENCH_PORT", std::to_string(*port)}};
      if (quick) env.emplace_back("GW_BENCH_QUICK", "1");
      children.push_back(gw::bench::SpawnSelf(env));
    }
    if (RunMember(0, n, *port, quick) != 0) return 1;
    for (pid_t c : children) {
      int status = 0;
      ::waitpid(c, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "bench_collectives: a member failed\n");
        return 1;
      }
    }
  }
  return 0;
}
