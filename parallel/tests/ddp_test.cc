// DistributedDataParallel on replicas that are agents on threads of this process: N
// replicas train exactly as one process on the concatenated batch (float64, parameter by
// parameter, every step), with and without overlap, with one bucket or many, with NoSync
// accumulation, with parameters some replicas do not use; models that differ, and a
// replica that leaves.
#include "gradwire/parallel/distributed_data_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <latch>
#include <string>

#include "absl/strings/str_cat.h"
#include "collectives_job.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/loss.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/tensor/kernels.h"

namespace gw::parallel {
namespace {

using collectives::testing::Job;

constexpr int64_t kIn = 6, kClasses = 3, kPerReplica = 4;

// A float64 MLP; replicas start from different seeds (DDP broadcasts rank 0's values).
std::shared_ptr<nn::Sequential> Mlp(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(kIn, 8, gen, true, DType::kFloat64), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(8, 5, gen, true, DType::kFloat64), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(5, kClasses, gen, true, DType::kFloat64)});
}

// The batch replica r trains on at step s (micro-batch m), and the concatenation of
// every replica's.
struct Batch {
  Tensor x, y;
};
Batch ReplicaBatch(int step, int micro, int replica) {
  Generator gen(static_cast<uint64_t>(1000 * step + 100 * micro + replica + 1));
  std::vector<int64_t> labels;
  for (double u : Tensor::Uniform({kPerReplica}, 0, kClasses, gen, DType::kFloat64).ToVector<double>()) {
    labels.push_back(std::min<int64_t>(static_cast<int64_t>(u), kClasses - 1));
  }
  return {Tensor::Randn({kPerReplica, kIn}, gen, DType::kFloat64), Tensor::FromVector(labels)};
}
Batch Concatenated(int step, int micro, int replicas) {
  std::vector<Tensor> xs, ys;
  for (int r = 0; r < replicas; ++r) {
    Batch b = ReplicaBatch(step, micro, r);
    xs.push_back(b.x);
    ys.push_back(b.y);
  }
  return {kernels::Cat(xs, 0), kernels::Cat(ys, 0)};
}

const optim::Sgd kSgd{.lr = 0.1, .momentum = 0.9};

// Parameters after each step of single-process training on the concatenated batches
// (`micro` micro-batches per step, their mean losses summed).
std::vector<std::vector<Tensor>> Reference(int replicas, int steps, int micro) {
  auto model = Mlp(/*seed=*/0);
  optim::Optimizer opt(model->Parameters(), kSgd);
  std::vector<std::vector<Tensor>> after;
  for (int s = 0; s < steps; ++s) {
    opt.ZeroGrad();
    for (int m = 0; m < micro; ++m) {
      Batch b = Concatenated(s, m, replicas);
      autograd::Backward({nn::CrossEntropyLoss(model->Forward(b.x), b.y)});
    }
    opt.Step();
    after.emplace_back();
    for (const Tensor& p : model->Parameters()) after.back().push_back(kernels::Clone(p));
  }
  return after;
}

struct Case {
  int replicas;
  bool overlap;
  size_t bucket_bytes;
  int micro;  // micro-batches per step; all but the last under NoSync
};

class DdpEqualsOneProcess : public ::testing::TestWithParam<Case> {};

