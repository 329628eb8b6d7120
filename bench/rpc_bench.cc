// Benchmarks W1 rpc_latency, W2 tensor_echo, W3 async_pipelined and W4 rref of
// BENCHMARKS.md for gradwire: this process is rank 0 (caller), a copy of it
// started with GW_BENCH_ROLE=server is rank 1 (callee), both on 127.0.0.1.
//
//   rpc_bench [--quick] [--churn N] [--calls N] rpc_latency|tensor_echo|async_pipelined|rref
//
// rpc_latency also measures a raw TCP ping-pong of 64 bytes between the same two
// processes (blocking send/recv, TCP_NODELAY): the floor any RPC stack sits on.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>

#include <cstring>
#include <deque>

#include "absl/strings/numbers.h"
#include "bench_util.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/worker/launcher.h"

namespace {

using gw::Tensor;
using gw::rpc::Agent;
using gw::rpc::AgentOptions;

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Raw TCP echo of 64-byte messages on `port` (serves one connection).
void RawEchoServer(int port) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(ls, 1) != 0) return;
  int fd = ::accept(ls, nullptr, nullptr);
  SetNoDelay(fd);
  char buf[64];
  while (RecvAll(fd, buf, sizeof(buf)) && ::send(fd, buf, sizeof(buf), 0) == sizeof(buf)) {
  }
  ::close(fd);
  ::close(ls);
}

std::vector<double> RawPingPongUs(int port, int warmup, int iters) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < 200 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0; ++i) {
    ::close(fd);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    absl::SleepFor(absl::Milliseconds(10));
  }
  SetNoDelay(fd);
  char buf[64] = {};
  std::vector<double> us;
  for (int i = 0; i < warmup + iters; ++i) {
    const double t0 = gw::bench::NowSeconds();
    if (::send(fd, buf, sizeof(buf), 0) != sizeof(buf) || !RecvAll(fd, buf, sizeof(buf))) break;
    if (i >= warmup) us.push_back((gw::bench::NowSeconds() - t0) * 1e6);
  }
  ::close(fd);
  return us;
}

AgentOptions Options(int rank, int port) {
  AgentOptions o;
  o.rank = rank;
  o.world_size = 2;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.start_timeout = absl::Seconds(60);
  o.default_timeout = absl::Seconds(120);
  o.shutdown_timeout = absl::Seconds(60);
  // GRADWIRE_TRANSPORT picks the transport, as for a launched job (the TLS comparison in
  // BENCHMARKS.md runs tcp; TLS itself comes from GRADWIRE_TLS_*, as Agent::Start reads it).
  if (const char* t = std::getenv("GRADWIRE_TRANSPORT")) o.transport = t;
  return o;
}

int Server(int port, int raw_port) {
  std::thread raw([raw_port] { RawEchoServer(raw_port); });
  auto agent = Agent::Start(Options(1, port), [](Agent& a) {
    (void)a.Register("noop", [] { return int64_t{0}; });
    (void)a.Register(
        "noop_inline", [] { return int64_t{0}; }, gw::rpc::RegisterOptions{.mode = gw::rpc::HandlerMode::kInline});
    (void)a.Register("echo", [](Tensor t) { return t; });
    (void)a.Register("make_tensor", [](int64_t numel) { return Tensor::Full({numel}, 1.0); });
    (void)a.Register("small", [] { return int64_t{7}; });
    (void)a.Register(
        "owner_rrefs", [&a] { return a.rref_stats().owned; },
        gw::rpc::RegisterOptions{.mode = gw::rpc::HandlerMode::kInline});
  });
  if (!agent.ok()) {
    std::fprintf(stderr, "rpc_bench server: %s\n", std::string(agent.status().message()).c_str());
    raw.detach();
    return 1;
  }
  (void)(*agent)->store().Set("bench/ready", "1");
  const bool ok = (*agent)->Shutdown(/*graceful=*/true).ok();
  raw.join();
  return ok ? 0 : 1;
}

