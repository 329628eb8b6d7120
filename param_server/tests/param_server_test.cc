// Parameter servers over real loopback connections (agents on threads of this process):
// sharding, synchronous and asynchronous tables, a missing trainer.
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/match.h"

#include "agent_group.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"
#include "gradwire/param_server/sharding.h"
#include "gradwire/tensor/kernels.h"
#include "samples.h"

namespace gw::param_server {
namespace {

TEST(ShardingTest, DenseRangesCoverEveryKeyOnceForOneToSevenServers) {
  for (int servers = 1; servers <= 7; ++servers) {
    for (int64_t size : {0, 1, 5, 6, 7, 13, 100, 1000003}) {
      std::vector<KeyRange> r = ShardDense(size, servers);
      ASSERT_EQ(r.size(), static_cast<size_t>(servers));
      int64_t next = 0, shortest = size, longest = 0;
      for (const KeyRange& k : r) {
        EXPECT_EQ(k.begin, next) << servers << " servers, size " << size;  // no gap, no overlap
        next = k.end;
        shortest = std::min(shortest, k.size());
        longest = std::max(longest, k.size());
      }
      EXPECT_EQ(next, size) << servers << " servers: the tail is covered";
      EXPECT_LE(longest - shortest, 1);
    }
  }
  EXPECT_THROW(ShardDense(10, 0), gw::Error);
}

TEST(ShardingTest, SparseIdsSpreadEvenlyAndAddingOrRemovingAServerMovesOnlyItsShare) {
  constexpr int kIds = 60000;
  const IdPlacement three({"ps0", "ps1", "ps2"});
  std::vector<int> count(3, 0);
  for (uint64_t id = 0; id < kIds; ++id) ++count[static_cast<size_t>(three.ServerOf(id))];
  for (int c : count) EXPECT_NEAR(c, kIds / 3, kIds / 3 * 0.15);  // 256 points per server
  // A fourth server takes about a quarter, from each of the others; nothing else moves.
  const IdPlacement four({"ps0", "ps1", "ps2", "ps3"});
  int moved = 0;
  for (uint64_t id = 0; id < kIds; ++id) {
    const int before = three.ServerOf(id), after = four.ServerOf(id);
    if (before != after) {
      ++moved;
      EXPECT_EQ(after, 3) << "id " << id << " moved between two old servers";
    }
  }
  EXPECT_NEAR(moved, kIds / 4, kIds / 4 * 0.2);
  // Removing ps1 moves its rows only; the order of the names does not matter.
  const IdPlacement without({"ps2", "ps0"});
  for (uint64_t id = 0; id < kIds; ++id) {
    const int before = three.ServerOf(id);
    if (before != 1) {
      EXPECT_EQ(without.ServerOf(id), before == 0 ? 1 : 0) << "id " << id;
    }
  }
  EXPECT_THROW(IdPlacement({}), gw::Error);
}

// Three servers (ranks 0-2) and two trainers (ranks 3-4).
struct Deployment {
  std::vector<std::shared_ptr<ParameterServer>> servers{3};
  std::unique_ptr<rpc::testing::AgentGroup> group;
  explicit Deployment(std::shared_ptr<rpc::FaultInjector> faults = nullptr) {
    rpc::AgentOptions o;
    o.transport_options.faults = std::move(faults);
    o.shutdown_timeout = absl::Seconds(5);
    group = rpc::testing::AgentGroup::Start(
        5,
        [this](rpc::Agent& a) {
          if (a.self().rank < 3) servers[static_cast<size_t>(a.self().rank)] = *ParameterServer::Install(a);
        },
        o);
  }
  Client MakeClient(int trainer, absl::Duration timeout = absl::Seconds(20)) {
    return MakeClient(trainer, ClientOptions{.sync_timeout = timeout});
  }
  Client MakeClient(int trainer, ClientOptions options) {
    return Client((*group)[3 + trainer], {"worker0", "worker1", "worker2"}, trainer, 2, options);
  }
};

TEST(ParameterServerTest, SynchronousStepsAverageBothTrainersAndPullsWaitForThem) {
  Deployment d;
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0), c1 = d.MakeClient(1);
  const Tensor init = Tensor::Zeros({2, 5});  // 10 keys over 3 servers: 4 + 3 + 3
  ASSERT_TRUE(c0.CreateDense("w", init, optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
  ASSERT_TRUE(c1.CreateDense("w", init, optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
  for (int64_t step = 0; step < 3; ++step) {
    // Trainer 0 pushes first: its pull of the next step waits for trainer 1.
    Future<Tensor> next0 = c0.PushPull("w", step, Tensor::Full({2, 5}, 1.0));
    EXPECT_FALSE(next0.WaitFor(absl::Milliseconds(100)).ok()) << "step " << step << " applied without trainer 1";
    Future<Tensor> next1 = c1.PushPull("w", step, Tensor::Full({2, 5}, 2.0));
    absl::StatusOr<Tensor> v0 = next0.Get(absl::Seconds(20)), v1 = next1.Get(absl::Seconds(20));
    ASSERT_TRUE(v0.ok()) << v0.status();
    ASSERT_TRUE(v1.ok()) << v1.status();
    // The mean gradient 1.5 applied once per step.
    EXPECT_EQ(v0->sizes(), Shape({2, 5}));
    EXPECT_EQ(v0->ToVector<float>(), std::vector<float>(10, -1.5f * static_cast<float>(step + 1)));
    EXPECT_EQ(kernels::MaxAbsDiff(*v0, *v1), 0.0);
  }
  for (auto& s : d.servers) EXPECT_EQ(s->num_shards(), 1u);
  // What a metrics endpoint exports of the table and its trainers: each server's clock,
  // trainers, rows and updates; each trainer's pushes and its last one's clock.
  // Trainer 0 pushes step 3 alone: the step waits for trainer 1.
  ASSERT_TRUE(c0.Push("w", 3, Tensor::Full({2, 5}, 1.0)).Get(absl::Seconds(20)).ok());
  using rpc::testing::SampleValue;
  const std::vector<rpc::Sample> server = (*d.group)[0].statistics().Collect();
  const std::map<std::string, std::string> w = {{"table", "w"}};
  EXPECT_EQ(SampleValue(server, "gradwire_ps_table_clock", w), 3);
  EXPECT_EQ(SampleValue(server, "gradwire_ps_table_step_pushed", w), 1);
  EXPECT_EQ(SampleValue(server, "gradwire_ps_table_step_trainers", w), 2);
  EXPECT_EQ(SampleValue(server, "gradwire_ps_table_rows", w), 4);
  EXPECT_EQ(SampleValue(server, "gradwire_ps_table_updates_total", w), 3);
  EXPECT_EQ(SampleValue(server, "gradwire_ps_table_waiting_pulls", w), 0);
  const std::vector<rpc::Sample> trainer = (*d.group)[3].statistics().Collect();
  EXPECT_EQ(SampleValue(trainer, "gradwire_ps_client_pushes_total", {{"trainer", "0"}}), 4);
  EXPECT_EQ(SampleValue(trainer, "gradwire_ps_client_last_clock", {{"trainer", "0"}}), 3);
  const double pushed_at = SampleValue(trainer, "gradwire_ps_client_last_push_time_seconds", {{"trainer", "0"}});
  EXPECT_NEAR(pushed_at, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), 60);
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

// Three trainers: the first two pushes of a step are summed as they arrive, the third
// completes the average (one server, trainers on ranks 1-3).
TEST(ParameterServerTest, ThreeSynchronousTrainersAverageAllThreePushes) {
  std::shared_ptr<ParameterServer> server;
  auto group = rpc::testing::AgentGroup::Start(4, [&](rpc::Agent& a) {
    if (a.self().rank == 0) server = *ParameterServer::Install(a);
  });
  ASSERT_NE(group, nullptr);
  std::vector<std::unique_ptr<Client>> clients;
  for (int t = 0; t < 3; ++t) clients.push_back(std::make_unique<Client>((*group)[1 + t], std::vector<std::string>{"worker0"}, t, 3));
  for (auto& c : clients) ASSERT_TRUE(c->CreateDense("w", Tensor::Zeros({5}), optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
  std::vector<Future<Tensor>> next;
  for (int t = 0; t < 3; ++t) next.push_back(clients[static_cast<size_t>(t)]->PushPull("w", 0, Tensor::Full({5}, 1.0 + t)));
  for (Future<Tensor>& f : next) {
    absl::StatusOr<Tensor> v = f.Get(absl::Seconds(20));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->ToVector<float>(), std::vector<float>(5, -2.0f));  // 0 - 1.0 * mean(1, 2, 3)
  }
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(ParameterServerTest, PushPullManyExchangesSeveralTablesInOneMessagePerServer) {
  Deployment d;
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0), c1 = d.MakeClient(1);
  for (Client* c : {&c0, &c1}) {
    ASSERT_TRUE(c->CreateDense("a", Tensor::Zeros({3, 3}), optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
    ASSERT_TRUE(c->CreateDense("b", Tensor::Ones({2}), optim::Sgd{.lr = 0.5}, Consistency::kSync).ok());
  }
  Future<std::vector<Tensor>> f0 = c0.PushPullMany({"a", "b"}, 0, {Tensor::Ones({3, 3}), Tensor::Full({2}, 2.0)});
  Future<std::vector<Tensor>> f1 = c1.PushPullMany({"a", "b"}, 0, {Tensor::Full({3, 3}, 3.0), Tensor::Full({2}, 4.0)});
  absl::StatusOr<std::vector<Tensor>> r0 = f0.Get(absl::Seconds(20)), r1 = f1.Get(absl::Seconds(20));
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_EQ(r0->size(), 2u);
  EXPECT_EQ((*r0)[0].sizes(), Shape({3, 3}));
  EXPECT_EQ((*r0)[0].ToVector<float>(), std::vector<float>(9, -2.0f));  // 0 - 1.0 * mean(1, 3)
  EXPECT_EQ((*r0)[1].ToVector<float>(), std::vector<float>(2, -0.5f));  // 1 - 0.5 * mean(2, 4)
  EXPECT_EQ(kernels::MaxAbsDiff((*r1)[0], (*r0)[0]), 0.0);
  EXPECT_EQ(c0.PushPullMany({"a"}, 1, {Tensor::Ones({2})}).Get().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

TEST(ParameterServerTest, AsynchronousPushesApplyAtOnce) {
  Deployment d;
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0);
  ASSERT_TRUE(c0.CreateDense("a", Tensor::Ones({7}), optim::Sgd{.lr = 0.5}, Consistency::kAsync).ok());
  ASSERT_TRUE(c0.Push("a", 0, Tensor::Ones({7})).Get().ok());
  ASSERT_TRUE(c0.Push("a", 0, Tensor::Ones({7})).Get().ok());  // no step bookkeeping
  absl::StatusOr<Tensor> v = c0.Pull("a", 0).Get();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->ToVector<float>(), std::vector<float>(7, 0.0f));
  EXPECT_EQ(c0.Push("a", 0, Tensor::Ones({3})).Get().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c0.Pull("nope", 0).Get().status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

TEST(ParameterServerTest, ASynchronousStepMissingATrainerFailsNamingIt) {
  Deployment d;
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0, absl::Milliseconds(300));
  ASSERT_TRUE(c0.CreateDense("s", Tensor::Zeros({4}), optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<Tensor> next = c0.PushPull("s", 0, Tensor::Ones({4})).Get(absl::Seconds(20));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kDeadlineExceeded) << next.status();
  EXPECT_NE(next.status().message().find("trainer 1"), std::string::npos) << next.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

// Bounded staleness 1: a fast trainer may run one clock ahead of a slow one, not two.
TEST(ParameterServerTest, BoundedStalenessHoldsTheFastTrainerBack) {
  Deployment d;
  ASSERT_NE(d.group, nullptr);
  Client fast = d.MakeClient(0, absl::Seconds(2)), slow = d.MakeClient(1, absl::Seconds(2));
  const Tensor init = Tensor::Zeros({6});
  ASSERT_TRUE(fast.CreateDense("t", init, optim::Sgd{.lr = 1.0}, Consistency::kBoundedStaleness, 1).ok());
  ASSERT_TRUE(slow.CreateDense("t", init, optim::Sgd{.lr = 1.0}, Consistency::kBoundedStaleness, 1).ok());
  // fast: clock 1 after its first push; a pull for clock 1 needs everyone at >= 0: fine.
  absl::StatusOr<Tensor> v = fast.PushPull("t", 0, Tensor::Ones({6})).Get(absl::Seconds(10));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->ToVector<float>(), std::vector<float>(6, -1.0f));  // applied at once
  // fast: clock 2; a pull for clock 2 needs the slow trainer at >= 1: it waits...
  Future<Tensor> ahead = fast.PushPull("t", 1, Tensor::Ones({6}));
  EXPECT_FALSE(ahead.WaitFor(absl::Milliseconds(150)).ok()) << "the fast trainer ran two clocks ahead";
  // Its metrics say how far apart the trainers are: clocks 2 and 0.
  EXPECT_EQ(
      rpc::testing::SampleValue((*d.group)[0].statistics().Collect(), "gradwire_ps_table_staleness", {{"table", "t"}}),
      2);
  // ... until the slow trainer pushes once.
  ASSERT_TRUE(slow.Push("t", 0, Tensor::Ones({6})).Get().ok());
  absl::StatusOr<Tensor> after = ahead.Get(absl::Seconds(10));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->ToVector<float>(), std::vector<float>(6, -3.0f));
  // A trainer that stops altogether: the fast one fails, naming it.
  absl::StatusOr<Tensor> stuck = fast.PushPull("t", 2, Tensor::Ones({6})).Get(absl::Seconds(10));
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kDeadlineExceeded) << stuck.status();
  EXPECT_NE(stuck.status().message().find("trainer 1"), std::string::npos) << stuck.status();
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::param_server

namespace gw::param_server {
namespace {

// The same synchronous SGD step two ways, on two fresh deployments of 2 servers: explicit
// Pull / Push, and distributed autograd over the tables' shard RRefs with a
// DistributedOptimizer applying the update on the servers. Pulls then see equal tables.
TEST(ParameterServerTest, TheSameStepThroughPushPullAndThroughDistributedAutograd) {
  const optim::Sgd sgd{.lr = 0.1};
  Generator gen(12);
  const Tensor w0 = Tensor::Randn({5, 3}, gen), b0 = Tensor::Randn({3}, gen), x = Tensor::Randn({4, 5}, gen);
  auto loss_of = [&](const Tensor& w, const Tensor& b) {
    Tensor y = Add(MatMul(x, w), b);
    return Sum(Mul(y, y));
  };
  auto deploy = [](std::vector<std::shared_ptr<dist_autograd::DistAutograd>>& engines) {
    engines.assign(3, nullptr);
    return rpc::testing::AgentGroup::Start(3, [&](rpc::Agent& a) -> absl::Status {
      if (a.self().rank < 2) {
        if (absl::Status s = ParameterServer::Install(a).status(); !s.ok()) return s;
      }
      return rpc::Assign(dist_autograd::DistAutograd::Install(a), engines[static_cast<size_t>(a.self().rank)]);
    });
  };
  Tensor w_push, b_push;
  {  // explicit: pull, local autograd, push the gradients, pull the next step
    std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines;
    auto g = deploy(engines);
    ASSERT_NE(g, nullptr);
    Client c((*g)[2], {"worker0", "worker1"}, 0, 1);
    ASSERT_TRUE(c.CreateDense("w", w0, sgd, Consistency::kSync).ok());
    ASSERT_TRUE(c.CreateDense("b", b0, sgd, Consistency::kSync).ok());
    Tensor w = *c.Pull("w", 0).Get(), b = *c.Pull("b", 0).Get();
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    autograd::Backward({loss_of(w, b)});
    ASSERT_TRUE(c.Push("w", 0, w.grad()).Get().ok());
    ASSERT_TRUE(c.Push("b", 0, b.grad()).Get().ok());
    w_push = *c.Pull("w", 1).Get();
    b_push = *c.Pull("b", 1).Get();
    (void)g->ShutdownAll();
  }
  std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines;
  auto g = deploy(engines);
  ASSERT_NE(g, nullptr);
  Client c((*g)[2], {"worker0", "worker1"}, 0, 1);
  ASSERT_TRUE(c.CreateDense("w", w0, sgd, Consistency::kAsync).ok());
  ASSERT_TRUE(c.CreateDense("b", b0, sgd, Consistency::kAsync).ok());
  absl::StatusOr<std::vector<rpc::RRef<Tensor>>> w_shards = c.ShardRRefs("w"), b_shards = c.ShardRRefs("b");
  ASSERT_TRUE(w_shards.ok()) << w_shards.status();
  ASSERT_TRUE(b_shards.ok()) << b_shards.status();
  std::vector<rpc::RRef<Tensor>> all = *w_shards;
  all.insert(all.end(), b_shards->begin(), b_shards->end());
  auto optimizer = dist_autograd::DistributedOptimizer::Create((*g)[2], sgd, all);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  {
    dist_autograd::Context ctx(*engines[2]);
    absl::StatusOr<Tensor> w = c.FetchDense("w", *w_shards), b = c.FetchDense("b", *b_shards);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(ctx.Backward({loss_of(*w, *b)}).ok());
    ASSERT_TRUE((*optimizer)->Step(ctx).ok());
  }
  const Tensor w_dist = *c.Pull("w", 1).Get(), b_dist = *c.Pull("b", 1).Get();
  ASSERT_EQ(w_dist.sizes(), w_push.sizes());
  for (int64_t i = 0; i < w_dist.numel(); ++i) EXPECT_NEAR(w_dist.data<float>()[i], w_push.data<float>()[i], 1e-6) << i;
  for (int64_t i = 0; i < b_dist.numel(); ++i) EXPECT_NEAR(b_dist.data<float>()[i], b_push.data<float>()[i], 1e-6) << i;
  double change = 0;
  for (int64_t i = 0; i < w0.numel(); ++i) change += std::abs(w0.data<float>()[i] - w_dist.data<float>()[i]);
  EXPECT_GT(change, 1e-3) << "the step changed the table";
  optimizer->reset();
  all.clear();
  w_shards->clear();
  b_shards->clear();
  EXPECT_TRUE(g->ShutdownAll().ok()) << "no RRef is left referenced";
}

// ------------------------------------------------------------------ under faults

// Two synchronous trainers push integer gradients (trainer t at step k: k + t + 1 on
// every key) for `steps` steps through PushPull; the table must follow the fault-free
// result exactly: init - lr * mean, once per step. The first failure is returned,
// naming its step.
absl::Status TrainInLockstep(Deployment& d, ClientOptions options, int steps) {
  Client c0 = d.MakeClient(0, options), c1 = d.MakeClient(1, options);
  const Tensor init = Tensor::Full({3, 7}, 100.0);  // 21 keys over 3 servers
  for (Client* c : {&c0, &c1}) {
    if (absl::Status s = c->CreateDense("w", init, optim::Sgd{.lr = 1.0}, Consistency::kSync); !s.ok()) return s;
  }
  float expected = 100.0f;
  for (int step = 0; step < steps; ++step) {
    Future<Tensor> n0 = c0.PushPull("w", step, Tensor::Full({3, 7}, step + 1.0));
    Future<Tensor> n1 = c1.PushPull("w", step, Tensor::Full({3, 7}, step + 2.0));
    expected -= static_cast<float>(step) + 1.5f;  // the mean of the two pushes
    for (Future<Tensor>* f : {&n0, &n1}) {
      absl::StatusOr<Tensor> v = f->Get(absl::Seconds(60));
      if (!v.ok()) return absl::Status(v.status().code(), absl::StrCat("step ", step, ": ", v.status().message()));
      EXPECT_EQ(v->ToVector<float>(), std::vector<float>(21, expected)) << "step " << step;
    }
  }
  return absl::OkStatus();
}

TEST(ParameterServerFaultTest, SynchronousTrainingUnderRecoverableLinkFaultsIsExact) {
  auto faults = rpc::testing::InjectFaults("drop:0.05,delay:0ms-1ms,duplicate:0.05,reorder:4,seed:41");
  Deployment d(faults);
  ASSERT_NE(d.group, nullptr);
  absl::Status trained = TrainInLockstep(d, ClientOptions{.sync_timeout = absl::Seconds(20)}, 30);
  EXPECT_TRUE(trained.ok()) << trained;
  rpc::testing::ExpectRepairedWithoutCloses(*faults);
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

// Connections that close every few frames: with reconnection, every step completes and
// the table is exactly the fault-free one, so no acknowledged update was lost (and none
// applied twice: a retried push of a step is counted once).
TEST(ParameterServerFaultTest, SynchronousTrainingUnderClosingConnectionsLosesNoUpdate) {
  auto faults = rpc::testing::InjectFaults("close_after:30,seed:42");
  Deployment d(faults);
  ASSERT_NE(d.group, nullptr);
  absl::Status trained = TrainInLockstep(
      d, ClientOptions{.sync_timeout = absl::Seconds(20), .reconnect_timeout = absl::Seconds(20)}, 30);
  EXPECT_TRUE(trained.ok()) << trained;
  EXPECT_GE(faults->stats().connections_closed, 5u) << faults->stats().ToString();
  faults->Set(rpc::FaultSpec{});
  (void)d.group->ShutdownAll();  // bounded by shutdown_timeout
}

// Without reconnection, a step that meets a closing connection fails at once, naming
// the server it could not reach; steps before it were applied exactly.
TEST(ParameterServerFaultTest, WithoutReconnectionAClosedConnectionFailsTheStepNamingTheServer) {
  auto faults = rpc::testing::InjectFaults("close_after:30,seed:43");
  Deployment d(faults);
  ASSERT_NE(d.group, nullptr);
  const absl::Time start = absl::Now();
  absl::Status trained = TrainInLockstep(d, ClientOptions{.sync_timeout = absl::Seconds(5)}, 30);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_TRUE(trained.code() == absl::StatusCode::kUnavailable || trained.code() == absl::StatusCode::kDeadlineExceeded)
      << trained;
  EXPECT_TRUE(absl::StrContains(trained.message(), "worker")) << "names no worker: " << trained;
  faults->Set(rpc::FaultSpec{});
  (void)d.group->ShutdownAll();
}

// Asynchronous pushes under closing connections, with reconnection: every acknowledged
// push is in the table (asynchronous tables apply a retried push again, so at least
// once: client.h).
TEST(ParameterServerFaultTest, AsynchronousPushesUnderClosingConnectionsAreAllApplied) {
  auto faults = rpc::testing::InjectFaults("close_after:20,seed:44");
  Deployment d(faults);
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0, ClientOptions{.sync_timeout = absl::Seconds(20), .reconnect_timeout = absl::Seconds(20)});
  ASSERT_TRUE(c0.CreateDense("a", Tensor::Zeros({9}), optim::Sgd{.lr = 1.0}, Consistency::kAsync).ok());
  int acknowledged = 0;
  for (int k = 0; k < 60; ++k) {
    absl::StatusOr<bool> pushed = c0.Push("a", k, Tensor::Ones({9})).Get(absl::Seconds(60));
    EXPECT_TRUE(pushed.ok()) << "push " << k << ": " << pushed.status();
    if (pushed.ok()) ++acknowledged;
  }
  faults->Set(rpc::FaultSpec{});
  absl::StatusOr<Tensor> v = c0.Pull("a", 60).Get(absl::Seconds(60));
  ASSERT_TRUE(v.ok()) << v.status();
  for (float x : v->ToVector<float>()) EXPECT_LE(x, -static_cast<float>(acknowledged)) << "an acknowledged push was lost";
  EXPECT_GE(faults->stats().connections_closed, 5u) << faults->stats().ToString();
  (void)d.group->ShutdownAll();
}

}  // namespace
}  // namespace gw::param_server
