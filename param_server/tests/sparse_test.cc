// Sparse tables: the row store (ids, first touch, LRU, memory) and sparse pulls and pushes
// over real loopback connections, against dense references; SparseEmbedding, the table
// inside an autograd graph.
#include <gtest/gtest.h>

#include <list>
#include <map>
#include <random>

#include "agent_group.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/row_store.h"
#include "gradwire/param_server/server.h"
#include "gradwire/param_server/sparse_embedding.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "gradwire/tensor/kernels.h"

namespace gw::param_server {
namespace {

TEST(RowStoreTest, RowsStartFromTheSeededInitializerWhereverTheyLive) {
  const RowInit init{RowInit::Kind::kUniform, -0.5, 0.5, 42};
  RowStore a(8, 0, 0, init), b(8, 2, 0, init);
  std::vector<float> expected(8);
  for (uint64_t id : {0ull, 7ull, 1ull << 40, ~0ull}) {
    InitRow(init, id, 8, expected.data());
    RowStore::Row ra = a.Get(id), rb = b.Get(id);
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(ra.values[j], expected[static_cast<size_t>(j)]);
      EXPECT_EQ(rb.values[j], expected[static_cast<size_t>(j)]);
      EXPECT_GE(ra.values[j], -0.5f);
      EXPECT_LT(ra.values[j], 0.5f);
      EXPECT_EQ(rb.state[j], 0.0f);
    }
    EXPECT_EQ(*rb.step, 0);
  }
  std::vector<float> other(8);
  InitRow(init, 8, 8, other.data());
  EXPECT_NE(other, expected);  // ids get different rows
  EXPECT_EQ(a.size(), 4);
}

// Random touches checked against a model (std::map + recency list) through growth and
// evictions: every row present in the model is found with its last written value.
TEST(RowStoreTest, LruEvictionKeepsTheMostRecentRowsAndFindsEveryOther) {
  constexpr int64_t kCapacity = 1000;
  RowStore store(4, 0, kCapacity, RowInit{RowInit::Kind::kZeros});
  std::map<uint64_t, float> model;  // id -> value written
  std::list<uint64_t> recency;      // most recent first
  std::mt19937_64 rng(3);
  int64_t evicted = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t id = rng() % 3000;
    RowStore::Row row = store.Get(id);
    auto it = model.find(id);
    if (it != model.end()) {
      ASSERT_EQ(row.values[0], it->second) << "id " << id << " touch " << i;
      recency.remove(id);
    } else {
      ASSERT_EQ(row.values[0], 0.0f) << "a new or evicted row starts afresh";
      if (static_cast<int64_t>(model.size()) == kCapacity) {
        model.erase(recency.back());  // the least recently touched goes
        recency.pop_back();
        ++evicted;
      }
    }
    row.values[0] = static_cast<float>(i);
    model[id] = static_cast<float>(i);
    recency.push_front(id);
  }
  EXPECT_EQ(store.size(), kCapacity);
  EXPECT_EQ(store.evictions(), evicted);
  for (const auto& [id, v] : model) {
    RowStore::Row row;
    ASSERT_TRUE(store.Find(id, &row)) << id;
    EXPECT_EQ(row.values[0], v);
  }
  int64_t visited = 0;
  store.ForEach([&](uint64_t id, const RowStore::Row&) { visited += model.contains(id); });
  EXPECT_EQ(visited, kCapacity);
}

TEST(RowStoreTest, MemoryStaysWithinAFifthOfRawRowBytes) {
  for (int64_t capacity : {int64_t{0}, int64_t{200000}}) {
    RowStore store(64, 0, capacity, RowInit{});
    for (uint64_t id = 0; id < 200000; ++id) store.Get(id * 7919);
    EXPECT_EQ(store.size(), 200000);
    const double ratio = static_cast<double>(store.bytes()) / static_cast<double>(store.raw_bytes());
    EXPECT_LE(ratio, 1.2) << "capacity " << capacity;
    EXPECT_GE(ratio, 1.0);
  }
}

// Three servers, two trainers, rows spread by id.
struct SparseDeployment {
  std::vector<std::shared_ptr<ParameterServer>> servers{3};
  std::unique_ptr<rpc::testing::AgentGroup> group;
  SparseDeployment() {
    group = rpc::testing::AgentGroup::Start(5, [this](rpc::Agent& a) {
      if (a.self().rank < 3) servers[static_cast<size_t>(a.self().rank)] = *ParameterServer::Install(a);
    });
  }
  Client MakeClient(int trainer) {
    return Client((*group)[3 + trainer], {"worker0", "worker1", "worker2"}, trainer, 2, absl::Seconds(20));
  }
};

