// Agents that meet through a real etcd (AgentOptions::rendezvous "etcd://HOST:PORT/JOB"):
// on threads and as processes, a rank that never arrives, an etcd that restarts during
// the rendezvous, and the run's keys removed at a graceful shutdown so the job's name
// can be used again.
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "etcd_server.h"
#include "test_support.h"

namespace gw::rpc::testing {
namespace {

bool Watching(double watchers) { return watchers >= 1; }

class EtcdAgentTest : public EtcdTest {
 protected:
  AgentOptions Options(int rank, int world, const std::string& job) const {
    AgentOptions o;
    o.rank = rank;
    o.world_size = world;
    o.rendezvous = etcd_->Url(job);
    o.host_store = true;  // ignored for etcd: nobody hosts it
    return o;
  }

  // Whether the run's keys ("gradwire/..." under the job) are still in etcd.
  bool RunKeysLeft(const std::string& job) const {
    absl::StatusOr<std::unique_ptr<Store>> store = ConnectStore(etcd_->Url(job), absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() && (*store)->Get("gradwire/worker/0", absl::ZeroDuration()).ok();
  }
};

TEST_F(EtcdAgentTest, AgentsMeetThroughEtcdAndTheJobNameCanBeUsedAgain) {
  for (int run = 0; run < 2; ++run) {
    AgentOptions base;
    base.rendezvous = etcd_->Url("twice");
    std::unique_ptr<AgentGroup> group = AgentGroup::Start(3, RegisterTestFunctions, base);
    ASSERT_NE(group, nullptr) << "run " << run;
    EXPECT_EQ((*group)[0].options().rendezvous, etcd_->Url("twice"));
    absl::StatusOr<std::string> who = (*group)[0].Sync<std::string>("worker2", "whoami");
    ASSERT_TRUE(who.ok()) << who.status();
    EXPECT_EQ(*who, "worker2");
    ASSERT_TRUE(group->ShutdownAll().ok()) << "run " << run;
    // The last worker out removed the run's keys: the next run starts clean.
    EXPECT_FALSE(RunKeysLeft("twice")) << "run " << run;
  }
}

TEST_F(EtcdAgentTest, WorkerProcessesMeetThroughGradwireRdzv) {
  constexpr int kWorld = 3;
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    pids.push_back(SpawnSelf("worker", {{"RANK", absl::StrCat(r)},
                                        {"WORLD_SIZE", absl::StrCat(kWorld)},
                                        {"GRADWIRE_RDZV", etcd_->Url("procs")}}));
  }
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(WaitForExit(pids[static_cast<size_t>(r)]), 0) << "rank " << r;
  absl::StatusOr<std::unique_ptr<Store>> store = ConnectStore(etcd_->Url("procs"), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(store.ok()) << store.status();
  // Each worker said so in the store (user keys stay); the rendezvous's own keys are gone.
  EXPECT_TRUE((*store)->Wait({"ready/worker0", "ready/worker1", "ready/worker2"}, absl::ZeroDuration()).ok());
  EXPECT_FALSE(RunKeysLeft("procs"));
}

TEST_F(EtcdAgentTest, ARankThatNeverArrivesIsNamedAtTheDeadline) {
  AgentOptions o = Options(0, 3, "short");
  o.start_timeout = absl::Seconds(1);
  absl::StatusOr<std::shared_ptr<Agent>> lonely;
  std::thread rank2([&] {
    AgentOptions o2 = Options(2, 3, "short");
    o2.start_timeout = absl::Seconds(1);
    (void)Agent::Start(o2, RegisterTestFunctions);
  });
  lonely = Agent::Start(o, RegisterTestFunctions);
  rank2.join();
  EXPECT_EQ(lonely.status().code(), absl::StatusCode::kDeadlineExceeded) << lonely.status();
  EXPECT_NE(lonely.status().message().find("rank(s) 1 of 3"), std::string::npos) << lonely.status();
}

TEST_F(EtcdAgentTest, AnEtcdRestartDuringTheRendezvousOnlyDelaysIt) {
  absl::StatusOr<std::shared_ptr<Agent>> first;
  std::thread rank0([&] { first = Agent::Start(Options(0, 2, "restart"), RegisterTestFunctions); });
  // Rank 0 has announced itself and watches for rank 1.
  ASSERT_TRUE(etcd_->AwaitWatchers(Watching));
  etcd_->Stop();
  ASSERT_TRUE(etcd_->Restart().ok());
  absl::StatusOr<std::shared_ptr<Agent>> second = Agent::Start(Options(1, 2, "restart"), RegisterTestFunctions);
  rank0.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<std::string> who = (*second)->Sync<std::string>("worker0", "whoami");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(*who, "worker0");
  absl::Status down0, down1;
  std::thread stop0([&] { down0 = (*first)->Shutdown(); });
  down1 = (*second)->Shutdown();
  stop0.join();
  EXPECT_TRUE(down0.ok()) << down0;
  EXPECT_TRUE(down1.ok()) << down1;
}

// Elastic groups through etcd: nobody hosts the store, so any worker may leave, rank 0
// too; a worker joins, rank 0 leaves, and the two left shut down gracefully, the last one
// out removing the run's keys.
TEST_F(EtcdAgentTest, WorkersJoinAndRankZeroLeavesAJobMetThroughEtcd) {
  AgentOptions base;
  base.rendezvous = etcd_->Url("elastic");
  base.max_world_size = 3;
  std::unique_ptr<AgentGroup> group = AgentGroup::Start(2, RegisterTestFunctions, base);
  ASSERT_NE(group, nullptr);
  AgentOptions join = base;
  join.join = true;
  absl::StatusOr<std::shared_ptr<Agent>> joined = Agent::Start(join, RegisterTestFunctions);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ((*joined)->self().name, "worker2");
  absl::StatusOr<std::string> who = (*group)[1].Sync<std::string>("worker2", "whoami");
  ASSERT_TRUE(who.ok()) << who.status();
  ASSERT_TRUE((*group)[0].Leave().ok());
  who = (*joined)->Sync<std::string>("worker0", "whoami");
  EXPECT_EQ(who.status().code(), absl::StatusCode::kUnavailable) << who.status();
  who = (*joined)->Sync<std::string>("worker1", "whoami");
  ASSERT_TRUE(who.ok()) << who.status();
  absl::Status down1, down2;
  std::thread stop1([&] { down1 = (*group)[1].Shutdown(); });
  down2 = (*joined)->Shutdown();
  stop1.join();
  EXPECT_TRUE(down1.ok()) << down1;
  EXPECT_TRUE(down2.ok()) << down2;
  EXPECT_FALSE(RunKeysLeft("elastic"));
}

}  // namespace
}  // namespace gw::rpc::testing
