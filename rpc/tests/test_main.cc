// main() of the rpc test binary: either the GoogleTest runner, or (GW_TEST_ROLE set) a
// child worker process started by a multi-process test.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "gradwire/rpc/rref.h"
#include "gradwire/tensor/kernels.h"
#include "test_support.h"

namespace gw::rpc::testing {

void RegisterTestFunctions(Agent& agent) {
  Agent* self = &agent;
  (void)agent.Register("add", [](Tensor a, Tensor b) { return kernels::Add(a, b); });
  (void)agent.Register("echo", [](Tensor t) { return t; });
  (void)agent.Register("noop", [] { return int64_t{0}; });
  (void)agent.Register("sleep_ms", [](int64_t ms) {
    absl::SleepFor(absl::Milliseconds(ms));
    return ms;
  });
  (void)agent.Register("spin_ms", [](int64_t ms) {  // computes (burns CPU) for ms
    const absl::Time end = absl::Now() + absl::Milliseconds(ms);
    int64_t spins = 0;
    while (absl::Now() < end) ++spins;
    return spins;
  });
  (void)agent.Register("fail", [](std::string why) { return absl::FailedPreconditionError(why); });
  (void)agent.Register("throw", [](Tensor a, Tensor b) { return kernels::MatMul(a, b); });
  (void)agent.Register("kinds", [](int64_t i, double d, bool b, std::string s, std::vector<Tensor> ts,
                                   std::map<std::string, int64_t> m) {
    std::map<std::string, Value> out;
    out["i"] = Value(i * 2);
    out["d"] = Value(d / 2);
    out["b"] = Value(!b);
    out["s"] = Value(s + s);
    out["n"] = Value(static_cast<int64_t>(ts.size()));
    int64_t sum = 0;
    for (auto& [k, v] : m) sum += v;
    out["sum"] = Value(sum);
    out["first"] = ts.empty() ? Value() : Value(ts[0]);
    return Value(ValueMap(out.begin(), out.end()));
  });
  (void)agent.Register("later", [self](int64_t x) {
    Promise<int64_t> p(self->executor());
    std::thread([p, x] {
      absl::SleepFor(absl::Milliseconds(20));
      p.Set(x + 1);
    }).detach();
    return p.future();
  });
  (void)agent.Register("whoami", [self] { return self->self().name; });

  // RRefs (rref_test.cc, agent_process_test.cc): a stash of references per worker.
  struct Stash {
    absl::Mutex mu;
    std::vector<RRef<Tensor>> refs ABSL_GUARDED_BY(mu);
  };
  auto stash = std::make_shared<Stash>();
  (void)agent.Register("rref_stash", [stash](RRef<Tensor> r) -> absl::StatusOr<double> {
    absl::StatusOr<Tensor> t = r.ToHere();
    if (!t.ok()) return t.status();
    absl::MutexLock lock(&stash->mu);
    stash->refs.push_back(r);
    return kernels::Sum(*t).item();
  });
  (void)agent.Register("rref_clear", [stash] {
    std::vector<RRef<Tensor>> dropped;
    absl::MutexLock lock(&stash->mu);
    dropped.swap(stash->refs);
    return static_cast<int64_t>(dropped.size());
  });
  (void)agent.Register("rref_forward", [self](RRef<Tensor> r, std::string to) {
    return self->Sync<double>(to, "rref_stash", r);
  });
  (void)agent.Register("rref_own", [self](Tensor t) { return self->Own(t); });
  (void)agent.Register("rref_echo", [](RRef<Tensor> r) { return r; });
  (void)agent.Register("rref_echo_object", [](RRef<std::shared_ptr<Counter>> r) { return r; });
  (void)agent.Register("rref_stats", [self] {
    const RRefStats s = self->rref_stats();
    return std::map<std::string, int64_t>{{"owned", s.owned}, {"owner_forks", s.owner_forks},
                                          {"users", s.users}, {"pending_control", s.pending_control}};
  });
  (void)agent.Register("make_full", [](int64_t n, double v) { return Tensor::Full({n}, v); });
  (void)agent.Register("scale", [](Tensor t, double f) { return kernels::MulScalar(t, f); });
  (void)agent.Register("make_counter", [](int64_t start) { return std::make_shared<Counter>(start); });
  (void)agent.Register("counter_add", [](std::shared_ptr<Counter> c, int64_t d) { return c->Add(d); });
  (void)agent.Register("add_in_place", [](Tensor t, double v) {
    kernels::AddInPlace(t, Tensor::Full(t.sizes(), v));
    return true;
  });
  (void)agent.Register("rref_own_after", [self](Tensor t, int64_t ms) {
    absl::SleepFor(absl::Milliseconds(ms));
    return self->Own(t);
  });
}

// A role's agent from the environment (start_timeout 30 s), or null with *exit_code set
// and the error printed as error=... (2: bad environment, 3: start failed).
std::shared_ptr<Agent> StartRoleAgent(int* exit_code) {
  auto options = AgentOptions::FromEnv();
  if (!options.ok()) {
    std::printf("error=%s\n", std::string(options.status().message()).c_str());
    *exit_code = 2;
    return nullptr;
  }
  options->start_timeout = absl::Seconds(30);
  auto agent = Agent::Start(*options, RegisterTestFunctions);
  if (!agent.ok()) {
    std::printf("error=%s\n", std::string(agent.status().message()).c_str());
    *exit_code = 3;
    return nullptr;
  }
  return *agent;
}

int RunRole(const std::string& role) {
  if (role == "worker") {
    // A worker that serves the test functions until the group shuts down.
    auto options = AgentOptions::FromEnv();
    if (!options.ok()) return 2;
    options->host_store = false;
    auto agent = Agent::Start(*options, RegisterTestFunctions);
    if (!agent.ok()) {
      std::fprintf(stderr, "child: %s\n", std::string(agent.status().message()).c_str());
      return 3;
    }
    (void)(*agent)->store().Set("ready/" + (*agent)->self().name, "1");
    return (*agent)->Shutdown(/*graceful=*/true).ok() ? 0 : 4;
  }
  if (role == "probe") {
    // Connects to PROBE_ADDR:PROBE_PORT (host_network_test.cc): prints the local address
    // the route picks (a connected UDP socket's) and how the TCP connect ended
    // ("refused" proves a round trip).
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(std::atoi(std::getenv("PROBE_PORT"))));
    if (::inet_pton(AF_INET, std::getenv("PROBE_ADDR"), &to.sin_addr) != 1) return 2;
    const int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in self{};
    socklen_t len = sizeof(self);
    char local[INET_ADDRSTRLEN] = "?";
    if (::connect(udp, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
        ::getsockname(udp, reinterpret_cast<sockaddr*>(&self), &len) == 0) {
      ::inet_ntop(AF_INET, &self.sin_addr, local, sizeof(local));
    }
    ::close(udp);
    const int tcp = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int rc = ::connect(tcp, reinterpret_cast<sockaddr*>(&to), sizeof(to));
    const int err = errno;
    ::close(tcp);
    std::printf("local=%s\nconnect=%s\n", local, rc == 0 ? "ok" : err == ECONNREFUSED ? "refused" : std::strerror(err));
    return 0;
  }
  if (role == "options") {
    // Prints the addresses AgentOptions::FromEnv picks (multi_host_test.cc).
    absl::StatusOr<AgentOptions> options = AgentOptions::FromEnv();
    if (!options.ok()) {
      std::printf("error=%s\n", std::string(options.status().message()).c_str());
      return 3;
    }
    std::printf("listen=%s\nadvertise=%s\n", options->listen_host.c_str(), options->advertise_host.c_str());
    return 0;
  }
  if (role == "host_pair") {
    // One of two workers on (perhaps) different hosts (multi_host_test.cc): rank 1 sends
    // rank 0 a large tensor and checks the echo. Both print the address they announced,
    // the one they dial for the other, and what went through shared memory.
    int failed = 0;
    std::shared_ptr<Agent> agent = StartRoleAgent(&failed);
    if (agent == nullptr) return failed;
    const int peer = 1 - agent->self().rank;
    std::printf("address=%s\npeer_address=%s\n", agent->self().address.c_str(),
                agent->workers()[static_cast<size_t>(peer)].address.c_str());
    int code = 0;
    if (agent->self().rank == 1) {
      Generator gen(7);
      const Tensor big = Tensor::Randn({1 << 20}, gen);  // 4 MiB: shared memory if allowed
      // A first call completes the shm handshake: its reply comes after the peer's 'K'.
      (void)agent->Sync<int64_t>("worker0", "noop");
      absl::StatusOr<Tensor> echo = agent->Sync<Tensor>("worker0", "echo", big);
      const bool same = echo.ok() && kernels::MaxAbsDiff(*echo, big) == 0.0;
      std::printf("echo=%s\n", same ? "ok" : (echo.ok() ? "different" : std::string(echo.status().message()).c_str()));
      code = same ? 0 : 4;
    }
    if (absl::Status s = agent->Shutdown(/*graceful=*/true); !s.ok()) {
      std::printf("error=%s\n", std::string(s.message()).c_str());
      code = 5;
    }
    const TransportStats stats = agent->transport_stats();
    std::printf("shared_memory_connections=%lld\nshared_memory_tensors=%lld\n",
                static_cast<long long>(stats.shared_memory_connections),
                static_cast<long long>(stats.shared_memory_tensors));
    return code;
  }
  if (role == "scale") {
    // One worker of a large group (scale_test.cc): meets the others, calls each once,
    // reports "threads fds sockets" under scale/<rank>, shuts down gracefully.
    auto options = AgentOptions::FromEnv();
    if (!options.ok()) return 2;
    options->host_store = false;
    options->start_timeout = absl::Seconds(60);
    options->shutdown_timeout = absl::Seconds(60);
    auto agent = Agent::Start(*options, RegisterTestFunctions);
    if (!agent.ok()) {
      std::fprintf(stderr, "scale: %s\n", std::string(agent.status().message()).c_str());
      return 3;
    }
    if (absl::Status s = CallEveryOtherWorker(**agent); !s.ok()) {
      std::fprintf(stderr, "scale: %s\n", std::string(s.message()).c_str());
      return 4;
    }
    (void)(*agent)->store().Set(absl::StrCat("scale/", (*agent)->self().rank),
                                absl::StrCat(CountThreads(), " ", CountOpenFds(), " ", CountSockets()));
    return (*agent)->Shutdown(/*graceful=*/true).ok() ? 0 : 5;
  }
  if (role == "partition") {
    // One of three workers on three hosts (multi_host_test.cc): rank 0 calls ranks 1 and 2,
    // starts a long call to rank 1 and prints connected=1; the test then cuts rank 1's
    // host off. Rank 0 prints how that call ended and when, checks rank 2 still answers,
    // and says done in the store; rank 2 waits for that. Rank 1 is killed by the test.
    int failed = 0;
    std::shared_ptr<Agent> agent = StartRoleAgent(&failed);
    if (agent == nullptr) return failed;
    Agent& a = *agent;
    if (a.self().rank == 0) {
      if (!a.Sync<int64_t>("worker1", "noop").ok() || !a.Sync<int64_t>("worker2", "noop").ok()) return 4;
      Future<int64_t> call = a.Async<int64_t>("worker1", "sleep_ms", int64_t{60000}, CallOptions{.timeout = absl::Minutes(2)});
      std::printf("connected=1\n");
      std::fflush(stdout);
      absl::StatusOr<int64_t> r = call.Get(absl::Minutes(3));
      std::printf("failed_at_unix_ms=%lld\ncall_code=%s\ncall_error=%s\n",
                  static_cast<long long>(absl::ToUnixMillis(absl::Now())),
                  absl::StatusCodeToString(r.status().code()).c_str(), std::string(r.status().message()).c_str());
      absl::StatusOr<std::string> other = a.Sync<std::string>("worker2", "whoami");
      std::printf("other=%s\n", other.ok() ? other->c_str() : std::string(other.status().message()).c_str());
      (void)a.store().Set("partition/done", "1");
      std::fflush(stdout);
      return a.store().Get("partition/seen", absl::Minutes(1)).ok() ? 0 : 5;  // it hosts the store
    }
    if (a.self().rank == 2) {
      if (!a.store().Get("partition/done", absl::Minutes(3)).ok()) return 5;
      return a.store().Set("partition/seen", "1").ok() ? 0 : 6;
    }
    absl::SleepFor(absl::Minutes(3));  // rank 1: cut off, then killed
    return 0;
  }
  std::fprintf(stderr, "unknown GW_TEST_ROLE %s\n", role.c_str());
  return 2;
}

namespace {
int CountDir(const char* path) {
  DIR* d = ::opendir(path);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}
}  // namespace

int CountThreads() { return CountDir("/proc/self/task"); }
int CountOpenFds() { return CountDir("/proc/self/fd") - 1; }  // minus the DIR itself

int CountSockets() {
  int sockets = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* e = ::readdir(dir)) {
    char target[64] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    if (n > 0 && std::strncmp(target, "socket:", 7) == 0) ++sockets;
  }
  ::closedir(dir);
  return sockets;
}

absl::Status CallEveryOtherWorker(Agent& agent) {
  std::vector<Future<int64_t>> calls;
  for (const WorkerInfo& w : agent.workers()) {
    if (w.rank != agent.self().rank) calls.push_back(agent.Async<int64_t>(w.name, "noop"));
  }
  for (Future<int64_t>& call : calls) {
    if (absl::StatusOr<int64_t> r = call.Get(absl::Seconds(60)); !r.ok()) return r.status();
  }
  return absl::OkStatus();
}

}  // namespace gw::rpc::testing

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_TEST_ROLE")) return gw::rpc::testing::RunRole(role);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
