// Agents in separate processes: this test process is rank 0 and hosts the store; child
// processes (this binary re-run with GW_TEST_ROLE=worker) are the other ranks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>

#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/tensor/kernels.h"
#include "test_support.h"

namespace gw::rpc {
namespace {

struct Group {
  std::shared_ptr<Agent> agent;
  std::vector<pid_t> children;
};

// Heartbeats as the failure-detection tests set them, for every process of the group.
struct Heartbeats {
  absl::Duration interval = absl::Milliseconds(500);
  absl::Duration peer_timeout = absl::Milliseconds(2500);
};

Group StartWithChildren(int world, Heartbeats beats = {}) {
  Group g;
  auto server = StoreServer::Start("127.0.0.1", 0);  // find a free port, then let rank 0 host
  EXPECT_TRUE(server.ok());
  const int port = (*server)->port();
  (*server)->Shutdown();
  for (int r = 1; r < world; ++r) {
    g.children.push_back(testing::SpawnSelf(
        "worker", {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)},
                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                   {"GRADWIRE_HEARTBEAT_INTERVAL", absl::FormatDuration(beats.interval)},
                   {"GRADWIRE_PEER_TIMEOUT", absl::FormatDuration(beats.peer_timeout)}}));
  }
  AgentOptions o;
  o.heartbeat_interval = beats.interval;
  o.peer_timeout = beats.peer_timeout;
  o.rank = 0;
  o.world_size = world;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.start_timeout = absl::Seconds(30);
  auto agent = Agent::Start(o, testing::RegisterTestFunctions);
  EXPECT_TRUE(agent.ok()) << agent.status();
  if (agent.ok()) {
    g.agent = *agent;
    std::vector<std::string> ready;
    for (int r = 1; r < world; ++r) ready.push_back("ready/worker" + std::to_string(r));
    EXPECT_TRUE(g.agent->store().Wait(ready, absl::Seconds(30)).ok());
  }
  return g;
}

TEST(AgentProcessTest, ThreeProcessesCallEachOtherAndShutDownTogether) {
  Group g = StartWithChildren(3);
  ASSERT_NE(g.agent, nullptr);
  Generator gen(1);
  Tensor x = Tensor::Randn({1000}, gen);
  for (const char* peer : {"worker1", "worker2"}) {
    auto r = g.agent->Sync<Tensor>(peer, "echo", x);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(kernels::MaxAbsDiff(*r, x), 0.0);
    EXPECT_EQ(*g.agent->Sync<std::string>(peer, "whoami"), peer);
  }
  EXPECT_TRUE(g.agent->Shutdown(/*graceful=*/true).ok());
  for (pid_t c : g.children) EXPECT_EQ(testing::WaitForExit(c), 0);
}

TEST(AgentProcessTest, PeerKilledMidCallFailsTheCallWithUnavailable) {
  Group g = StartWithChildren(2);
  ASSERT_NE(g.agent, nullptr);
  auto call = g.agent->Async<int64_t>("worker1", "sleep_ms", 20000,
                                      CallOptions{.timeout = absl::Seconds(20)});
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time killed = absl::Now();
  ::kill(g.children[0], SIGKILL);
  absl::StatusOr<int64_t> r = call.Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("worker1"), std::string::npos) << r.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5));
  // Later calls to the dead peer fail fast too; the agent itself is fine.
  auto again = g.agent->Sync<int64_t>("worker1", "noop");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
  EXPECT_EQ(*g.agent->Sync<int64_t>("worker0", "noop"), 0);
  EXPECT_EQ(testing::WaitForExit(g.children[0]), 128 + SIGKILL);
}

TEST(AgentProcessTest, OwnerKilledMakesUsersFailWithUnavailableNamingIt) {
  Group g = StartWithChildren(2);
  ASSERT_NE(g.agent, nullptr);
  RRef<Tensor> r = g.agent->Remote<Tensor>("worker1", "make_full", int64_t{4}, 1.5);
  ASSERT_TRUE(r.ToHere().ok());
  ::kill(g.children[0], SIGKILL);
  EXPECT_EQ(testing::WaitForExit(g.children[0]), 128 + SIGKILL);
  const absl::Time start = absl::Now();
  absl::StatusOr<Tensor> t = r.ToHere(absl::Seconds(10));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable) << t.status();
  EXPECT_NE(t.status().message().find("worker1"), std::string::npos) << t.status();
  absl::StatusOr<Tensor> m = r.Sync<Tensor>("scale", 2.0, CallOptions{.timeout = absl::Seconds(10)});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // Dropping the reference to a dead owner neither hangs nor lingers.
  r = RRef<Tensor>();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (g.agent->rref_stats().users != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(g.agent->rref_stats().users, 0);
  EXPECT_EQ(g.agent->rref_stats().pending_control, 0);
}

