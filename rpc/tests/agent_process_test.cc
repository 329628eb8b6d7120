// Agents in separate processes: this test process is rank 0 and hosts the store; child
// processes (this binary re-run with GW_TEST_ROLE=worker) are the other ranks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "gradwire/rpc/agent.h"
#include "gradwire/tensor/kernels.h"
#include "test_support.h"

namespace gw::rpc {
namespace {

struct Group {
  std::shared_ptr<Agent> agent;
  std::vector<pid_t> children;
};

Group StartWithChildren(int world) {
  Group g;
  auto server = StoreServer::Start("127.0.0.1", 0);  // find a free port, then let rank 0 host
  EXPECT_TRUE(server.ok());
  const int port = (*server)->port();
  (*server)->Shutdown();
  for (int r = 1; r < world; ++r) {
    g.children.push_back(testing::SpawnSelf(
        "worker", {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)},
                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}}));
  }
  AgentOptions o;
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

}  // namespace
}  // namespace gw::rpc
