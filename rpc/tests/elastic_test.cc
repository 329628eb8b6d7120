// Elastic groups (agent.h): workers join a running group (AgentOptions::join) and leave it
// (Agent::Leave) while the others keep calling each other; the graceful shutdown of those
// left waits for the joiners and not for the leavers.
#include <gtest/gtest.h>

#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent_group.h"
#include "test_support.h"

namespace gw::rpc::testing {
namespace {

// The membership changes one agent saw, awaitable.
class MemberLog {
 public:
  explicit MemberLog(Agent& agent)
      : watch_(agent.WatchMembers([this](const MemberChange& c) {
          absl::MutexLock lock(&mu_);
          changes_.push_back(absl::StrCat(c.kind == MemberChange::Kind::kJoined ? "joined " : "left ", c.worker.name,
                                          " (rank ", c.worker.rank, ")"));
        })) {}
  // Waits until `n` changes were seen; returns them.
  std::vector<std::string> Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return changes_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return changes_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> changes_ ABSL_GUARDED_BY(mu_);
  Agent::PeerWatch watch_;
};

AgentOptions Joiner(const AgentGroup& group) {
  AgentOptions o;
  o.join = true;
  o.rendezvous = group.store_address();
  o.host_store = false;
  o.rank = 7;        // ignored: the group gives it one
  o.world_size = 1;  // ignored too
  return o;
}

std::vector<std::string> Names(const std::vector<WorkerInfo>& workers) {
  std::vector<std::string> names;
  for (const WorkerInfo& w : workers) names.push_back(w.name);
  return names;
}

TEST(ElasticTest, WorkersJoinARunningGroupAndAreCalledByName) {
  AgentOptions base;
  base.max_world_size = 4;
  std::unique_ptr<AgentGroup> group = AgentGroup::Start(2, RegisterTestFunctions, base);
  ASSERT_NE(group, nullptr);
  MemberLog log0((*group)[0]);
  MemberLog log1((*group)[1]);

  absl::StatusOr<std::shared_ptr<Agent>> a2 = Agent::Start(Joiner(*group), RegisterTestFunctions);
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_EQ((*a2)->self().rank, 2);
  EXPECT_EQ((*a2)->self().name, "worker2");
  EXPECT_EQ((*a2)->options().world_size, 2);
  EXPECT_EQ((*a2)->options().max_world_size, 4);
  EXPECT_EQ(Names((*a2)->members()), (std::vector<std::string>{"worker0", "worker1", "worker2"}));
  // Every member was told, on its own, before any call.
  EXPECT_EQ(log0.Await(1), std::vector<std::string>{"joined worker2 (rank 2)"});
  EXPECT_EQ(log1.Await(1), std::vector<std::string>{"joined worker2 (rank 2)"});
  EXPECT_EQ(Names((*group)[1].members()), (std::vector<std::string>{"worker0", "worker1", "worker2"}));

  // Both directions, by name.
  absl::StatusOr<std::string> who = (*group)[1].Sync<std::string>("worker2", "whoami");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(*who, "worker2");
  who = (*a2)->Sync<std::string>("worker0", "whoami");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(*who, "worker0");
  absl::StatusOr<WorkerInfo> record = (*group)[0].Worker("worker2");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->address, (*a2)->self().address);

  // A second joiner takes the next rank and meets the first; a third finds the job full.
  AgentOptions named = Joiner(*group);
  named.name = "late";
  absl::StatusOr<std::shared_ptr<Agent>> a3 = Agent::Start(named, RegisterTestFunctions);
  ASSERT_TRUE(a3.ok()) << a3.status();
  EXPECT_EQ((*a3)->self().rank, 3);
  who = (*a2)->Sync<std::string>("late", "whoami");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(*who, "late");
  EXPECT_EQ(log0.Await(2).back(), "joined late (rank 3)");
  absl::StatusOr<std::shared_ptr<Agent>> full = Agent::Start(Joiner(*group), RegisterTestFunctions);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  EXPECT_NE(full.status().message().find("GRADWIRE_MAX_WORLD_SIZE"), std::string::npos) << full.status();