TEST(AgentProcessTest, UserKilledMakesTheOwnerDropItsReferences) {
  Group g = StartWithChildren(2);
  ASSERT_NE(g.agent, nullptr);
  {
    RRef<Tensor> mine = g.agent->Own(Tensor::Full({3}, 2.0));
    absl::StatusOr<double> sum = g.agent->Sync<double>("worker1", "rref_stash", mine);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, 6.0);
    EXPECT_EQ(g.agent->rref_stats().owner_forks, 1);  // worker1 keeps a fork
    ::kill(g.children[0], SIGKILL);
    EXPECT_EQ(testing::WaitForExit(g.children[0]), 128 + SIGKILL);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (g.agent->rref_stats().owner_forks != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    EXPECT_EQ(g.agent->rref_stats().owner_forks, 0);
    EXPECT_EQ(g.agent->rref_stats().owned, 1);  // ours is still alive
  }
  EXPECT_EQ(g.agent->rref_stats().owned, 0);
}

// Failure detection (liveness.h): a peer that computes in its handlers for longer than the
// peer timeout is alive (its I/O thread answers heartbeats); a frozen one is declared dead
// and its pending calls fail, long before their own deadline.
constexpr Heartbeats kQuickBeats{absl::Milliseconds(200), absl::Milliseconds(1500)};

struct DeathLog {
  absl::Mutex mu;
  std::vector<int> ranks ABSL_GUARDED_BY(mu);
  Agent::PeerWatch watch;
  explicit DeathLog(Agent& agent) {
    watch = agent.WatchPeers([this](int rank) {
      absl::MutexLock lock(&mu);
      ranks.push_back(rank);
    });
  }
  std::vector<int> Get() {
    absl::MutexLock lock(&mu);
    return ranks;
  }
  bool AwaitRank(int rank, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto seen = [&] { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); };
    return mu.AwaitWithTimeout(absl::Condition(&seen), timeout);
  }
};

TEST(AgentProcessTest, APeerComputingInAHandlerLongerThanThePeerTimeoutIsNotDeclaredDead) {
  Group g = StartWithChildren(2, kQuickBeats);
  ASSERT_NE(g.agent, nullptr);
  DeathLog deaths(*g.agent);
  // Both of worker1's pool threads compute for 3 peer timeouts; only its I/O thread is
  // free to answer the heartbeats.
  auto a = g.agent->Async<int64_t>("worker1", "spin_ms", int64_t{4500}, CallOptions{.timeout = absl::Seconds(60)});
  auto b = g.agent->Async<int64_t>("worker1", "spin_ms", int64_t{4500}, CallOptions{.timeout = absl::Seconds(60)});
  absl::StatusOr<int64_t> ra = a.Get(absl::Seconds(60)), rb = b.Get(absl::Seconds(60));
  EXPECT_TRUE(ra.ok()) << ra.status();
  EXPECT_TRUE(rb.ok()) << rb.status();
  EXPECT_TRUE(deaths.Get().empty());
  double pinged = 0;  // the heartbeats ran: worker1 was silent while it computed
  for (const Sample& s : g.agent->statistics().Collect()) {
    if (s.name == "gradwire_rpc_heartbeats_sent_total") pinged = s.value;
  }
  EXPECT_GT(pinged, 0);
  EXPECT_EQ(*g.agent->Sync<std::string>("worker1", "whoami"), "worker1");
  EXPECT_TRUE(g.agent->Shutdown(/*graceful=*/true).ok());
  EXPECT_EQ(testing::WaitForExit(g.children[0]), 0);
}

TEST(AgentProcessTest, AFrozenPeerIsDeclaredDeadAndItsPendingCallsFailNamingIt) {
  Group g = StartWithChildren(3, kQuickBeats);
  ASSERT_NE(g.agent, nullptr);
  DeathLog deaths(*g.agent);
  ASSERT_TRUE(g.agent->Sync<int64_t>("worker2", "noop").ok());
  // The call's own deadline is a minute away: only the detector can end it sooner.
  auto call = g.agent->Async<int64_t>("worker1", "sleep_ms", int64_t{1000}, CallOptions{.timeout = absl::Seconds(60)});
  ASSERT_EQ(::kill(g.children[0], SIGSTOP), 0);
  const absl::Time frozen = absl::Now();
  absl::StatusOr<int64_t> r = call.Get(absl::Seconds(60));
  const absl::Duration took = absl::Now() - frozen;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("worker1"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("declared dead by worker0"), std::string::npos) << r.status();
  EXPECT_TRUE(deaths.AwaitRank(1, absl::Seconds(30)));
  std::printf("frozen peer reported after %s (peer_timeout %s, heartbeat interval %s)\n",
              absl::FormatDuration(took).c_str(), absl::FormatDuration(kQuickBeats.peer_timeout).c_str(),
              absl::FormatDuration(kQuickBeats.interval).c_str());
  // The others are fine, and a call to the frozen peer now fails too (a new connection
  // is accepted by its kernel, but nobody answers on it).
  EXPECT_EQ(*g.agent->Sync<std::string>("worker2", "whoami"), "worker2");
  auto again = g.agent->Sync<int64_t>("worker1", "noop", CallOptions{.timeout = absl::Seconds(60)});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
  for (int rank : deaths.Get()) EXPECT_EQ(rank, 1);
  ::kill(g.children[0], SIGKILL);
  ::kill(g.children[0], SIGCONT);
  EXPECT_EQ(testing::WaitForExit(g.children[0]), 128 + SIGKILL);
  ::kill(g.children[1], SIGKILL);
  EXPECT_EQ(testing::WaitForExit(g.children[1]), 128 + SIGKILL);
}

}  // namespace
}  // namespace gw::rpc
