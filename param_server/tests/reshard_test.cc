// Re-sharding (client.h): while two trainers train, a server joins the job and a dense
// table and a sparse one are moved onto it (then a server is taken out), over real
// loopback connections. Every step's values must be those of the same updates run
// locally: no acknowledged push lost, none counted twice, optimizer state moved along.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "agent_group.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"
#include "gradwire/tensor/kernels.h"
#include "resplit.h"

namespace gw::param_server {
namespace {

// Two servers (ranks 0-1) and two trainers (ranks 2-3); a third server may join.
struct Deployment {
  std::vector<std::shared_ptr<ParameterServer>> servers{2};
  std::unique_ptr<rpc::testing::AgentGroup> group;
  std::shared_ptr<ParameterServer> joined_server;
  std::shared_ptr<rpc::Agent> joined;

  Deployment() {
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
  // A server worker joins the running job ("worker4").
  bool AddServer() {
    rpc::AgentOptions o;
    o.shutdown_timeout = absl::Seconds(10);
    joined = group->Join(
        [this](rpc::Agent& agent) { return rpc::Assign(ParameterServer::Install(agent), joined_server); }, o);
    return joined != nullptr;
  }
  void ShutdownAll() {
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) threads.emplace_back([this, r] { EXPECT_TRUE((*group)[r].Shutdown().ok()) << r; });
    if (joined) {
      EXPECT_TRUE(joined->Shutdown().ok());
    }
    for (auto& t : threads) t.join();
  }
};

const std::vector<std::string> kTwo{"worker0", "worker1"};

// How far trainer 0 got, awaited (the trainers run as fast as they can; the test acts
// between their steps without pausing them).
class Progress {
 public:
  void Set(int64_t steps) {
    absl::MutexLock lock(&mu_);
    steps_ = steps;
  }
  // Waits until at least `steps` are done; returns how many are.
  int64_t Await(int64_t steps) {
    absl::MutexLock lock(&mu_);
    auto reached = [&] { return steps_ >= steps; };
    mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(60));
    return steps_;
  }

