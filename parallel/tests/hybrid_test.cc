// A hybrid step (PyTorch's "combining DDP with the distributed RPC framework"): two
// trainers replicate a dense model with DistributedDataParallel and share an embedding
// table held on two parameter servers (param_server::SparseEmbedding). One backward pass
// allreduces the dense gradients and pushes the rows' gradients; one step applies both.
// Over several steps the dense parameters and the table equal one process training the
// same model (the table as a local tensor) on the concatenated batch, inside a
// distributed-autograd context (DistributedOptimizer) and outside one (optim::Optimizer).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "collectives_job.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/loss.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/param_server/server.h"
#include "gradwire/param_server/sparse_embedding.h"
#include "gradwire/parallel/distributed_data_parallel.h"
#include "gradwire/tensor/kernels.h"

namespace gw::parallel {
namespace {

using collectives::testing::Job;

constexpr int kServers = 2, kTrainers = 2, kSteps = 4;
constexpr int64_t kRows = 40, kDim = 5, kClasses = 3, kBags = 6;
const param_server::RowInit kInit{param_server::RowInit::Kind::kNormal, 0, 1, 7};
const optim::Sgd kDenseSgd{.lr = 0.2, .momentum = 0.9};
const optim::Sgd kRowSgd{.lr = 0.5};

std::shared_ptr<nn::Sequential> Dense(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(kDim, 6, gen), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(6, kClasses, gen)});
}

// Trainer t's bags at step s: ids, offsets, labels. Bags have 1-4 ids, with repeats
// within a batch and across trainers.
struct Bags {
  Tensor ids, offsets, labels;
};
Bags TrainerBags(int step, int trainer) {
  Generator gen(static_cast<uint64_t>(100 * step + trainer + 1));
  std::vector<int64_t> ids, offsets, labels;
  for (int64_t b = 0; b < kBags; ++b) {
    offsets.push_back(static_cast<int64_t>(ids.size()));
    const int64_t n = 1 + static_cast<int64_t>(gen.NextBelow(4));
    for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int64_t>(gen.NextBelow(kRows)));
    labels.push_back(static_cast<int64_t>(gen.NextBelow(kClasses)));
  }
  return {Tensor::FromVector(ids), Tensor::FromVector(offsets), Tensor::FromVector(labels)};
}

// After each step: the dense parameters and the whole table, trained in one process on
// both trainers' bags at once.
struct Snapshot {
  std::vector<Tensor> dense;
  Tensor table;
};
std::vector<Snapshot> Reference() {
  auto dense = Dense(/*seed=*/0);
  Tensor table = Tensor::Empty({kRows, kDim});
  for (int64_t r = 0; r < kRows; ++r) {
    param_server::InitRow(kInit, static_cast<uint64_t>(r), kDim, table.data<float>() + r * kDim);
  }
  table.set_requires_grad(true);
  optim::Optimizer dense_opt(dense->Parameters(), kDenseSgd);
  optim::Optimizer table_opt({table}, kRowSgd);
  std::vector<Snapshot> after;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<Tensor> ids, offsets, labels;
    int64_t base = 0;
    for (int t = 0; t < kTrainers; ++t) {
      Bags b = TrainerBags(s, t);
      ids.push_back(b.ids);
      std::vector<int64_t> shifted = b.offsets.ToVector<int64_t>();
      for (int64_t& o : shifted) o += base;
      offsets.push_back(Tensor::FromVector(shifted));
      labels.push_back(b.labels);
      base += b.ids.numel();
    }
    dense_opt.ZeroGrad();
    table_opt.ZeroGrad();
    Tensor bags = nn::EmbeddingBagLookup(table, kernels::Cat(ids, 0), kernels::Cat(offsets, 0), nn::BagMode::kMean);
    autograd::Backward({nn::CrossEntropyLoss(dense->Forward(bags), kernels::Cat(labels, 0))});
    dense_opt.Step();
    table_opt.Step();
    after.emplace_back();
    for (const Tensor& p : dense->Parameters()) after.back().dense.push_back(kernels::Clone(p));
    after.back().table = kernels::Clone(table);
  }
  return after;
}

struct Deployment {
  Job job;
  std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines{kServers + kTrainers};
  std::vector<std::shared_ptr<param_server::ParameterServer>> servers{kServers};