  // The graceful shutdown of all four: the barrier counts the joiners.
  std::thread t2([&] { EXPECT_TRUE((*a2)->Shutdown().ok()); });
  std::thread t3([&] { EXPECT_TRUE((*a3)->Shutdown().ok()); });
  EXPECT_TRUE(group->ShutdownAll().ok());
  t2.join();
  t3.join();
}

TEST(ElasticTest, AWorkerLeavesAndTheOthersGoOn) {
  AgentOptions base;
  base.shutdown_timeout = absl::Seconds(30);
  // "started_sleep_ms" says when it starts: the test knows the request is in flight on
  // its callee (taken, not just sent) before the callee leaves.
  auto started = std::make_shared<absl::Notification>();
  std::unique_ptr<AgentGroup> group = AgentGroup::Start(
      3,
      [started](Agent& a) {
        RegisterTestFunctions(a);
        return a.Register("started_sleep_ms", [started](int64_t ms) {
          started->Notify();
          absl::SleepFor(absl::Milliseconds(ms));
          return ms;
        });
      },
      base);
  ASSERT_NE(group, nullptr);
  MemberLog log0((*group)[0]);
  std::atomic<int> gone{-1};
  Agent::PeerWatch peers = (*group)[0].WatchPeers([&](int rank) { gone = rank; });
  // worker1 has a call in flight to worker2 when worker2 leaves: it is still answered.
  Future<int64_t> slow = (*group)[1].Async<int64_t>("worker2", "started_sleep_ms", int64_t{300});
  ASSERT_TRUE(started->WaitForNotificationWithTimeout(absl::Seconds(10))) << "worker2 never ran the request";

  ASSERT_TRUE((*group)[2].Leave().ok());
  absl::StatusOr<int64_t> answered = slow.Get(absl::Seconds(10));
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(*answered, 300);
  EXPECT_EQ(log0.Await(1), std::vector<std::string>{"left worker2 (rank 2)"});
  EXPECT_EQ(gone.load(), 2);  // the layers that watch peers let go of it
  EXPECT_EQ(Names((*group)[0].members()), (std::vector<std::string>{"worker0", "worker1"}));
  for (int r : {0, 1}) {
    absl::StatusOr<std::string> who = (*group)[r].Sync<std::string>("worker2", "whoami");
    ASSERT_FALSE(who.ok());
    EXPECT_EQ(who.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(who.status().message().find("worker2 is unavailable: it left the job"), std::string::npos) << who.status();
  }
  absl::StatusOr<std::string> who = (*group)[0].Sync<std::string>("worker1", "whoami");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_FALSE((*group)[2].Leave().ok());  // once

  // The others shut down together without waiting for it.
  const absl::Time start = absl::Now();
  std::thread t1([&] { EXPECT_TRUE((*group)[1].Shutdown().ok()); });
  EXPECT_TRUE((*group)[0].Shutdown().ok());
  t1.join();
  EXPECT_LT(absl::Now() - start, base.shutdown_timeout / 2);
}

// A worker that joined and then died (closed without its graceful shutdown) does not
// hold the others' graceful shutdown until their shutdown_timeout.
TEST(ElasticTest, AJoinedWorkerThatDiedDoesNotHoldTheOthersShutdown) {
  AgentOptions base;
  base.max_world_size = 3;
  base.shutdown_timeout = absl::Seconds(30);
  std::unique_ptr<AgentGroup> group = AgentGroup::Start(2, RegisterTestFunctions, base);
  ASSERT_NE(group, nullptr);
  std::shared_ptr<Agent> joined = group->Join(RegisterTestFunctions);
  ASSERT_NE(joined, nullptr);
  ASSERT_TRUE((*group)[0].Sync<std::string>("worker2", "whoami").ok());
  ASSERT_TRUE((*group)[1].Sync<std::string>("worker2", "whoami").ok());
  ASSERT_TRUE(joined->Shutdown(/*graceful=*/false).ok());  // gone, no barrier keys
  const absl::Time start = absl::Now();
  std::thread t1([&] { EXPECT_TRUE((*group)[1].Shutdown().ok()); });
  EXPECT_TRUE((*group)[0].Shutdown().ok());
  t1.join();
  EXPECT_LT(absl::Now() - start, base.shutdown_timeout / 3);
}

}  // namespace
}  // namespace gw::rpc::testing