 private:
  absl::Mutex mu_;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(ReshardTest, ADenseSynchronousTableMovesOntoAJoinedServerAndOffAnOldOneWhileTrainersTrain) {
  Deployment d;
  ASSERT_NE(d.group, nullptr);
  constexpr int64_t kKeys = 1001;
  const optim::OptimizerConfig sgd = optim::Sgd{.lr = 0.1, .momentum = 0.9};
  Client c0((*d.group)[2], kTwo, 0, 2), c1((*d.group)[3], kTwo, 1, 2);
  for (Client* c : {&c0, &c1}) ASSERT_TRUE(c->CreateDense("w", Tensor::Zeros({kKeys}), sgd, Consistency::kSync).ok());
  // Trainer t pushes 1 + t + (k % 8) / 8 at step k (mean 1.5 + (k % 8) / 8).
  auto mean = [](int64_t k) { return 1.5 + static_cast<double>(k % 8) / 8; };
  auto grad = [&](int t, int64_t k) { return Tensor::Full({kKeys}, mean(k) - 0.5 + t); };
  std::vector<std::vector<Tensor>> seen(2);
  Progress progress;
  // Both trainers stop at the same step: set once they are within one step of each other
  // (synchronous steps keep them so) and at least two steps before it.
  std::atomic<int64_t> stop_at{INT64_MAX};
  auto train = [&](Client& c, int t) {
    for (int64_t k = 0; k < stop_at.load(); ++k) {
      absl::StatusOr<Tensor> v = c.PushPull("w", k, grad(t, k)).Get(absl::Seconds(60));
      ASSERT_TRUE(v.ok()) << "trainer " << t << " step " << k << ": " << v.status();
      seen[static_cast<size_t>(t)].push_back(*v);
      if (t == 0) progress.Set(k + 1);
    }
  };
  std::thread t0(train, std::ref(c0), 0), t1(train, std::ref(c1), 1);
  // The new server joins and moves the table onto the three of them; later worker0 is
  // taken out. The trainers train on: their requests are only answered a little later.
  progress.Await(4);
  ASSERT_TRUE(d.AddServer());
  Client admin(*d.joined, kTwo, 99, 2);
  absl::Status added = admin.Reshard("w", {"worker0", "worker1", "worker4"});
  ASSERT_TRUE(added.ok()) << added;
  EXPECT_EQ(d.joined_server->num_shards(), 1u);
  const int64_t after_add = progress.Await(0);
  progress.Await(after_add + 8);
  absl::Status removed = admin.Reshard("w", {"worker1", "worker4"});
  ASSERT_TRUE(removed.ok()) << removed;
  EXPECT_EQ(d.servers[0]->num_shards(), 0u);
  stop_at = progress.Await(0) + 4;
  t0.join();
  t1.join();
  const int64_t kSteps = stop_at.load();

  // The same steps locally: every pulled value must match.
  Tensor w = Tensor::Zeros({kKeys});
  optim::ParamState state;
  for (int64_t k = 0; k < kSteps; ++k) {
    optim::Update(sgd, w, Tensor::Full({kKeys}, mean(k)), state);
    const double tolerance = 1e-5 * (1 + std::abs(w.ToVector<float>()[0]));  // float32 sums
    for (int t = 0; t < 2; ++t) {
      ASSERT_EQ(seen[static_cast<size_t>(t)].size(), static_cast<size_t>(kSteps));
      ASSERT_LT(kernels::MaxAbsDiff(seen[static_cast<size_t>(t)][static_cast<size_t>(k)], w), tolerance)
          << "trainer " << t << " step " << k;
    }
  }
  // A client that creates the table now finds it where it is.
  Client late(*d.joined, kTwo, 98, 2);
  ASSERT_TRUE(late.CreateDense("w", Tensor::Zeros({kKeys}), sgd, Consistency::kSync).ok());
  absl::StatusOr<Tensor> now = late.Pull("w", kSteps).Get(absl::Seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_LT(kernels::MaxAbsDiff(*now, w), 1e-5 * (1 + std::abs(w.ToVector<float>()[0])));
  // ... and may join it there (the trainer messages name the new layout too), and leave.
  absl::StatusOr<int64_t> from = late.Join("w");
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, kSteps);
  EXPECT_TRUE(late.Leave("w", kSteps - 1).ok());
  d.ShutdownAll();
}

TEST(ReshardTest, ASparseBoundedStalenessTableMovesOnlyTheRowsTheNewServerTakes) {
  Deployment d;
  ASSERT_NE(d.group, nullptr);
  constexpr int64_t kIds = 300, kDim = 4;
  const optim::OptimizerConfig sgd = optim::Sgd{.lr = 0.5};
  SparseOptions layout;
  layout.init = RowInit{RowInit::Kind::kUniform, -1, 1, 7};
  Client c0((*d.group)[2], kTwo, 0, 2), c1((*d.group)[3], kTwo, 1, 2);
  for (Client* c : {&c0, &c1}) {
    ASSERT_TRUE(c->CreateSparse("emb", kDim, layout, sgd, Consistency::kBoundedStaleness, 1).ok());
  }
  std::vector<int64_t> all(kIds);
  for (int64_t i = 0; i < kIds; ++i) all[static_cast<size_t>(i)] = i;
  const Tensor every = Tensor::FromVector(all, {kIds});
  absl::StatusOr<Tensor> initial = c0.PullRows("emb", 0, every).Get(absl::Seconds(10));
  ASSERT_TRUE(initial.ok()) << initial.status();
  // Trainer t at clock k pushes gradient (t + 1) for 20 ids starting at 37 k + 100 t.
  auto ids = [](int t, int64_t k) {
    std::vector<int64_t> v;
    for (int64_t j = 0; j < 20; ++j) v.push_back((37 * k + 100 * t + j) % kIds);
    return v;
  };
  Progress progress;
  // Set at least 2 clocks beyond either trainer (staleness 1 keeps them within 2).
  std::atomic<int64_t> stop_at{INT64_MAX};
  std::vector<int64_t> steps(2, 0);
  auto train = [&](Client& c, int t) {
    for (int64_t k = 0; k < stop_at.load(); ++k) {
      const std::vector<int64_t> v = ids(t, k);
      absl::Status pushed = c.PushRows("emb", k, Tensor::FromVector(v, {20}), Tensor::Full({20, kDim}, t + 1.0)).Get(
          absl::Seconds(60)).status();
      ASSERT_TRUE(pushed.ok()) << "trainer " << t << " clock " << k << ": " << pushed;
      absl::StatusOr<Tensor> rows = c.PullRows("emb", k + 1, Tensor::FromVector(v, {20})).Get(absl::Seconds(60));
      ASSERT_TRUE(rows.ok()) << "trainer " << t << " clock " << k << ": " << rows.status();
      steps[static_cast<size_t>(t)] = k + 1;
      if (t == 0) progress.Set(k + 1);
    }
  };
  std::thread t0(train, std::ref(c0), 0), t1(train, std::ref(c1), 1);
  progress.Await(8);
  ASSERT_TRUE(d.AddServer());
  Client admin(*d.joined, kTwo, 99, 2);
  absl::Status added = admin.Reshard("emb", {"worker0", "worker1", "worker4"});
  ASSERT_TRUE(added.ok()) << added;
  stop_at = progress.Await(0) + 4;
  t0.join();
  t1.join();
  const int64_t kSteps = stop_at.load();
  // Consistent hashing: the new server holds about a third of the rows, and the rows
  // that stayed did not move between the old two.
  absl::StatusOr<SparseShardStats> moved = d.joined_server->sparse_stats("emb");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_GT(moved->rows, kIds / 5);
  EXPECT_LT(moved->rows, kIds / 2);
  const IdPlacement two(kTwo), three({"worker0", "worker1", "worker4"});
  for (int64_t id = 0; id < kIds; ++id) {
    const auto u = static_cast<uint64_t>(id);
    if (three.ServerOf(u) != 2) {
      EXPECT_EQ(three.ServerOf(u), two.ServerOf(u)) << "id " << id;
    }
  }
  // Every push applied exactly once: rows = initial - lr * (sum of their gradients).
  std::map<int64_t, double> sum;
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(steps[static_cast<size_t>(t)], kSteps);
    for (int64_t k = 0; k < kSteps; ++k) {
      for (int64_t id : ids(t, k)) sum[id] += t + 1.0;
    }
  }
  absl::StatusOr<Tensor> final_rows = c0.PullRows("emb", kSteps, every).Get(absl::Seconds(10));
  ASSERT_TRUE(final_rows.ok()) << final_rows.status();
  for (int64_t id = 0; id < kIds; ++id) {
    for (int64_t j = 0; j < kDim; ++j) {
      const float want = initial->data<float>()[id * kDim + j] - 0.5f * static_cast<float>(sum[id]);
      ASSERT_NEAR(final_rows->data<float>()[id * kDim + j], want, 1e-5 * (1 + std::abs(want))) << "id " << id;
    }
  }
  d.ShutdownAll();
}

TEST(ReshardTest, ResplitCutsDenseKeysAndStateForTheNewServers) {
  internal::ShardForm a, b;
  for (auto* f : {&a, &b}) f->names = {"meta", "values", "state.momentum", "epoch"};
  a.tensors = {Tensor::Zeros({3}, DType::kInt64), Tensor::FromVector(std::vector<float>{0, 1, 2}, {3}),
               Tensor::FromVector(std::vector<float>{10, 11, 12}, {3}), Tensor::Scalar(0, DType::kInt64)};
  b.tensors = {Tensor::Zeros({3}, DType::kInt64), Tensor::FromVector(std::vector<float>{3, 4}, {2}),
               Tensor::FromVector(std::vector<float>{13, 14}, {2}), Tensor::Scalar(0, DType::kInt64)};
  absl::StatusOr<std::vector<internal::ShardForm>> cut = internal::Resplit({a, b}, {"x", "y", "z"}, 5);
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_EQ(cut->size(), 3u);
  auto field = [](const internal::ShardForm& f, const std::string& name) {
    for (size_t i = 0; i < f.names.size(); ++i) {
      if (f.names[i] == name) return f.tensors[i];
    }
    return Tensor();
  };
  EXPECT_EQ(field((*cut)[0], "values").ToVector<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(field((*cut)[1], "values").ToVector<float>(), (std::vector<float>{2, 3}));
  EXPECT_EQ(field((*cut)[2], "state.momentum").ToVector<float>(), (std::vector<float>{14}));
  EXPECT_EQ(field((*cut)[2], "epoch").data<int64_t>()[0], 5);
  b.names.push_back("sum");
  b.tensors.push_back(Tensor::Zeros({2}));
  EXPECT_EQ(internal::Resplit({a, b}, {"x"}, 1).status().code(), absl::StatusCode::kDataLoss);  // an open step
}

}  // namespace
}  // namespace gw::param_server