  Deployment() {
    job = Job::Start(kServers + kTrainers, {}, [this](rpc::Agent& agent) -> absl::Status {
      const auto rank = static_cast<size_t>(agent.self().rank);
      if (absl::Status s = rpc::Assign(dist_autograd::DistAutograd::Install(agent), engines[rank]); !s.ok()) return s;
      if (rank < kServers) return rpc::Assign(param_server::ParameterServer::Install(agent), servers[rank]);
      return absl::OkStatus();
    });
  }
  rpc::Agent& agent(int rank) { return (*job.agents)[rank]; }
};

class HybridTest : public ::testing::TestWithParam<bool> {};

TEST_P(HybridTest, DdpWithServerEmbeddingEqualsOneProcess) {
  const bool in_context = GetParam();
  const std::vector<Snapshot> reference = Reference();
  Deployment d;
  ASSERT_NE(d.job.agents, nullptr);
  std::vector<int> trainer_ranks;
  for (int t = 0; t < kTrainers; ++t) trainer_ranks.push_back(kServers + t);
  auto groups = d.job.Groups(trainer_ranks);

  auto train = [&](int trainer) {
    const int rank = kServers + trainer;
    rpc::Agent& agent = d.agent(rank);
    param_server::Client client(agent, {"worker0", "worker1"}, trainer, kTrainers, absl::Seconds(30));
    ASSERT_TRUE(client.CreateSparse("emb", kDim, {kInit}, kRowSgd, param_server::Consistency::kSync).ok());
    param_server::SparseEmbedding embedding(client, "emb");
    // Replicas start from different values: DDP broadcasts trainer 0's.
    auto ddp = DistributedDataParallel::Create(Dense(static_cast<uint64_t>(trainer)),
                                               groups[static_cast<size_t>(rank)], {.bucket_bytes = 64});
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    std::vector<rpc::RRef<Tensor>> owned;
    for (const Tensor& p : (*ddp)->Parameters()) owned.push_back(agent.Own(p));
    auto dist_opt = dist_autograd::DistributedOptimizer::Create(agent, kDenseSgd, owned);
    ASSERT_TRUE(dist_opt.ok()) << dist_opt.status();
    optim::Optimizer local_opt((*ddp)->Parameters(), kDenseSgd);

    for (int s = 0; s < kSteps; ++s) {
      const Bags b = TrainerBags(s, trainer);
      // Lookup, replica forward, and `backward` of the loss.
      auto step = [&](const std::function<absl::Status(const Tensor&)>& backward) -> absl::Status {
        absl::StatusOr<Tensor> bags = embedding.LookupBag(b.ids, b.offsets, nn::BagMode::kMean);
        if (!bags.ok()) return bags.status();
        return backward(nn::CrossEntropyLoss((*ddp)->Forward(*bags), b.labels));
      };
      if (in_context) {
        dist_autograd::Context ctx(*d.engines[static_cast<size_t>(rank)]);
        absl::Status s = step([&](const Tensor& loss) { return ctx.Backward({loss}); });
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_TRUE((*dist_opt)->Step(ctx).ok());
      } else {
        local_opt.ZeroGrad();
        absl::Status s = step([](const Tensor& loss) {
          autograd::Backward({loss});
          return absl::OkStatus();
        });
        ASSERT_TRUE(s.ok()) << s;
        local_opt.Step();
      }
      ASSERT_TRUE(embedding.Step().ok());
      EXPECT_EQ(embedding.clock(), s + 1);

      const Snapshot& want = reference[static_cast<size_t>(s)];
      const std::vector<Tensor> params = (*ddp)->Parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(kernels::AllClose(params[i], want.dense[i], 1e-5, 1e-5))
            << "trainer " << trainer << " step " << s << " dense parameter " << i;
      }
      // The whole table as the servers hold it after this step (a pull at the next clock
      // waits for both trainers' pushes).
      autograd::NoGradGuard no_grad;
      absl::StatusOr<Tensor> rows = client.PullRows("emb", s + 1, Tensor::Arange(0, kRows)).Get();
      ASSERT_TRUE(rows.ok()) << rows.status();
      EXPECT_TRUE(kernels::AllClose(*rows, want.table, 1e-5, 1e-5)) << "trainer " << trainer << " step " << s;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kTrainers; ++t) threads.emplace_back(train, t);
  for (auto& t : threads) t.join();
}

INSTANTIATE_TEST_SUITE_P(ContextOrNot, HybridTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "DistAutogradContext" : "LocalBackward"; });

}  // namespace
}  // namespace gw::parallel