Tensor Ids(const std::vector<int64_t>& ids) { return Tensor::FromVector(ids, {static_cast<int64_t>(ids.size())}); }

// Asynchronous sparse SGD equals dense SGD on the whole table with the pushed rows
// scattered into a dense gradient (duplicates adding up), for ids on every server.
TEST(SparseTableTest, AsyncSgdEqualsDenseSgdWithScatteredGradients) {
  SparseDeployment d;
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0), c1 = d.MakeClient(1);
  constexpr int64_t kRows = 50, kDim = 6;
  const SparseOptions options{RowInit{RowInit::Kind::kNormal, 0, 1, 9}};
  const optim::Sgd sgd{.lr = 0.5};
  ASSERT_TRUE(c0.CreateSparse("emb", kDim, options, sgd, Consistency::kAsync).ok());
  ASSERT_TRUE(c1.CreateSparse("emb", kDim, options, sgd, Consistency::kAsync).ok());
  Tensor dense = Tensor::Empty({kRows, kDim});
  for (int64_t r = 0; r < kRows; ++r) InitRow(options.init, static_cast<uint64_t>(r), kDim, dense.data<float>() + r * kDim);
  optim::ParamState state;
  Generator gen(4);
  for (int step = 0; step < 5; ++step) {
    for (Client* c : {&c0, &c1}) {
      std::vector<int64_t> ids;
      for (int i = 0; i < 12; ++i) ids.push_back(static_cast<int64_t>(gen.NextBelow(kRows)));
      ids.push_back(ids[0]);  // a duplicate within one push
      Tensor grad = Tensor::Randn({static_cast<int64_t>(ids.size()), kDim}, gen);
      ASSERT_TRUE(c->PushRows("emb", step, Ids(ids), grad).Get().ok());
      Tensor scattered = Tensor::Zeros({kRows, kDim});
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int64_t j = 0; j < kDim; ++j) scattered.data<float>()[ids[i] * kDim + j] += grad.data<float>()[static_cast<int64_t>(i) * kDim + j];
      }
      optim::Update(sgd, dense, scattered, state);
    }
  }
  std::vector<int64_t> all;
  for (int64_t r = kRows - 1; r >= 0; --r) all.push_back(r);  // reversed: order follows the ids
  absl::StatusOr<Tensor> pulled = c0.PullRows("emb", 5, Ids(all)).Get();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_EQ(pulled->sizes(), (Shape{kRows, kDim}));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kDim; ++j) {
      EXPECT_NEAR(pulled->data<float>()[(kRows - 1 - r) * kDim + j], dense.data<float>()[r * kDim + j], 1e-5)
          << "row " << r;
    }
  }
  int64_t rows = 0;
  for (auto& s : d.servers) rows += s->sparse_stats("emb")->rows;
  EXPECT_EQ(rows, kRows);  // the pull touched every row once; nothing else was created
}

// Synchronous sparse Adagrad: each step's pushes of both trainers are averaged per row
// and applied once; with every step touching the same rows this equals dense Adagrad on
// those rows. Only pushed rows get optimizer state; pulls of the next step wait.
TEST(SparseTableTest, SyncAdagradEqualsDenseAdagradOnTheTouchedRows) {
  SparseDeployment d;
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0), c1 = d.MakeClient(1);
  constexpr int64_t kDim = 4;
  const SparseOptions options{RowInit{RowInit::Kind::kUniform, -1, 1, 1}};
  const optim::Adagrad adagrad{.lr = 0.3, .initial_accumulator_value = 0.1};
  ASSERT_TRUE(c0.CreateSparse("emb", kDim, options, adagrad, Consistency::kSync).ok());
  ASSERT_TRUE(c1.CreateSparse("emb", kDim, options, adagrad, Consistency::kSync).ok());
  const std::vector<int64_t> touched = {3, 1000000007, 17, 42, 5};
  Tensor dense = Tensor::Empty({5, kDim});
  for (size_t r = 0; r < touched.size(); ++r) {
    InitRow(options.init, static_cast<uint64_t>(touched[r]), kDim, dense.data<float>() + static_cast<int64_t>(r) * kDim);
  }
  optim::ParamState state;
  Generator gen(8);
  for (int step = 0; step < 3; ++step) {
    Tensor g0 = Tensor::Randn({5, kDim}, gen), g1 = Tensor::Randn({5, kDim}, gen);
    Future<bool> p0 = c0.PushRows("emb", step, Ids(touched), g0);
    Future<Tensor> next = c0.PullRows("emb", step + 1, Ids(touched));
    ASSERT_TRUE(p0.Get().ok());  // trainer 0's push is in; the step still lacks trainer 1's
    EXPECT_FALSE(next.IsReady()) << "the next step waits for trainer 1";
    ASSERT_TRUE(c1.PushRows("emb", step, Ids(touched), g1).Get().ok());
    optim::Update(adagrad, dense, kernels::MulScalar(kernels::Add(g0, g1), 0.5), state);
    absl::StatusOr<Tensor> rows = next.Get();
    ASSERT_TRUE(rows.ok()) << rows.status();
    for (int64_t i = 0; i < dense.numel(); ++i) EXPECT_NEAR(rows->data<float>()[i], dense.data<float>()[i], 1e-6);
  }
}

