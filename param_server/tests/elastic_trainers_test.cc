// Elastic trainers (client.h): a trainer joins a running parameter-server job (its worker
// joins the agents' group, rpc agent.h) and another leaves it, over real loopback
// connections; synchronous steps re-form at a step boundary with the trainers taking
// part, asynchronous and bounded-staleness tables take the newcomer at once.
#include <gtest/gtest.h>

#include <thread>

#include "agent_group.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"
#include "gradwire/tensor/kernels.h"

namespace gw::param_server {
namespace {

// Two servers (ranks 0-1) and two trainers (ranks 2-3); the group may grow to 5.
struct ElasticDeployment {
  std::vector<std::shared_ptr<ParameterServer>> servers{2};
  std::unique_ptr<rpc::testing::AgentGroup> group;
  std::vector<std::string> names{"worker0", "worker1"};

  ElasticDeployment() {
    rpc::AgentOptions o;
    o.max_world_size = 5;
    o.shutdown_timeout = absl::Seconds(10);
    group = rpc::testing::AgentGroup::Start(
        4,
        [this](rpc::Agent& a) {
          if (a.self().rank < 2) servers[static_cast<size_t>(a.self().rank)] = *ParameterServer::Install(a);
        },
        o);
  }
  // A new worker joins the running group.
  std::shared_ptr<rpc::Agent> Join() {
    rpc::AgentOptions o;
    o.shutdown_timeout = absl::Seconds(10);
    return group->Join({}, o);
  }
};

// Pushes `grads[i]` for trainer i at `clock` (all at once) and returns what each pulled.
std::vector<Tensor> Step(const std::vector<Client*>& trainers, const std::string& table, int64_t clock,
                         const std::vector<float>& grads, int64_t n) {
  std::vector<Future<Tensor>> next;
  for (size_t i = 0; i < trainers.size(); ++i) next.push_back(trainers[i]->PushPull(table, clock, Tensor::Full({n}, grads[i])));
  std::vector<Tensor> out;
  for (Future<Tensor>& f : next) {
    absl::StatusOr<Tensor> v = f.Get(absl::Seconds(20));
    EXPECT_TRUE(v.ok()) << "step " << clock << ": " << v.status();
    out.push_back(v.ok() ? *v : Tensor());
  }
  return out;
}

TEST(ElasticTrainersTest, ATrainerJoinsAtAStepBoundaryAndAnotherLeaves) {
  ElasticDeployment d;
  ASSERT_NE(d.group, nullptr);
  constexpr int64_t kN = 9;  // 5 + 4 keys over the two servers
  Client c0((*d.group)[2], d.names, 0, 2), c1((*d.group)[3], d.names, 1, 2);
  for (Client* c : {&c0, &c1}) {
    ASSERT_TRUE(c->CreateDense("sync", Tensor::Zeros({kN}), optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
    ASSERT_TRUE(c->CreateDense("async", Tensor::Zeros({kN}), optim::Sgd{.lr = 1.0}, Consistency::kAsync).ok());
    ASSERT_TRUE(c->CreateDense("bounded", Tensor::Zeros({kN}), optim::Sgd{.lr = 1.0}, Consistency::kBoundedStaleness, 1).ok());
  }
  // Two steps of the first two trainers: mean gradient 2 each.
  for (int64_t clock = 0; clock < 2; ++clock) {
    std::vector<Tensor> v = Step({&c0, &c1}, "sync", clock, {1, 3}, kN);
    EXPECT_EQ(v[0].ToVector<float>(), std::vector<float>(kN, -2.0f * static_cast<float>(clock + 1)));
  }
  for (int64_t clock = 0; clock < 3; ++clock) {
    for (Client* c : {&c0, &c1}) ASSERT_TRUE(c->Push("bounded", clock, Tensor::Ones({kN})).Get().ok());
  }

  // A third trainer's worker joins the job, then the tables.
  std::shared_ptr<rpc::Agent> joiner = d.Join();
  ASSERT_NE(joiner, nullptr);
  EXPECT_EQ(joiner->self().name, "worker4");
  Client c2(*joiner, d.names, 2, 2);
  ASSERT_TRUE(c2.CreateDense("sync", Tensor::Zeros({kN}), optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
  ASSERT_TRUE(c2.CreateDense("async", Tensor::Zeros({kN}), optim::Sgd{.lr = 1.0}, Consistency::kAsync).ok());
  ASSERT_TRUE(c2.CreateDense("bounded", Tensor::Zeros({kN}), optim::Sgd{.lr = 1.0}, Consistency::kBoundedStaleness, 1).ok());
  absl::StatusOr<int64_t> from = c2.Join("sync");
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, 2);  // the next step boundary
  EXPECT_EQ(*c2.Join("sync"), 2);  // idempotent
  absl::StatusOr<Tensor> now = c2.Pull("sync", *from).Get(absl::Seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->ToVector<float>(), std::vector<float>(kN, -4.0f));

  // Step 2 waits for all three: the mean of 1, 3 and 5.
  Future<Tensor> early = c0.PushPull("sync", 2, Tensor::Full({kN}, 1.0));
  EXPECT_FALSE(early.WaitFor(absl::Milliseconds(100)).ok()) << "step 2 completed without the trainer that joined";
  std::vector<Tensor> v = Step({&c1, &c2}, "sync", 2, {3, 5}, kN);
  EXPECT_EQ(v[1].ToVector<float>(), std::vector<float>(kN, -7.0f));
  ASSERT_TRUE(early.Get(absl::Seconds(10)).ok());

  // Asynchronous: at once. Bounded staleness: from the furthest clock (3), holding
  // nobody back: the others' pull for clock 4 does not wait for it.
  EXPECT_EQ(*c2.Join("async"), 0);
  ASSERT_TRUE(c2.Push("async", 0, Tensor::Ones({kN})).Get().ok());
  EXPECT_EQ(c0.Pull("async", 0).Get()->ToVector<float>(), std::vector<float>(kN, -1.0f));
  absl::StatusOr<int64_t> bounded = c2.Join("bounded");
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_EQ(*bounded, 3);
  EXPECT_TRUE(c0.Pull("bounded", 4).Get(absl::Seconds(5)).ok());
  ASSERT_TRUE(c2.Push("bounded", 3, Tensor::Ones({kN})).Get().ok());

  // Trainer 1 leaves after its push of step 2 (and its worker leaves the job): step 3 is
  // the mean of the two that remain (1 and 5), and nothing waits for trainer 1.
  ASSERT_TRUE(c1.Leave("sync", 2).ok());
  ASSERT_TRUE(c1.Leave("bounded", 2).ok());
  ASSERT_TRUE((*d.group)[3].Leave().ok());
  v = Step({&c0, &c2}, "sync", 3, {1, 5}, kN);
  EXPECT_EQ(v[0].ToVector<float>(), std::vector<float>(kN, -10.0f));
  EXPECT_TRUE(c2.Pull("bounded", 4).Get(absl::Seconds(5)).ok());

  std::vector<std::thread> rest;
  for (int r : {0, 1, 2}) rest.emplace_back([&, r] { EXPECT_TRUE((*d.group)[r].Shutdown().ok()) << "worker" << r; });
  EXPECT_TRUE(joiner->Shutdown().ok());
  for (auto& t : rest) t.join();
}

}  // namespace
}  // namespace gw::param_server
