// The zoo's TutorialCnn (PyTorch's parameter-server tutorial's network) trained through
// parameter-server tables as examples/ps_fashion_mnist --model=cnn does: one synchronous
// dense table per parameter on 2 servers, 2 trainers each pulling the parameters, computing
// the gradient of its own batch and pushing it (PushPullMany) every step, equals one process
// training on the concatenated batch (SGD with momentum applied on the servers to the mean
// of the trainers' gradients), parameter by parameter, every step (float32, 1e-5 relative;
// eval mode, so that dropout draws nothing: the trainers' masks could not match one
// process's).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent_group.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/models/zoo.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"
#include "gradwire/tensor/kernels.h"

namespace gw::param_server {
namespace {

constexpr int64_t kPerTrainer = 4;
constexpr int kSteps = 3;
const optim::Sgd kSgd{.lr = 0.05, .momentum = 0.9};

std::shared_ptr<nn::Module> Cnn() {
  Generator gen(11);
  absl::StatusOr<std::shared_ptr<nn::Module>> m = models::Create("cnn", gen);
  EXPECT_TRUE(m.ok()) << m.status();
  (*m)->Eval();  // dropout off (see the file comment)
  return *m;
}

struct Batch {
  Tensor x, y;
};
Batch TrainerBatch(int step, int trainer) {
  Generator gen(static_cast<uint64_t>(100 * step + trainer + 1));
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < kPerTrainer; ++i) labels.push_back((i * 3 + step + trainer) % 10);
  return {Tensor::Uniform({kPerTrainer, 784}, 0, 1, gen), Tensor::FromVector(labels)};
}

TEST(ZooTablesTest, TutorialCnnInTablesTrainsAsOneProcessOnTheConcatenatedBatch) {
  // One process: the concatenated batches, the parameters after each step.
  std::shared_ptr<nn::Module> local = Cnn();
  optim::Optimizer local_opt(local->Parameters(), kSgd);
  std::vector<std::vector<Tensor>> want(kSteps);
  for (int step = 0; step < kSteps; ++step) {
    const Batch a = TrainerBatch(step, 0), b = TrainerBatch(step, 1);
    local_opt.ZeroGrad();
    autograd::Backward({models::Loss("cnn", local->Forward(kernels::Cat({a.x, b.x}, 0)), kernels::Cat({a.y, b.y}, 0))});
    local_opt.Step();
    for (const Tensor& p : local->Parameters()) want[static_cast<size_t>(step)].push_back(kernels::Clone(p));
  }

  // Servers on ranks 0 and 1, trainers on ranks 2 and 3.
  rpc::AgentOptions options;
  options.shutdown_timeout = absl::Seconds(5);
  std::vector<std::shared_ptr<ParameterServer>> servers(2);
  auto group = rpc::testing::AgentGroup::Start(
      4,
      [&servers](rpc::Agent& a) {
        if (a.self().rank < 2) servers[static_cast<size_t>(a.self().rank)] = *ParameterServer::Install(a);
      },
      options);
  ASSERT_NE(group, nullptr);
  std::vector<std::vector<std::vector<Tensor>>> got(2);
  auto train = [&](int trainer) {
    Client ps((*group)[2 + trainer], {"worker0", "worker1"}, trainer, 2, absl::Seconds(30));
    std::shared_ptr<nn::Module> model = Cnn();
    const nn::NamedTensors params = model->NamedParameters();
    std::vector<std::string> names;
    for (const auto& [name, p] : params) {
      ASSERT_TRUE(ps.CreateDense(name, p, kSgd, Consistency::kSync).ok()) << name;
      names.push_back(name);
    }
    std::vector<Tensor> values;
    for (const std::string& name : names) {
      absl::StatusOr<Tensor> v = ps.Pull(name, 0).Get();
      ASSERT_TRUE(v.ok()) << v.status();
      values.push_back(*v);
    }
    for (int step = 0; step < kSteps; ++step) {
      for (size_t i = 0; i < params.size(); ++i) kernels::CopyInPlace(params[i].second, values[i]);
      model->ZeroGrad();
      const Batch b = TrainerBatch(step, trainer);
      autograd::Backward({models::Loss("cnn", model->Forward(b.x), b.y)});
      std::vector<Tensor> grads;
      for (const auto& [name, p] : params) grads.push_back(p.grad());
      absl::StatusOr<std::vector<Tensor>> next = ps.PushPullMany(names, step, grads).Get();
      ASSERT_TRUE(next.ok()) << next.status();
      values = *std::move(next);
      got[static_cast<size_t>(trainer)].push_back(values);
    }
  };
  std::thread t0(train, 0), t1(train, 1);
  t0.join();
  t1.join();
  for (int trainer = 0; trainer < 2; ++trainer) {
    ASSERT_EQ(got[static_cast<size_t>(trainer)].size(), static_cast<size_t>(kSteps));
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<Tensor>& have = got[static_cast<size_t>(trainer)][static_cast<size_t>(step)];
      const std::vector<Tensor>& expect = want[static_cast<size_t>(step)];
      ASSERT_EQ(have.size(), expect.size());
      for (size_t i = 0; i < have.size(); ++i) {
        const double scale = std::max(1.0, kernels::MaxAbsDiff(expect[i], Tensor::Zeros(expect[i].sizes())));
        EXPECT_LE(kernels::MaxAbsDiff(have[i], expect[i]), 1e-5 * scale)
            << "trainer " << trainer << " step " << step << " table " << local->NamedParameters()[i].first;
      }
    }
  }
  EXPECT_TRUE(group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::param_server