// W7's table: a million rows of 64 floats on one server, created by pulls; the shard's
// memory (its stripes' row stores) stays within 1.2x of the raw row bytes.
TEST(SparseTableTest, AMillionRowShardStaysWithinAFifthOfRawRowBytes) {
  std::shared_ptr<ParameterServer> server;
  auto g = rpc::testing::AgentGroup::Start(2, [&](rpc::Agent& a) {
    if (a.self().rank == 0) server = *ParameterServer::Install(a);
  });
  ASSERT_NE(g, nullptr);
  Client c((*g)[1], {"worker0"}, 0, 1);
  ASSERT_TRUE(c.CreateSparse("emb", 64, {RowInit{RowInit::Kind::kZeros}}, optim::Sgd{.lr = 0.1}, Consistency::kAsync).ok());
  constexpr int64_t kRows = 1000000, kBatch = 65536;
  for (int64_t first = 0; first < kRows; first += kBatch) {
    const Tensor ids = Tensor::Arange(static_cast<double>(first), static_cast<double>(std::min(first + kBatch, kRows)));
    ASSERT_TRUE(c.PullRows("emb", 0, ids).Get().ok());
  }
  absl::StatusOr<SparseShardStats> stats = server->sparse_stats("emb");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->rows, kRows);
  EXPECT_EQ(stats->raw_bytes, kRows * 64 * 4);
  EXPECT_LE(static_cast<double>(stats->bytes) / static_cast<double>(stats->raw_bytes), 1.2);
}

TEST(SparseTableTest, BadPushesAreRefusedWithTheReasonAndChangeNothing) {
  SparseDeployment d;
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0);
  ASSERT_TRUE(c0.CreateSparse("emb", 3, {}, optim::Sgd{.lr = 1}, Consistency::kAsync).ok());
  ASSERT_TRUE(c0.CreateDense("w", Tensor::Zeros({4}), optim::Sgd{}, Consistency::kAsync).ok());
  Tensor before = *c0.PullRows("emb", 0, Ids({1, 2})).Get();
  absl::StatusOr<bool> wrong_width = c0.PushRows("emb", 0, Ids({1, 2}), Tensor::Ones({2, 4})).Get();
  EXPECT_EQ(wrong_width.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_width.status().message().find("[2, 3]"), std::string::npos) << wrong_width.status();
  absl::StatusOr<Tensor> float_ids = c0.PullRows("emb", 0, Tensor::Ones({2})).Get();
  EXPECT_EQ(float_ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c0.PullRows("w", 0, Ids({1})).Get().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(c0.CreateSparse("emb", 5, {}, optim::Sgd{}, Consistency::kAsync).ok()) << "same name, other width";
  Tensor after = *c0.PullRows("emb", 0, Ids({1, 2})).Get();
  for (int64_t i = 0; i < before.numel(); ++i) EXPECT_EQ(before.data<float>()[i], after.data<float>()[i]);
}


