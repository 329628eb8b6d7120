// Unit: Agent — groups of workers on threads of one process, talking over real loopback
// TCP: typed calls, errors, timeouts, large tensors, concurrency, shutdown.
#include "gradwire/rpc/agent.h"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/tensor/kernels.h"
#include "test_support.h"

namespace gw::rpc {
namespace {

using testing::AgentGroup;
using testing::RegisterTestFunctions;

class AgentGroupTest : public ::testing::TestWithParam<int> {};

TEST_P(AgentGroupTest, EveryWorkerCallsEveryOther) {
  const int n = GetParam();
  auto group = AgentGroup::Start(n, RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  for (int from = 0; from < n; ++from) {
    std::vector<Future<Tensor>> futures;
    for (int to = 0; to < n; ++to) {
      futures.push_back((*group)[from].Async<Tensor>(
          "worker" + std::to_string(to), "add", Tensor::Full({4}, from), Tensor::Full({4}, to)));
    }
    for (int to = 0; to < n; ++to) {
      absl::StatusOr<Tensor> r = futures[to].Get(absl::Seconds(30));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->ToVector<float>(), std::vector<float>(4, static_cast<float>(from + to)));
    }
    EXPECT_EQ(*(*group)[from].Sync<std::string>("worker" + std::to_string((from + 1) % n), "whoami"),
              "worker" + std::to_string((from + 1) % n));
  }
  EXPECT_TRUE(group->ShutdownAll().ok());
}

INSTANTIATE_TEST_SUITE_P(Sizes, AgentGroupTest, ::testing::Values(2, 3, 8));

TEST(AgentTest, AllArgumentKindsRoundTrip) {
  auto group = AgentGroup::Start(2, RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  Tensor t = Tensor::Arange(0, 6, 1, DType::kFloat64);
  absl::StatusOr<ValueMap> r = (*group)[0].Sync<ValueMap>(
      "worker1", "kinds", 21, 3.0, true, std::string("ab"), std::vector<Tensor>{t, t},
      std::map<std::string, int64_t>{{"x", 1}, {"y", 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->at("i").get<int64_t>(), 42);
  EXPECT_EQ(r->at("d").get<double>(), 1.5);
  EXPECT_EQ(r->at("b").get<bool>(), false);
  EXPECT_EQ(r->at("s").get<std::string>(), "abab");
  EXPECT_EQ(r->at("n").get<int64_t>(), 2);
  EXPECT_EQ(r->at("sum").get<int64_t>(), 3);
  EXPECT_EQ(r->at("first").get<Tensor>().ToVector<double>(), t.ToVector<double>());
  // A handler that answers later through a Future (async execution).
  EXPECT_EQ(*(*group)[1].Sync<int64_t>("worker0", "later", 41), 42);
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(AgentTest, ErrorsAreDistinctAndNameTheWorkerAndFunction) {
  auto group = AgentGroup::Start(2, RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  Agent& a = (*group)[0];
  auto unknown = a.Sync<int64_t>("worker1", "no_such_fn");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("worker1"), std::string::npos) << unknown.status();
  EXPECT_NE(unknown.status().message().find("no_such_fn"), std::string::npos) << unknown.status();
  auto wrong_type = a.Sync<Tensor>("worker1", "echo", std::string("not a tensor"));
  EXPECT_EQ(wrong_type.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_type.status().message().find("expected tensor, got string"), std::string::npos)
      << wrong_type.status();
  auto wrong_count = a.Sync<Tensor>("worker1", "echo");
  EXPECT_EQ(wrong_count.status().code(), absl::StatusCode::kInvalidArgument) << wrong_count.status();
  auto wrong_result = a.Sync<std::string>("worker1", "echo", Tensor::Ones({1}));
  EXPECT_EQ(wrong_result.status().code(), absl::StatusCode::kInvalidArgument) << wrong_result.status();
  auto remote = a.Sync<int64_t>("worker1", "fail", std::string("disk full"));
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(remote.status().message(), "worker1.fail: disk full");
  // Tensor math refusing its inputs (gw::Error) is the caller's bad argument.
  auto thrown = a.Sync<Tensor>("worker1", "throw", Tensor::Ones({2, 3}), Tensor::Ones({2, 3}));
  EXPECT_EQ(thrown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(thrown.status().message().find("MatMul"), std::string::npos) << thrown.status();
  auto nobody = a.Sync<int64_t>("worker9", "noop");
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kNotFound);
  // The agent keeps serving after all that.
  EXPECT_EQ(*a.Sync<int64_t>("worker1", "noop"), 0);
  EXPECT_EQ(a.Register("noop", [] { return 1; }).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(AgentTest, TimeoutsFailOnlyTheSlowCall) {
  auto group = AgentGroup::Start(2, RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  const absl::Time start = absl::Now();
  auto slow = (*group)[0].Async<int64_t>("worker1", "sleep_ms", 2000,
                                         CallOptions{.timeout = absl::Milliseconds(200)});
  EXPECT_EQ(*(*group)[0].Sync<int64_t>("worker1", "sleep_ms", 10), 10);
  absl::StatusOr<int64_t> r = slow.Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find("worker1"), std::string::npos) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1.5));
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(AgentTest, ConcurrentCallsFromManyThreads) {
  auto group = AgentGroup::Start(3, RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  std::atomic<int> ok{0};
  absl::Mutex mu;
  std::string first_failure;
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      Agent& a = (*group)[t % 3];
      for (int i = 0; i < 50; ++i) {
        auto r = a.Sync<Tensor>("worker" + std::to_string((t + 1) % 3), "echo", Tensor::Full({i + 1}, t));
        if (r.ok() && r->numel() == i + 1 && r->ToVector<float>()[0] == static_cast<float>(t)) {
          ++ok;
          continue;
        }
        absl::MutexLock lock(&mu);
        if (first_failure.empty()) {
          first_failure = absl::StrCat("thread ", t, " call ", i, ": ",
                                       r.ok() ? absl::StrCat("wrong echo of ", r->numel(), " values") : r.status().ToString());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 16 * 50) << first_failure;
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(AgentTest, EchoesA256MiBTensor) {
  // One 256 MiB frame is silence on its link until it has arrived (AgentOptions::
  // peer_timeout): under ThreadSanitizer it takes longer than the default 2.5 s.
  AgentOptions options;
  options.peer_timeout = absl::Seconds(60);
  auto group = AgentGroup::Start(2, RegisterTestFunctions, options);
  ASSERT_NE(group, nullptr);
  Tensor big = Tensor::Empty({64 << 20});  // 256 MiB of float32
  float* p = big.data<float>();
  for (int64_t i = 0; i < big.numel(); ++i) p[i] = static_cast<float>(i % 1000003);
  auto r = (*group)[0].Sync<Tensor>("worker1", "echo", big);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(kernels::MaxAbsDiff(*r, big), 0.0);
  EXPECT_TRUE(group->ShutdownAll().ok());
}

// Statistics: the agent's own samples and a layer's, read here and from another worker;
// a dropped source is gone; the text form is Prometheus's.
TEST(AgentTest, StatisticsOfThisAndAnotherWorker) {
  auto group = AgentGroup::Start(2, RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  std::atomic<int> calls{0};
  Statistics::Source source = (*group)[1].statistics().Add("test", [&](std::vector<Sample>& out) {
    out.push_back({"gradwire_test_calls_total", {{"kind", "a \"quoted\" one"}}, static_cast<double>(++calls)});
  });
  auto value = [](const std::vector<Sample>& samples, const std::string& name) -> std::optional<double> {
    for (const Sample& s : samples) {
      if (s.name == name) return s.value;
    }
    return std::nullopt;
  };
  absl::StatusOr<std::vector<Sample>> remote = (*group)[0].StatisticsOf("worker1").Get(absl::Seconds(10));
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(value(*remote, "gradwire_rpc_workers"), 2.0);
  EXPECT_EQ(value(*remote, "gradwire_test_calls_total"), 1.0);
  absl::StatusOr<std::vector<Sample>> local = (*group)[1].StatisticsOf("worker1").Get(absl::Seconds(10));
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(value(*local, "gradwire_test_calls_total"), 2.0);
  const std::string text = ToText(*local);
  EXPECT_NE(text.find("gradwire_test_calls_total{kind=\"a \\\"quoted\\\" one\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gradwire_rpc_workers 2\n"), std::string::npos) << text;
  source.reset();
  EXPECT_FALSE(value((*group)[1].statistics().Collect(), "gradwire_test_calls_total").has_value());
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE((*group)[0].StatisticsOf("nobody").Get(absl::Seconds(10)).ok());
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(AgentTest, CallsAfterShutdownFailCleanly) {
  auto group = AgentGroup::Start(2, RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE(group->ShutdownAll().ok());
  auto r = (*group)[0].Sync<int64_t>("worker1", "noop");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_NE(r.status().message().find("worker0 is shutting down"), std::string::npos) << r.status();
}

TEST(AgentTest, StartFailsByTheDeadlineWhenAWorkerIsMissing) {
  auto server = StoreServer::Start("127.0.0.1", 0, Security::FromEnv().value_or(Security{}));
  ASSERT_TRUE(server.ok());
  AgentOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.rendezvous = (*server)->address();
  o.host_store = false;
  o.start_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  auto agent = Agent::Start(o);
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kDeadlineExceeded) << agent.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(AgentTest, StartStopHundredTimesLeaksNoThreadsOrSockets) {
  auto once = [] {
    auto group = AgentGroup::Start(2, RegisterTestFunctions);
    ASSERT_NE(group, nullptr);
    ASSERT_EQ(*(*group)[0].Sync<int64_t>("worker1", "noop"), 0);
    ASSERT_TRUE(group->ShutdownAll().ok());
  };
  once();  // gRPC starts its process-wide threads
  once();
  const int threads = testing::CountThreads(), fds = testing::CountOpenFds();
  for (int i = 0; i < 100; ++i) once();
  // Shutdown joins every thread and closes every socket an agent made.
  EXPECT_LE(testing::CountThreads(), threads + 2);
  EXPECT_LE(testing::CountOpenFds(), fds + 2);
}

TEST(AgentOptionsTest, FromEnvNeedsTheTorchrunVariables) {
  ::unsetenv("RANK");
  auto missing = AgentOptions::FromEnv();
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("gradwire launch"), std::string::npos);
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  ::setenv("GRADWIRE_ADVERTISE", "10.0.0.7", 1);  // no route lookup: this machine's routes do not matter
  auto o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->world_size, 3);
  EXPECT_EQ(o->rendezvous, "10.0.0.1:1234");
  ::setenv("RANK", "3", 1);
  EXPECT_FALSE(AgentOptions::FromEnv().ok());
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_PORT", "12x", 1);
  EXPECT_EQ(AgentOptions::FromEnv().status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GRADWIRE_ADVERTISE"}) ::unsetenv(v);
}

TEST(AgentOptionsTest, FromEnvMeetsThroughEtcdWithGradwireRdzv) {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("GRADWIRE_RDZV", "etcd://127.0.0.1:2379/my-job", 1);  // no MASTER_ADDR / MASTER_PORT needed
  absl::StatusOr<AgentOptions> o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rendezvous, "etcd://127.0.0.1:2379/my-job");
  EXPECT_FALSE(o->host_store);
  EXPECT_EQ(o->listen_host, "127.0.0.1");  // the etcd host is loopback: a local job
  ::setenv("GRADWIRE_RDZV", "etcd://127.0.0.1:2379", 1);
  absl::StatusOr<AgentOptions> bad = AgentOptions::FromEnv();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("GRADWIRE_RDZV"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("etcd://HOST:PORT/JOB"), std::string::npos) << bad.status();
  ::unsetenv("GRADWIRE_RDZV");
  absl::StatusOr<AgentOptions> neither = AgentOptions::FromEnv();
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(neither.status().message().find("GRADWIRE_RDZV"), std::string::npos) << neither.status();
  for (const char* v : {"RANK", "WORLD_SIZE"}) ::unsetenv(v);
}

// Which address a worker binds and announces (the defaults across hosts, found through
// routes, are tested in multi_host_test.cc, where the hosts are network namespaces).
TEST(AgentOptionsTest, FromEnvPicksTheListenAndAdvertisedHosts) {
  struct Case {
    const char* master_addr;
    const char* listen;     // GRADWIRE_LISTEN, nullptr: unset
    const char* advertise;  // GRADWIRE_ADVERTISE
    const char* want_listen;
    const char* want_advertise;
  };
  const Case cases[] = {
      {"127.0.0.1", nullptr, nullptr, "127.0.0.1", ""},      // a local job, as always
      {"localhost", nullptr, nullptr, "127.0.0.1", ""},
      {"::1", nullptr, nullptr, "127.0.0.1", ""},
      {"10.0.0.1", "0.0.0.0", nullptr, "0.0.0.0", ""},        // advertised: found at Start
      {"10.0.0.1", "10.0.0.5", nullptr, "10.0.0.5", ""},
      {"10.0.0.1", nullptr, "10.0.0.7", "0.0.0.0", "10.0.0.7"},  // perhaps not ours (NAT)
      {"fd00::1", nullptr, "fd00::7", "::", "fd00::7"},
      {"10.0.0.1", "10.0.0.5", "node-5", "10.0.0.5", "node-5"},
  };
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  for (const Case& c : cases) {
    ::setenv("MASTER_ADDR", c.master_addr, 1);
    for (auto [var, value] : {std::pair{"GRADWIRE_LISTEN", c.listen}, std::pair{"GRADWIRE_ADVERTISE", c.advertise}}) {
      if (value != nullptr) {
        ::setenv(var, value, 1);
      } else {
        ::unsetenv(var);
      }
    }
    absl::StatusOr<AgentOptions> o = AgentOptions::FromEnv();
    ASSERT_TRUE(o.ok()) << c.master_addr << ": " << o.status();
    EXPECT_EQ(o->listen_host, c.want_listen) << c.master_addr;
    EXPECT_EQ(o->advertise_host, c.want_advertise) << c.master_addr;
  }
  EXPECT_EQ(AgentOptions::FromEnv()->rendezvous, "10.0.0.1:1234");
  ::setenv("MASTER_ADDR", "fd00::1", 1);
  EXPECT_EQ(AgentOptions::FromEnv()->rendezvous, "[fd00::1]:1234");
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GRADWIRE_LISTEN", "GRADWIRE_ADVERTISE"}) {
    ::unsetenv(v);
  }
}

// Listening on every interface, a worker announces the address that reaches the
// rendezvous host (here loopback), or the one it is told to.
TEST(AgentTest, AWorkerListeningOnAWildcardAdvertisesADialableAddress) {
  AgentOptions wildcard;
  wildcard.listen_host = "0.0.0.0";
  auto group = AgentGroup::Start(2, RegisterTestFunctions, wildcard);
  ASSERT_NE(group, nullptr);
  for (int r = 0; r < 2; ++r) EXPECT_EQ((*group)[r].self().address.rfind("127.0.0.1:", 0), 0u) << (*group)[r].self().address;
  EXPECT_EQ(*(*group)[0].Sync<std::string>("worker1", "whoami"), "worker1");
  EXPECT_TRUE(group->ShutdownAll().ok());

  wildcard.advertise_host = "localhost";
  group = AgentGroup::Start(2, RegisterTestFunctions, wildcard);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ((*group)[1].self().address.rfind("localhost:", 0), 0u) << (*group)[1].self().address;
  EXPECT_EQ(*(*group)[0].Sync<std::string>("worker1", "whoami"), "worker1");
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(AgentTest, AListenHostThatIsNotOursSaysWhichSettingToChange) {
  for (const char* transport : {"shm", "grpc"}) {
    AgentOptions o;
    o.rendezvous = "127.0.0.1:0";
    o.transport = transport;
    o.listen_host = "198.51.100.1";  // TEST-NET-2: never an address of this machine
    absl::StatusOr<std::shared_ptr<Agent>> agent = Agent::Start(o);
    ASSERT_FALSE(agent.ok()) << transport;
    EXPECT_NE(agent.status().message().find("198.51.100.1"), std::string::npos) << agent.status();
    EXPECT_NE(agent.status().message().find("GRADWIRE_LISTEN"), std::string::npos) << agent.status();
  }
}

// Whether an error already names a worker (errors.h): as a whole word only, so a reply of
// worker1 that mentions worker10 still gets its sender's name (agent.cc, collectives).
TEST(NamesWorkerTest, ANameCountsOnlyAsAWholeWord) {
  EXPECT_TRUE(NamesWorker("worker1", "worker1"));
  EXPECT_TRUE(NamesWorker("worker1 is unavailable: connection reset", "worker1"));
  EXPECT_TRUE(NamesWorker("distributed autograd is not installed on worker1: call ...", "worker1"));
  EXPECT_TRUE(NamesWorker("sending to worker1 failed", "worker1"));
  EXPECT_TRUE(NamesWorker("worker1.fn: boom", "worker1"));
  EXPECT_TRUE(NamesWorker("(worker1)", "worker1"));
  EXPECT_FALSE(NamesWorker("worker10 is unavailable", "worker1"));
  EXPECT_FALSE(NamesWorker("my_worker1 is unavailable", "worker1"));
  EXPECT_FALSE(NamesWorker("subworker1 failed", "worker1"));
  EXPECT_FALSE(NamesWorker("send to 127.0.0.1:4000 failed: Broken pipe", "worker1"));
  // A later whole occurrence counts even after a longer name.
  EXPECT_TRUE(NamesWorker("worker10 asked worker1 and it failed", "worker1"));
  // Names with other characters: '-' and '.' separate words.
  EXPECT_TRUE(NamesWorker("trainer-1 is unavailable", "trainer-1"));
  EXPECT_FALSE(NamesWorker("trainer-10 is unavailable", "trainer-1"));
  EXPECT_TRUE(NamesWorker("host.a:1 said no", "host.a:1"));
  EXPECT_TRUE(NamesWorker("x:1y", "x:"));  // the name ends in a separator: nothing to continue
  EXPECT_FALSE(NamesWorker("anything", ""));
}

}  // namespace
}  // namespace gw::rpc
