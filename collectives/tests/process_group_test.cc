// Process groups across real processes: this test process is rank 0 and hosts the store;
// child processes (this binary re-run with GW_TEST_ROLE=member) are the other ranks.
// Large tensors cross through the shared-memory arena, and a member killed in the middle
// of an allreduce fails it on the others, naming it, long before the deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent_group.h"
#include "gradwire/collectives/collectives.h"
#include "gradwire/tensor/kernels.h"

namespace gw::collectives {
namespace {

constexpr int64_t kLarge = 4 << 20;  // float32 elements: 16 MiB

// Each member contributes rank + 1 everywhere, and i % 7 at element i.
Tensor Contribution(int rank) {
  Tensor t = kernels::ToDType(Tensor::Arange(0, kLarge, 1, DType::kInt64), DType::kFloat32);
  std::vector<float> v = t.ToVector<float>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int64_t>(i) % 7 + rank + 1);
  return Tensor::FromVector(v, {kLarge});
}

// The script every member runs: one large allreduce checked against the expected sums,
// then (rank 2) wait to be killed, or (others) an allreduce that rank 2 never joins.
// Returns the process exit code: 0 when every expectation held.
int RunMember(rpc::Agent& agent, ProcessGroup& group) {
  const int n = group.size();
  Tensor t = Contribution(group.rank());
  auto done = group.AllReduce(t).Get(absl::Seconds(60));
  if (!done.ok()) {
    std::fprintf(stderr, "%s: allreduce failed: %s\n", agent.self().name.c_str(), done.status().ToString().c_str());
    return 1;
  }
  const std::vector<float> v = t.ToVector<float>();
  for (size_t i = 0; i < v.size(); i += 4097) {
    const float want = static_cast<float>(n * (static_cast<int64_t>(i) % 7) + n * (n + 1) / 2);
    if (v[i] != want) {
      std::fprintf(stderr, "%s: element %zu is %f, want %f\n", agent.self().name.c_str(), i, v[i], want);
      return 1;
    }
  }
  if (agent.transport_stats().shared_memory_tensors == 0) {
    std::fprintf(stderr, "%s: nothing went through shared memory\n", agent.self().name.c_str());
    return 1;
  }
  if (!agent.store().Set(absl::StrCat("first_done/", agent.self().name), "1").ok()) return 1;
  if (group.rank() == 2) {
    ::pause();  // until the test kills it (or, should the test die first, PR_SET_PDEATHSIG)
    return 3;
  }
  const absl::Time start = absl::Now();
  Future<Tensor> pending = group.AllReduce(Contribution(group.rank()));  // waits for rank 2
  if (!agent.store().Set(absl::StrCat("second_issued/", agent.self().name), "1").ok()) return 1;
  auto second = pending.Get(absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  if (second.ok() || second.status().code() != absl::StatusCode::kUnavailable ||
      second.status().message().find("worker2") == std::string::npos || took > absl::Seconds(20)) {
    std::fprintf(stderr, "%s: the allreduce rank 2 never joined ended after %s with %s\n", agent.self().name.c_str(),
                 absl::FormatDuration(took).c_str(), second.status().ToString().c_str());
    return 1;
  }
  return 0;
}

int RunChild() {
  auto options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return 2;
  std::shared_ptr<Collectives> layer;
  auto agent = rpc::Agent::Start(*options, [&](rpc::Agent& a) { return rpc::Assign(Collectives::Install(a), layer); });
  if (!agent.ok()) {
    std::fprintf(stderr, "child: %s\n", agent.status().ToString().c_str());
    return 2;
  }
  auto group = layer->NewGroup();
  if (!group.ok()) return 2;
  const int code = RunMember(**agent, **group);
  (*group)->Close();
  (void)(*agent)->Shutdown(/*graceful=*/false);
  return code;
}

TEST(ProcessGroupProcessTest, LargeAllReduceThroughSharedMemoryThenAKilledMemberFailsTheOthersNamingIt) {
  constexpr int kWorld = 3;
  auto server = rpc::StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  (*server)->Shutdown();
  std::vector<pid_t> children;
  for (int r = 1; r < kWorld; ++r) {
    children.push_back(rpc::testing::SpawnSelf(
        "member", {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(kWorld)},
                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}}));
  }
  rpc::AgentOptions o;
  o.world_size = kWorld;
  o.rendezvous = absl::StrCat("127.0.0.1:", port);
  std::shared_ptr<Collectives> layer;
  auto agent = rpc::Agent::Start(o, [&](rpc::Agent& a) { return rpc::Assign(Collectives::Install(a), layer); });
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto group = layer->NewGroup();
  ASSERT_TRUE(group.ok()) << group.status();
  // Rank 2 is killed once it finished the first allreduce and both others have issued the
  // second, which waits for rank 2.
  std::thread killer([&] {
    (void)(*agent)->store().Wait({"first_done/worker2", "second_issued/worker0", "second_issued/worker1"},
                                 absl::Seconds(60));
    kill(children[1], SIGKILL);
  });
  EXPECT_EQ(RunMember(**agent, **group), 0);
  killer.join();
  EXPECT_EQ(rpc::testing::WaitForExit(children[0]), 0);
  EXPECT_EQ(rpc::testing::WaitForExit(children[1]), 128 + SIGKILL);
  (*group)->Close();
  (void)(*agent)->Shutdown(/*graceful=*/false);
}

}  // namespace
}  // namespace gw::collectives

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_TEST_ROLE")) {
    if (std::string(role) == "member") return gw::collectives::RunChild();
    std::fprintf(stderr, "unknown GW_TEST_ROLE %s\n", role);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