// SparseEmbedding pushes the gradient its backward pass accumulated, as Client::PushRows
// of the distinct ids would; a trainer whose step reached no rows still ends the step
// (an empty push), so the synchronous step completes with the other trainer's gradient.
TEST(SparseEmbeddingTest, BackwardPushesTheRowsGradientAndEveryTrainerEndsItsStep) {
  SparseDeployment d;
  ASSERT_NE(d.group, nullptr);
  Client c0 = d.MakeClient(0), c1 = d.MakeClient(1);
  constexpr int64_t kDim = 3;
  const SparseOptions options{RowInit{RowInit::Kind::kNormal, 0, 1, 5}};
  ASSERT_TRUE(c0.CreateSparse("emb", kDim, options, optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
  ASSERT_TRUE(c1.CreateSparse("emb", kDim, options, optim::Sgd{.lr = 1.0}, Consistency::kSync).ok());
  const Tensor ids = Ids({4, 9, 4, 1000003});
  absl::StatusOr<Tensor> before = c0.PullRows("emb", 0, Ids({4, 9, 1000003})).Get();
  ASSERT_TRUE(before.ok()) << before.status();

  // Trainer 1 looks nothing up in steps 0, 1 and 2.
  std::thread other([&] {
    SparseEmbedding e1(c1, "emb");
    for (int step = 0; step < 3; ++step) {
      absl::Status st = e1.Step();
      EXPECT_TRUE(st.ok()) << "step " << step << ": " << st;
    }
  });
  auto join = absl::MakeCleanup([&] { other.join(); });
  SparseEmbedding e0(c0, "emb");
  absl::StatusOr<Tensor> rows = e0.Lookup(Tensor::FromVector<int64_t>({4, 9, 4, 1000003}, {2, 2}));
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->sizes(), (Shape{2, 2, kDim}));
  EXPECT_EQ(e0.rows_pulled(), 3);
  // A second recording lookup in the same step is refused; one under NoGradGuard is not.
  absl::StatusOr<Tensor> again = e0.Lookup(ids);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  {
    autograd::NoGradGuard no_grad;
    EXPECT_TRUE(e0.Lookup(ids).ok());
    EXPECT_EQ(e0.Lookup(Tensor::FromVector<double>({1.0})).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // d/d rows of sum(w * rows): id 4 appears twice.
  const Tensor w = Tensor::Arange(1, 1 + 4 * kDim, 1, DType::kFloat32);
  autograd::Backward({gw::Sum(gw::Mul(*rows, gw::Reshape(w, {2, 2, kDim})))});
  ASSERT_TRUE(e0.Step().ok());
  EXPECT_EQ(e0.clock(), 1);

  absl::StatusOr<Tensor> after = c0.PullRows("emb", 1, Ids({4, 9, 1000003})).Get();
  ASSERT_TRUE(after.ok()) << after.status();
  const std::vector<float> wv = w.ToVector<float>();
  const std::vector<float> b = before->ToVector<float>(), a = after->ToVector<float>();
  for (int64_t j = 0; j < kDim; ++j) {
    // Trainer 0's gradient averaged with trainer 1's empty one (lr 1).
    const float g4 = wv[static_cast<size_t>(j)] + wv[static_cast<size_t>(2 * kDim + j)];
    EXPECT_NEAR(a[static_cast<size_t>(j)], b[static_cast<size_t>(j)] - g4 / 2, 1e-5);
    EXPECT_NEAR(a[static_cast<size_t>(kDim + j)], b[static_cast<size_t>(kDim + j)] - wv[static_cast<size_t>(kDim + j)] / 2,
                1e-5);
    EXPECT_NEAR(a[static_cast<size_t>(2 * kDim + j)],
                b[static_cast<size_t>(2 * kDim + j)] - wv[static_cast<size_t>(3 * kDim + j)] / 2, 1e-5);
  }

  // Step 1: a lookup whose rows the backward never reaches still ends the step, and
  // changes nothing.
  absl::StatusOr<Tensor> unused = e0.Lookup(ids);
  ASSERT_TRUE(unused.ok()) << unused.status();
  ASSERT_TRUE(e0.Step().ok());
  absl::StatusOr<Tensor> unchanged = c0.PullRows("emb", 2, Ids({4, 9, 1000003})).Get();
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  EXPECT_EQ(unchanged->ToVector<float>(), a);

  // Step 2: two backward passes over one lookup; the first one's gradient is pushed and
  // Step() reports the second.
  absl::StatusOr<Tensor> twice = e0.Lookup(ids);
  ASSERT_TRUE(twice.ok()) << twice.status();
  Tensor loss = gw::Sum(*twice);
  autograd::Backward({loss}, {}, /*retain_graph=*/true);
  autograd::Backward({loss});
  absl::Status s = e0.Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("2 backward passes"), std::string::npos) << s;
}

}  // namespace
}  // namespace gw::param_server