std::vector<double> SyncRttUs(Agent& agent, const char* function, int warmup, int iters) {
  std::vector<double> us;
  for (int i = 0; i < warmup + iters; ++i) {
    const double t0 = gw::bench::NowSeconds();
    absl::StatusOr<int64_t> r = agent.Sync<int64_t>("worker1", function);
    if (!r.ok()) {
      std::fprintf(stderr, "rpc_latency: %s\n", std::string(r.status().message()).c_str());
      std::exit(1);
    }
    if (i >= warmup) us.push_back((gw::bench::NowSeconds() - t0) * 1e6);
  }
  return us;
}

void RpcLatency(Agent& agent, bool quick, int raw_port) {
  const int warmup = 100, iters = quick ? 200 : 2000;
  // The function runs on the callee's worker pool (the default, as PyTorch runs it).
  const std::vector<double> us = SyncRttUs(agent, "noop", warmup, iters);
  // The same function registered with HandlerMode::kInline (runs on the I/O thread).
  const std::vector<double> inline_us = SyncRttUs(agent, "noop_inline", warmup, iters);
  const std::vector<double> raw = RawPingPongUs(raw_port, warmup, iters);
  const double median = gw::bench::Quantile(us, 0.5), raw_median = gw::bench::Quantile(raw, 0.5);
  gw::bench::Report("rpc_latency", "rtt_median", median, "us");
  gw::bench::Report("rpc_latency", "rtt_p99", gw::bench::Quantile(us, 0.99), "us");
  gw::bench::Report("rpc_latency", "rtt_inline_handler_median", gw::bench::Quantile(inline_us, 0.5), "us");
  gw::bench::Report("rpc_latency", "rtt_inline_handler_p99", gw::bench::Quantile(inline_us, 0.99), "us");
  gw::bench::Report("rpc_latency", "raw_tcp_rtt_median", raw_median, "us");
  gw::bench::Report("rpc_latency", "rtt_over_raw_tcp", median / raw_median, "x");
}

void TensorEcho(Agent& agent, bool quick) {
  struct Size {
    const char* name;
    int64_t bytes;
    int iters;
  };
  const Size sizes[] = {
      {"4KiB", 4 << 10, 200}, {"1MiB", 1 << 20, 100}, {"16MiB", 16 << 20, 20}, {"64MiB", 64 << 20, 10}};
  gw::Generator gen(0);
  for (const Size& s : sizes) {
    Tensor t = Tensor::Rand({s.bytes / 4}, gen);
    const int iters = quick ? std::max(3, s.iters / 10) : s.iters;
    std::vector<double> ms;
    for (int i = 0; i < 3 + iters; ++i) {
      const double t0 = gw::bench::NowSeconds();
      absl::StatusOr<Tensor> r = agent.Sync<Tensor>("worker1", "echo", t);
      if (!r.ok() || r->numel() != t.numel()) {
        std::fprintf(stderr, "tensor_echo: %s\n", std::string(r.status().message()).c_str());
        std::exit(1);
      }
      if (i >= 3) ms.push_back((gw::bench::NowSeconds() - t0) * 1e3);
    }
    const double median = gw::bench::Quantile(ms, 0.5);
    gw::bench::Report("tensor_echo", std::string("echo_") + s.name + "_rtt_median", median, "ms");
    gw::bench::Report("tensor_echo", std::string("echo_") + s.name + "_bw",
                      2.0 * static_cast<double>(s.bytes) / (median / 1e3) / 1e9, "GB/s");
  }
}

struct Pipelined {
  double calls_per_s = 0;
  double cpu_us_per_call = 0;  // both processes' CPU time over the calls
};

// `total` calls with 64 in flight to the server (process `server`).
Pipelined PipelinedCalls(Agent& agent, pid_t server, const char* function, int total) {
  constexpr size_t kWindow = 64;
  std::deque<gw::Future<int64_t>> inflight;
  for (int i = 0; i < 200; ++i) (void)agent.Sync<int64_t>("worker1", function);  // warm-up
  auto cpu = [server] { return gw::bench::ProcessCpuSeconds(::getpid()) + gw::bench::ProcessCpuSeconds(server); };
  const double t0 = gw::bench::NowSeconds(), cpu0 = cpu();
  for (int i = 0; i < total; ++i) {
    if (inflight.size() == kWindow) {
      if (!inflight.front().Get(absl::Seconds(60)).ok()) std::exit(1);
      inflight.pop_front();
    }
    inflight.push_back(agent.Async<int64_t>("worker1", function));
  }
  for (auto& f : inflight) {
    if (!f.Get(absl::Seconds(60)).ok()) std::exit(1);
  }
  return {.calls_per_s = total / (gw::bench::NowSeconds() - t0), .cpu_us_per_call = (cpu() - cpu0) * 1e6 / total};
}

