// The models of examples/rpc_ps_fashion_mnist and examples/rnn_fashion_mnist (PyTorch's
// RPC tutorials, examples/rpc_tutorial.h), run across two in-process agents for one step:
// the gradients distributed autograd delivers, on the server (through the context) and
// on the trainer, equal those of the same model run in one process on the same batch
// (same seeds, float64, to 1e-10).
#include <gtest/gtest.h>

#include "agent_group.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/tensor/kernels.h"
#include "rpc_tutorial.h"

namespace gw::examples {
namespace {

using dist_autograd::Context;
using dist_autograd::DistAutograd;

constexpr double kTolerance = 1e-10;

// A batch of `n` float64 images [n, 784] in [0, 1) and their labels.
data::Batch MakeBatch(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back((i * 7 + static_cast<int64_t>(seed)) % 10);
  return {Tensor::Rand({n, 784}, gen, DType::kFloat64), Tensor::FromVector(labels, {n})};
}

void ExpectNear(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no gradient";
  ASSERT_TRUE(want.defined()) << what << ": no local gradient";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_LT(kernels::MaxAbsDiff(got, want), kTolerance) << what;
}

TEST(RpcTutorialsTest, ParameterServerStepGradientsEqualOneProcess) {
  std::vector<std::shared_ptr<DistAutograd>> engines(2);
  auto host = std::make_shared<ParameterServerHost>(DType::kFloat64);
  rpc::AgentOptions o;
  o.default_timeout = absl::Seconds(30);
  auto group = rpc::testing::AgentGroup::Start(
      2,
      [&](rpc::Agent& a) -> absl::Status {
        if (absl::Status s = rpc::Assign(DistAutograd::Install(a), engines[static_cast<size_t>(a.self().rank)]);
            !s.ok()) {
          return s;
        }
        return a.self().rank == 0 ? RegisterParameterServer(a, host) : absl::OkStatus();
      },
      o);
  ASSERT_NE(group, nullptr);
  const int64_t seed = 3;
  const data::Batch batch = MakeBatch(6, 11);
  {
    rpc::Agent& trainer = (*group)[1];
    absl::StatusOr<dist_nn::RemoteModule> remote =
        dist_nn::RemoteModule::Create(trainer, "worker0", "parameter_server", std::string("cnn"), seed);
    ASSERT_TRUE(remote.ok()) << remote.status();
    const TrainerNet net{*remote};
    // A second trainer gets the same model; another seed is refused.
    absl::StatusOr<dist_nn::RemoteModule> again =
        dist_nn::RemoteModule::Create(trainer, "worker0", "parameter_server", std::string("cnn"), seed);
    ASSERT_TRUE(again.ok()) << again.status();
    absl::StatusOr<dist_nn::RemoteModule> other =
        dist_nn::RemoteModule::Create(trainer, "worker0", "parameter_server", std::string("cnn"), seed + 1);
    EXPECT_FALSE(other.ok());
    EXPECT_NE(other.status().message().find("same --model and --seed"), std::string::npos) << other.status();

    // The example's step: the model on the server, the loss here.
    ASSERT_TRUE(net.BeginStep().ok());
    Context ctx(*engines[1]);
    absl::StatusOr<Tensor> out = net.Forward(batch.inputs);
    ASSERT_TRUE(out.ok()) << out.status();
    const Tensor loss = models::Loss("cnn", *out, batch.targets);
    absl::Status s = ctx.Backward({loss});
    ASSERT_TRUE(s.ok()) << s;

    // The same model (same seed: same weights and dropout masks) in this process.
    Generator gen(static_cast<uint64_t>(seed));
    absl::StatusOr<std::shared_ptr<nn::Module>> local = models::Create("cnn", gen, DType::kFloat64);
    ASSERT_TRUE(local.ok());
    const Tensor local_out = (*local)->Forward(batch.inputs);
    const Tensor local_loss = models::Loss("cnn", local_out, batch.targets);
    autograd::Backward({local_loss});
    EXPECT_LT(kernels::MaxAbsDiff(*out, local_out), kTolerance);
    EXPECT_LT(std::abs(loss.item() - local_loss.item()), kTolerance);

    const nn::NamedTensors served = host->server()->NamedParameters();
    const nn::NamedTensors want = (*local)->NamedParameters();
    ASSERT_EQ(served.size(), want.size());
    ASSERT_EQ(served.size(), 8u);
    for (size_t i = 0; i < served.size(); ++i) {
      EXPECT_EQ(served[i].first, "model." + want[i].first);
      ExpectNear(engines[0]->GradOf(ctx.id(), served[i].second), want[i].second.grad(), served[i].first);
    }
    ASSERT_TRUE(net.BeginUpdate().ok());  // alone: at once
    ASSERT_TRUE(net.EndStep().ok());

    // Evaluation: eval mode (no dropout) without gradients, the model back in training mode.
    absl::StatusOr<Tensor> eval = net.Evaluate(batch.inputs);
    ASSERT_TRUE(eval.ok()) << eval.status();
    (*local)->Eval();
    {
      autograd::NoGradGuard no_grad;
      EXPECT_LT(kernels::MaxAbsDiff(*eval, (*local)->Forward(batch.inputs)), kTolerance);
    }
    EXPECT_TRUE(host->server()->is_training());
  }
  EXPECT_TRUE(group->ShutdownAll().ok());
}

// The phases of the trainers' steps at the server (ParameterServer's contract), driven
// directly so that the order of the requests is known.
TEST(RpcTutorialsTest, ParameterServerTrainersComputeTogetherAndUpdateAlone) {
  auto host = std::make_shared<ParameterServerHost>(DType::kFloat32);
  auto group = rpc::testing::AgentGroup::Start(1);
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE(host->Get("cnn", 0).ok());
  ParameterServer& ps = *host->server();
  rpc::Executor& executor = (*group)[0].executor();
  const absl::Duration wait = absl::Seconds(20);
  // Two trainers compute at once.
  Future<bool> step1 = ps.BeginStep(executor), step2 = ps.BeginStep(executor);
  ASSERT_TRUE(step1.Get(wait).ok());
  ASSERT_TRUE(step2.Get(wait).ok());
  // Trainer 1's update waits for trainer 2's backward pass.
  Future<bool> update1 = ps.BeginUpdate(executor);
  EXPECT_FALSE(update1.IsReady());
  Future<bool> update2 = ps.BeginUpdate(executor);
  ASSERT_TRUE(update1.Get(wait).ok());  // no one computes: the first asked runs
  EXPECT_FALSE(update2.IsReady());      // updates run alone
  Future<bool> next1 = ps.BeginStep(executor);
  EXPECT_FALSE(next1.IsReady());  // steps wait while an update runs or waits
  ps.EndStep();
  ASSERT_TRUE(update2.Get(wait).ok());
  EXPECT_FALSE(next1.IsReady());
  ps.EndStep();
  ASSERT_TRUE(next1.Get(wait).ok());
  // Alone, a trainer's update runs as soon as it asks.
  Future<bool> update3 = ps.BeginUpdate(executor);
  ASSERT_TRUE(update3.Get(wait).ok());
  ps.EndStep();
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(RpcTutorialsTest, RnnStepGradientsEqualOneProcess) {
  std::vector<std::shared_ptr<DistAutograd>> engines(2);
  rpc::AgentOptions o;
  o.default_timeout = absl::Seconds(30);
  auto group = rpc::testing::AgentGroup::Start(
      2,
      [&](rpc::Agent& a) -> absl::Status {
        if (absl::Status s = rpc::Assign(DistAutograd::Install(a), engines[static_cast<size_t>(a.self().rank)]);
            !s.ok()) {
          return s;
        }
        return a.self().rank == 0 ? RegisterRowRnnModules(a, DType::kFloat64) : absl::OkStatus();
      },
      o);
  ASSERT_NE(group, nullptr);
  const int64_t seed = 5;
  const data::Batch batch = MakeBatch(4, 13);
  {
    rpc::Agent& trainer = (*group)[1];
    absl::StatusOr<RowRnn> rnn = RowRnn::Create(trainer, "worker0", seed, RowRnnOptions{.dtype = DType::kFloat64});
    ASSERT_TRUE(rnn.ok()) << rnn.status();
    absl::StatusOr<std::vector<rpc::RRef<Tensor>>> params = rnn->ParameterRRefs(trainer);
    ASSERT_TRUE(params.ok()) << params.status();
    EXPECT_EQ(params->size(), 2u + 8u + 2u);  // encoder, LSTM (2 layers), decoder

    Context ctx(*engines[1]);
    absl::StatusOr<Tensor> logits = rnn->Forward(batch.inputs);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const Tensor loss = nn::CrossEntropyLoss(*logits, batch.targets);
    absl::Status s = ctx.Backward({loss});
    ASSERT_TRUE(s.ok()) << s;

    // The same three modules in this process.
    Generator g0(seed), g1(seed + 1), g2(seed + 2);
    nn::Linear encoder(28, 64, g0, true, DType::kFloat64);
    nn::LSTM lstm(64, 128, g1, nn::RnnOptions{.num_layers = 2, .batch_first = true}, DType::kFloat64);
    nn::Linear decoder(128, 10, g2, true, DType::kFloat64);
    const int64_t n = batch.inputs.size(0);
    const Tensor emb = Reshape(encoder.Forward(Reshape(batch.inputs, {n * 28, 28})), {n, 28, 64});
    const Tensor out = lstm.Forward(emb);
    const Tensor local_logits = decoder.Forward(Select(out, 1, 27));
    const Tensor local_loss = nn::CrossEntropyLoss(local_logits, batch.targets);
    autograd::Backward({local_loss});
    EXPECT_LT(kernels::MaxAbsDiff(*logits, local_logits), kTolerance);

    // The LSTM's, here.
    const nn::NamedTensors mine = rnn->lstm().NamedParameters(), want = lstm.NamedParameters();
    ASSERT_EQ(mine.size(), want.size());
    for (size_t i = 0; i < mine.size(); ++i) ExpectNear(ctx.GradOf(mine[i].second), want[i].second.grad(), mine[i].first);
    // The encoder's and decoder's, on the server (told apart by their shapes).
    const std::vector<std::pair<Tensor, Tensor>> served = engines[0]->GradientsOf(ctx.id());
    ASSERT_EQ(served.size(), 4u);
    int matched = 0;
    for (const auto& [leaf, grad] : served) {
      for (const nn::Linear* m : {&encoder, &decoder}) {
        for (const auto& [name, p] : m->NamedParameters()) {
          if (p.sizes() == leaf.sizes()) {
            ExpectNear(grad, p.grad(), name);
            ++matched;
          }
        }
      }
    }
    EXPECT_EQ(matched, 4);
  }
  EXPECT_TRUE(group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::examples
