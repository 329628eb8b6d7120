// Unit: Liveness, the failure detector's state machine (liveness.h), driven by a clock
// the test owns. The agent-level behaviour (real processes frozen, busy, cut off) is in
// agent_process_test.cc and agent_test.cc.
#include "cluster/liveness.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent_group.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/faults.h"
#include "test_support.h"

namespace gw::rpc::internal {
namespace {

using Ranks = std::vector<int>;

class LivenessTest : public ::testing::Test {
 protected:
  // interval 100 ms, timeout 300 ms, three workers.
  Liveness live_{3, absl::Milliseconds(100), absl::Milliseconds(300)};
  absl::Time now_ = absl::UnixEpoch();

  Liveness::Actions TickAfter(absl::Duration d, const Ranks& connected) {
    now_ += d;
    return live_.Tick(now_, connected);
  }
};

TEST_F(LivenessTest, APeerThatKeepsTalkingIsNeverPingedNorDeclaredDead) {
  const absl::Duration tick = absl::Milliseconds(100);
  TickAfter(tick, {1});
  for (int i = 0; i < 50; ++i) {
    live_.Heard(1);
    Liveness::Actions a = TickAfter(tick, {1});
    EXPECT_TRUE(a.ping.empty()) << "tick " << i;
    EXPECT_TRUE(a.dead.empty()) << "tick " << i;
  }
}

TEST_F(LivenessTest, ASilentPeerIsPingedThenDeclaredDeadWithinTimeoutPlusInterval) {
  const absl::Duration tick = absl::Milliseconds(100);
  live_.Heard(2);  // heard before the first tick: counting starts at the first tick
  EXPECT_TRUE(TickAfter(tick, {2}).ping.empty());
  const absl::Time last_news = now_;
  absl::Time declared = absl::InfiniteFuture();
  int pings = 0;
  for (int i = 0; i < 10 && declared == absl::InfiniteFuture(); ++i) {
    Liveness::Actions a = TickAfter(tick, {2});
    pings += static_cast<int>(a.ping.size());
    if (!a.dead.empty()) {
      EXPECT_EQ(a.dead, Ranks{2});
      EXPECT_TRUE(a.ping.empty());
      declared = now_;
    }
  }
  EXPECT_EQ(declared - last_news, absl::Milliseconds(300));
  EXPECT_EQ(pings, 2);  // at 100 and 200 ms of silence
  // Declared once: the next ticks start counting afresh (a new connection).
  EXPECT_TRUE(TickAfter(tick, {2}).dead.empty());
}

TEST_F(LivenessTest, AnAnsweredPingResetsTheSilence) {
  const absl::Duration tick = absl::Milliseconds(100);
  TickAfter(tick, {1});
  EXPECT_EQ(TickAfter(tick, {1}).ping, Ranks{1});
  EXPECT_EQ(TickAfter(tick, {1}).ping, Ranks{1});
  live_.Heard(1);  // the pong
  Liveness::Actions a = TickAfter(tick, {1});
  EXPECT_TRUE(a.ping.empty());
  EXPECT_TRUE(a.dead.empty());
  EXPECT_EQ(TickAfter(tick, {1}).ping, Ranks{1});
  EXPECT_EQ(TickAfter(tick, {1}).ping, Ranks{1});
  EXPECT_EQ(TickAfter(tick, {1}).dead, Ranks{1});
}

TEST_F(LivenessTest, OnlyConnectedPeersAreWatchedAndAReconnectionStartsAfresh) {
  const absl::Duration tick = absl::Milliseconds(100);
  for (int i = 0; i < 10; ++i) {
    Liveness::Actions a = TickAfter(tick, {});
    EXPECT_TRUE(a.ping.empty() && a.dead.empty());
  }
  TickAfter(tick, {0});
  TickAfter(tick, {0});
  TickAfter(tick, {});  // its connection went away before the timeout
  TickAfter(tick, {0});  // a new one: silence counts from here
  EXPECT_TRUE(TickAfter(tick, {0}).dead.empty());
  EXPECT_TRUE(TickAfter(tick, {0}).dead.empty());
  EXPECT_EQ(TickAfter(tick, {0}).dead, Ranks{0});
}

TEST_F(LivenessTest, PeersAreJudgedEachOnItsOwn) {
  const absl::Duration tick = absl::Milliseconds(100);
  TickAfter(tick, {0, 1, 2});
  Liveness::Actions a;
  for (int i = 0; i < 3; ++i) {
    live_.Heard(0);
    live_.Heard(2);
    a = TickAfter(tick, {0, 1, 2});
  }
  EXPECT_EQ(a.dead, Ranks{1});
}

TEST_F(LivenessTest, RanksOutsideTheGroupAreIgnored) {
  live_.Heard(-1);
  live_.Heard(3);
  Liveness::Actions a = TickAfter(absl::Milliseconds(100), {-1, 3, 7});
  EXPECT_TRUE(a.ping.empty() && a.dead.empty());
}

// Agents cut off from each other (every connection stalled, both ways, by the fault
// decorator: nothing arrives and nothing closes, as when a cable is pulled) declare each
// other dead; pending calls fail with UNAVAILABLE naming the peer, long before their own
// deadline, and every layer watching peers is told. When the cut heals, plain calls dial
// again.
TEST(LivenessAgentTest, AgentsCutOffFromEachOtherDeclareEachOtherDeadAndCallAgainOnceHealed) {
  std::shared_ptr<FaultInjector> faults = testing::InjectFaults("seed:1");
  AgentOptions base;
  base.transport_options.faults = faults;
  base.heartbeat_interval = absl::Milliseconds(100);
  base.peer_timeout = absl::Milliseconds(500);
  auto group = testing::AgentGroup::Start(2, testing::RegisterTestFunctions, base);
  ASSERT_NE(group, nullptr);
  absl::Mutex mu;
  std::vector<std::pair<int, int>> deaths;  // (watcher, dead rank)
  std::vector<Agent::PeerWatch> watches;
  for (int w = 0; w < 2; ++w) {
    watches.push_back((*group)[w].WatchPeers([&, w](int rank) {
      absl::MutexLock lock(&mu);
      deaths.emplace_back(w, rank);
    }));
  }
  ASSERT_TRUE((*group)[0].Sync<int64_t>("worker1", "noop").ok());
  ASSERT_TRUE((*group)[1].Sync<int64_t>("worker0", "noop").ok());
  faults->Stall();
  auto call = (*group)[0].Async<int64_t>("worker1", "noop", CallOptions{.timeout = absl::Seconds(60)});
  absl::StatusOr<int64_t> r = call.Get(absl::Seconds(60));
  // Whichever side declares the other dead first closes the connection (a stall holds
  // frames, not the socket's close), so the call fails either way, naming worker1.
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("worker1"), std::string::npos) << r.status();
  {
    absl::MutexLock lock(&mu);
    auto both = [&] {
      bool zero = false, one = false;
      for (auto [w, rank] : deaths) {
        zero |= w == 0 && rank == 1;
        one |= w == 1 && rank == 0;
      }
      return zero && one;
    };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&both), absl::Seconds(30)));
  }
  double declared = 0;  // by either agent: the detector, not a closed socket, found the cut
  for (int w = 0; w < 2; ++w) {
    for (const Sample& s : (*group)[w].statistics().Collect()) {
      if (s.name == "gradwire_rpc_peers_declared_silent_total") declared += s.value;
    }
  }
  EXPECT_GE(declared, 1);
  faults->Unstall();
  absl::StatusOr<int64_t> after = (*group)[0].Sync<int64_t>("worker1", "noop");
  EXPECT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(LivenessAgentTest, HeartbeatsKeepAnIdleConnectionAliveAndCanBeTurnedOff) {
  for (absl::Duration interval : {absl::Milliseconds(100), absl::ZeroDuration()}) {
    AgentOptions base;
    base.heartbeat_interval = interval;
    base.peer_timeout = absl::Seconds(1);
    auto group = testing::AgentGroup::Start(2, testing::RegisterTestFunctions, base);
    ASSERT_NE(group, nullptr);
    int deaths = 0;
    absl::Mutex mu;
    Agent::PeerWatch watch = (*group)[0].WatchPeers([&](int) {
      absl::MutexLock lock(&mu);
      ++deaths;
    });
    ASSERT_TRUE((*group)[0].Sync<int64_t>("worker1", "noop").ok());
    // Idle for 3 peer timeouts (the idleness is what is tested, so the test sleeps): the
    // heartbeats alone keep the peers heard.
    absl::SleepFor(absl::Seconds(3));
    EXPECT_TRUE((*group)[0].Sync<int64_t>("worker1", "sleep_ms", int64_t{400}).ok());
    {
      absl::MutexLock lock(&mu);
      EXPECT_EQ(deaths, 0) << "interval " << interval;
    }
    double sent = -1;
    for (const Sample& s : (*group)[0].statistics().Collect()) {
      if (s.name == "gradwire_rpc_heartbeats_sent_total") sent = s.value;
    }
    if (interval > absl::ZeroDuration()) {
      EXPECT_GE(sent, 3) << "an idle connection is pinged";
    } else {
      EXPECT_EQ(sent, 0) << "heartbeats are off";
    }
    EXPECT_TRUE(group->ShutdownAll().ok());
  }
}

TEST(LivenessAgentTest, APeerTimeoutBelowTwiceTheIntervalIsRefused) {
  AgentOptions o;
  o.heartbeat_interval = absl::Seconds(1);
  o.peer_timeout = absl::Milliseconds(1500);
  absl::StatusOr<std::shared_ptr<Agent>> agent = Agent::Start(o);
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument) << agent.status();
  EXPECT_NE(agent.status().message().find("must be at least twice heartbeat_interval"), std::string::npos)
      << agent.status();
}

}  // namespace
}  // namespace gw::rpc::internal