// churn: how many RRefs the churn loop makes (0: 5000, or 500 with --quick).
void RRefs(Agent& agent, bool quick, int churn) {
  // remote() of a 1 MiB tensor made on the owner, then ToHere.
  constexpr int64_t kNumel = 262144;
  const int warmup = quick ? 3 : 20, iters = quick ? 20 : 200;
  std::vector<double> ms;
  for (int i = 0; i < warmup + iters; ++i) {
    const double t0 = gw::bench::NowSeconds();
    gw::rpc::RRef<Tensor> r = agent.Remote<Tensor>("worker1", "make_tensor", kNumel);
    absl::StatusOr<Tensor> t = r.ToHere();
    if (i >= warmup) ms.push_back((gw::bench::NowSeconds() - t0) * 1e3);
    if (!t.ok() || t->numel() != kNumel) {
      std::fprintf(stderr, "rref: remote_1MiB_to_here: %s\n", std::string(t.status().message()).c_str());
      std::exit(1);
    }
  }
  gw::bench::Report("rref", "remote_1MiB_to_here_median", gw::bench::Quantile(ms, 0.5), "ms");
  gw::bench::Report("rref", "remote_1MiB_to_here_p90", gw::bench::Quantile(ms, 0.9), "ms");

  // Churn: RRefs created with Remote and dropped at once; the owner's count must drain.
  const int count = churn > 0 ? churn : quick ? 500 : 5000;
  auto owned = [&agent] {
    absl::StatusOr<int64_t> n = agent.Sync<int64_t>("worker1", "owner_rrefs");
    if (!n.ok()) {
      std::fprintf(stderr, "rref: owner_rrefs: %s\n", std::string(n.status().message()).c_str());
      std::exit(1);
    }
    return *n;
  };
  for (const absl::Time settle = absl::Now() + absl::Seconds(10); owned() != 0 && absl::Now() < settle;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const int64_t base = owned();
  const double t0 = gw::bench::NowSeconds();
  for (int i = 0; i < count; ++i) {
    gw::rpc::RRef<int64_t> r = agent.Remote<int64_t>("worker1", "small");
  }
  const double t_loop = gw::bench::NowSeconds();
  const int64_t at_end = owned() - base;
  double t_back = -1;
  int64_t after_1s = -1, n = at_end;
  while (true) {
    const double now = gw::bench::NowSeconds();
    if (after_1s < 0 && now >= t_loop + 1.0) after_1s = n;
    if (n <= 0 && t_back < 0) t_back = now;
    if (t_back >= 0 && after_1s >= 0) break;
    if (now - t_loop > 60) {
      std::fprintf(stderr, "rref: churn: the owner still holds %lld RRefs 60 s after the loop\n",
                   static_cast<long long>(n));
      std::exit(1);
    }
    absl::SleepFor(absl::Milliseconds(t_back < 0 ? 0.2 : 10));
    n = owned() - base;
  }
  std::fprintf(stderr, "rref: churn: loop %.4f s, owner count at loop end %lld, back to %lld after %.4f s\n",
               t_loop - t0, static_cast<long long>(at_end), static_cast<long long>(base), t_back - t_loop);
  gw::bench::Report("rref", "rref_churn_rate", count / (t_back - t0), "RRefs/s");
  gw::bench::Report("rref", "owner_rrefs_after_1s", static_cast<double>(after_1s), "count");
  gw::bench::Report("rref", "owner_rrefs_at_end_of_loop", static_cast<double>(at_end), "count");
  gw::bench::Report("rref", "owner_rrefs_drain_s", t_back - t_loop, "s");
}

// calls: how many calls each figure makes (0: 20000, or 2000 with --quick). The CPU time
// per call (both processes) is a steadier figure than calls/s on a shared machine; it
// needs seconds of calls (--calls 300000) to be read from /proc's 10 ms ticks.
void AsyncPipelined(Agent& agent, pid_t server, bool quick, int calls) {
  const int total = calls > 0 ? calls : quick ? 2000 : 20000;
  const Pipelined pooled = PipelinedCalls(agent, server, "noop", total);
  gw::bench::Report("async_pipelined", "calls_per_s", pooled.calls_per_s, "calls/s");
  gw::bench::Report("async_pipelined", "cpu_us_per_call", pooled.cpu_us_per_call, "us");
  const Pipelined inline_handler = PipelinedCalls(agent, server, "noop_inline", total);
  gw::bench::Report("async_pipelined", "calls_per_s_inline_handler", inline_handler.calls_per_s, "calls/s");
  gw::bench::Report("async_pipelined", "cpu_us_per_call_inline_handler", inline_handler.cpu_us_per_call, "us");
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_BENCH_ROLE")) {
    int port = 0, raw = 0;
    if (std::strcmp(role, "server") != 0 || !absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port) ||
        !absl::SimpleAtoi(std::getenv("GW_BENCH_RAW_PORT"), &raw)) {
      return 2;
    }
    if (std::getenv("GW_BENCH_PIN") != nullptr && !gw::bench::PinToCpu(1)) return 1;
    return Server(port, raw);
  }
  bool quick = false;
  int churn = 0;  // --churn N: a longer churn loop than the workload's 5000 (a steadier figure)
  int calls = 0;  // --calls N: more pipelined calls than async_pipelined's 20000 (a steadier figure)
  bool pin = false;  // --pin: this process on CPU 0, the server on CPU 1 (a steadier figure still)
  std::string workload;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--pin") == 0) {
      pin = true;
    } else if (std::strcmp(argv[i], "--churn") == 0 && i + 1 < argc && absl::SimpleAtoi(argv[i + 1], &churn)) {
      ++i;
    } else if (std::strcmp(argv[i], "--calls") == 0 && i + 1 < argc && absl::SimpleAtoi(argv[i + 1], &calls)) {
      ++i;
    } else {
      workload = argv[i];
    }
  }
  if (workload != "rpc_latency" && workload != "tensor_echo" && workload != "async_pipelined" && workload != "rref") {
    std::fprintf(
        stderr,
        "usage: rpc_bench [--quick] [--pin] [--churn N] [--calls N] rpc_latency|tensor_echo|async_pipelined|rref\n");
    return 2;
  }
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  absl::StatusOr<int> raw_port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok() || !raw_port.ok()) {
    std::fprintf(stderr, "rpc_bench: %s\n",
                 std::string((port.ok() ? raw_port.status() : port.status()).message()).c_str());
    return 1;
  }
  std::vector<std::pair<std::string, std::string>> server_env = {{"GW_BENCH_ROLE", "server"},
                                                                 {"GW_BENCH_PORT", std::to_string(*port)},
                                                                 {"GW_BENCH_RAW_PORT", std::to_string(*raw_port)}};
  if (pin) server_env.emplace_back("GW_BENCH_PIN", "1");
  const pid_t child = gw::bench::SpawnSelf(server_env);
  if (pin && !gw::bench::PinToCpu(0)) {
    ::kill(child, SIGKILL);
    return 1;
  }
  auto agent = Agent::Start(Options(0, *port));
  if (!agent.ok()) {
    std::fprintf(stderr, "rpc_bench: %s\n", std::string(agent.status().message()).c_str());
    ::kill(child, SIGKILL);
    return 1;
  }
  (void)(*agent)->store().Get("bench/ready", absl::Seconds(60));
  std::fprintf(stderr, "%s: gradwire, transport %s, 2 processes on 127.0.0.1\n", workload.c_str(),
               (*agent)->options().transport.c_str());
  if (workload == "rpc_latency") RpcLatency(**agent, quick, *raw_port);
  if (workload == "tensor_echo") TensorEcho(**agent, quick);
  if (workload == "async_pipelined") AsyncPipelined(**agent, child, quick, calls);
  if (workload == "rref") RRefs(**agent, quick, churn);
  if (workload != "rpc_latency") {  // let the raw echo server exit
    std::vector<double> unused = RawPingPongUs(*raw_port, 0, 1);
  }
  const bool ok = (*agent)->Shutdown(/*graceful=*/true).ok();
  int status = 0;
  ::waitpid(child, &status, 0);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