TEST_P(DdpEqualsOneProcess, ParameterByParameterEveryStep) {
  const Case c = GetParam();
  constexpr int kSteps = 4;
  const auto reference = Reference(c.replicas, kSteps, c.micro);
  Job job = Job::Start(c.replicas);
  auto groups = job.Groups();
  std::vector<std::vector<std::vector<Tensor>>> got(static_cast<size_t>(c.replicas));
  std::vector<size_t> buckets(static_cast<size_t>(c.replicas));
  job.OnEveryRank([&](int r) {
    auto ddp = DistributedDataParallel::Create(Mlp(/*seed=*/static_cast<uint64_t>(r)), groups[static_cast<size_t>(r)],
                                               DdpOptions{.bucket_bytes = c.bucket_bytes, .overlap = c.overlap});
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    buckets[static_cast<size_t>(r)] = (*ddp)->buckets().size();
    optim::Optimizer opt((*ddp)->Parameters(), kSgd);
    for (int s = 0; s < kSteps; ++s) {
      opt.ZeroGrad();
      for (int m = 0; m < c.micro; ++m) {
        Batch b = ReplicaBatch(s, m, r);
        auto backward = [&] { autograd::Backward({nn::CrossEntropyLoss((*ddp)->Forward(b.x), b.y)}); };
        if (m + 1 < c.micro) {
          auto no_sync = (*ddp)->NoSync();
          backward();
        } else {
          backward();
        }
      }
      // The average over replicas of mean losses is the mean over the concatenated batch.
      opt.Step();
      got[static_cast<size_t>(r)].emplace_back();
      for (const Tensor& p : (*ddp)->Parameters()) got[static_cast<size_t>(r)].back().push_back(kernels::Clone(p));
    }
  });
  if (c.bucket_bytes < 200) {
    EXPECT_GT(buckets[0], 3u);  // really several buckets
  } else {
    EXPECT_EQ(buckets[0], 1u);
  }
  for (int r = 0; r < c.replicas; ++r) {
    ASSERT_EQ(got[static_cast<size_t>(r)].size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      for (size_t i = 0; i < reference[static_cast<size_t>(s)].size(); ++i) {
        const Tensor& want = reference[static_cast<size_t>(s)][i];
        const Tensor& have = got[static_cast<size_t>(r)][static_cast<size_t>(s)][i];
        EXPECT_LT(kernels::MaxAbsDiff(have, want), 1e-6) << "replica " << r << " step " << s << " parameter " << i;
        // Every replica holds bitwise the same parameters.
        EXPECT_EQ(kernels::MaxAbsDiff(have, got[0][static_cast<size_t>(s)][i]), 0.0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ddp, DdpEqualsOneProcess,
    ::testing::Values(Case{2, true, 1 << 20, 1}, Case{2, true, 100, 1}, Case{2, false, 100, 1},
                      Case{3, true, 100, 1}, Case{3, false, 1 << 20, 1}, Case{2, true, 100, 3},
                      Case{3, false, 100, 2}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return absl::StrCat(c.replicas, "Replicas", c.overlap ? "Overlapped" : "AtTheEnd",
                          c.bucket_bytes < 1000 ? "ManyBuckets" : "OneBucket",
                          c.micro > 1 ? absl::StrCat("NoSync", c.micro) : "");
    });

// A module whose forward uses its second layer only when told to.
class Branchy : public nn::Module {
 public:
  explicit Branchy(uint64_t seed) : nn::Module("Branchy") {
    Generator gen(seed);
    a_ = RegisterModule("a", std::make_shared<nn::Linear>(kIn, kClasses, gen, true, DType::kFloat64));
    b_ = RegisterModule("b", std::make_shared<nn::Linear>(kIn, kClasses, gen, true, DType::kFloat64));
  }
  Tensor Forward(const Tensor& x) override { return use_b ? a_->Forward(x) + b_->Forward(x) : a_->Forward(x); }
  bool use_b = true;

 private:
  std::shared_ptr<nn::Linear> a_, b_;
};

// Outside and inside a distributed-autograd context: inside, every averaged gradient,
// the unused parameter's too, is in the context and .grad() stays empty.
class DdpUnused : public ::testing::TestWithParam<bool> {};

TEST_P(DdpUnused, DifferentOnEachReplicaWithFindUnusedParameters) {
  const bool in_context = GetParam();
  std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines(2);
  Job job = Job::Start(2, {}, [&engines](rpc::Agent& agent) {
    return rpc::Assign(dist_autograd::DistAutograd::Install(agent), engines[static_cast<size_t>(agent.self().rank)]);
  });
  auto groups = job.Groups();
  // Reference: rank 0 uses b, rank 1 does not; the averaged gradient of b is half rank 0's.
  Branchy ref(0);
  Batch b0 = ReplicaBatch(0, 0, 0), b1 = ReplicaBatch(0, 0, 1);
  ref.use_b = true;
  Tensor l0 = nn::CrossEntropyLoss(ref.Forward(b0.x), b0.y);
  ref.use_b = false;
  Tensor l1 = nn::CrossEntropyLoss(ref.Forward(b1.x), b1.y);
  autograd::Backward({(l0 + l1) * 0.5});
  std::vector<std::vector<Tensor>> grads(2);
  job.OnEveryRank([&](int r) {
    auto module = std::make_shared<Branchy>(static_cast<uint64_t>(r));
    auto ddp = DistributedDataParallel::Create(module, groups[static_cast<size_t>(r)],
                                               DdpOptions{.bucket_bytes = 64, .find_unused_parameters = true});
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    module->use_b = r == 0;
    Batch b = r == 0 ? b0 : b1;
    if (!in_context) {
      autograd::Backward({nn::CrossEntropyLoss((*ddp)->Forward(b.x), b.y)});
      for (const Tensor& p : (*ddp)->Parameters()) grads[static_cast<size_t>(r)].push_back(p.grad());
      return;
    }
    dist_autograd::Context ctx(*engines[static_cast<size_t>(r)]);
    ASSERT_TRUE(ctx.Backward({nn::CrossEntropyLoss((*ddp)->Forward(b.x), b.y)}).ok());
    for (const Tensor& p : (*ddp)->Parameters()) {
      EXPECT_FALSE(p.grad().defined()) << "replica " << r;
      grads[static_cast<size_t>(r)].push_back(ctx.GradOf(p));
    }
  });
  const std::vector<Tensor> want = ref.Parameters();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(grads[static_cast<size_t>(r)].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(grads[static_cast<size_t>(r)][i].defined()) << "replica " << r << " parameter " << i;
      EXPECT_LT(kernels::MaxAbsDiff(grads[static_cast<size_t>(r)][i], want[i].grad()), 1e-12)
          << "replica " << r << " parameter " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DdpTest, DdpUnused, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "InADistAutogradContext" : "Local"; });

TEST(DdpTest, UnusedParametersWithoutTheOptionAreNamedAtTheNextForward) {
  Job job = Job::Start(2);
  auto groups = job.Groups();
  job.OnEveryRank([&](int r) {
    auto module = std::make_shared<Branchy>(0);
    auto ddp = DistributedDataParallel::Create(module, groups[static_cast<size_t>(r)], DdpOptions{.bucket_bytes = 64});
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    module->use_b = false;
    Batch b = ReplicaBatch(0, 0, r);
    autograd::Backward({nn::CrossEntropyLoss((*ddp)->Forward(b.x), b.y)});  // returns: nothing waits for b
    try {
      (void)(*ddp)->Forward(b.x);
      ADD_FAILURE() << "the next forward did not notice";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("module.b.weight"), std::string::npos) << what;
      EXPECT_NE(what.find("find_unused_parameters"), std::string::npos) << what;
    }
  });
}

TEST(DdpTest, ReplicasWithDifferentModelsFailOnEveryRank) {
  Job job = Job::Start(2);
  auto groups = job.Groups();
  job.OnEveryRank([&](int r) {
    Generator gen(0);
    auto model = std::make_shared<nn::Linear>(kIn, r == 0 ? 3 : 4, gen, true, DType::kFloat64);
    auto ddp = DistributedDataParallel::Create(model, groups[static_cast<size_t>(r)]);
    ASSERT_FALSE(ddp.ok());
    EXPECT_EQ(ddp.status().code(), absl::StatusCode::kInvalidArgument) << ddp.status();
    EXPECT_NE(ddp.status().message().find("disagree on the model"), std::string::npos) << ddp.status();
    EXPECT_NE(ddp.status().message().find(absl::StrCat("group rank ", 1 - r)), std::string::npos) << ddp.status();
  });
}

TEST(DdpTest, AReplicaThatLeavesFailsTheOthersBackwardWithTheCollectivesError) {
  Job job = Job::Start(2);
  auto groups = job.Groups();
  std::latch created(2);
  job.OnEveryRank([&](int r) {
    auto ddp = DistributedDataParallel::Create(Mlp(0), groups[static_cast<size_t>(r)]);
    created.count_down();
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    if (r == 1) {
      created.wait();      // rank 0's broadcast is over too
      groups[1]->Close();  // tells rank 0 at once
      return;
    }
    Batch b = ReplicaBatch(0, 0, 0);
    try {
      autograd::Backward({nn::CrossEntropyLoss((*ddp)->Forward(b.x), b.y)});
      ADD_FAILURE() << "backward succeeded without the other replica";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("averaging the gradients"), std::string::npos) << e.what();
    }
  });
}

TEST(DdpTest, EvaluationUnderNoGradArmsNothing) {
  Job job = Job::Start(2);
  auto groups = job.Groups();
  job.OnEveryRank([&](int r) {
    auto ddp = DistributedDataParallel::Create(Mlp(static_cast<uint64_t>(r)), groups[static_cast<size_t>(r)]);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    Batch b = ReplicaBatch(0, 0, r);
    {
      autograd::NoGradGuard no_grad;
      for (int i = 0; i < 3; ++i) (void)(*ddp)->Forward(b.x);
    }
    autograd::Backward({nn::CrossEntropyLoss((*ddp)->Forward(b.x), b.y)});
    for (const Tensor& p : (*ddp)->Parameters()) EXPECT_TRUE(p.grad().defined());
    // A backward with no forward through DDP before it is named as such.
    Tensor loss = nn::CrossEntropyLoss((*ddp)->module().Forward(b.x), b.y);
    EXPECT_THROW(autograd::Backward({loss}), Error);
  });
}

}  // namespace
}  // namespace gw::parallel
