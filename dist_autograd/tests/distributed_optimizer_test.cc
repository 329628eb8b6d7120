// DistributedOptimizer over a RemoteModule stage and local parameters: after each step
// every parameter equals what the same model trained locally holds.
#include "gradwire/dist_autograd/distributed_optimizer.h"

#include <gtest/gtest.h>

#include "agent_group.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/nn/layers.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/dist_nn/remote_module.h"
#include "gradwire/tensor/kernels.h"

namespace gw::dist_autograd {
namespace {

std::shared_ptr<nn::Linear> MakeLinear(int64_t in, int64_t out, uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Linear>(in, out, gen);
}

TEST(DistributedOptimizerTest, StagesOnTwoWorkersTrainLikeTheLocalModel) {
  std::vector<std::shared_ptr<DistAutograd>> engines(2);
  rpc::AgentOptions o;
  o.default_timeout = absl::Seconds(30);
  auto group = rpc::testing::AgentGroup::Start(
      2,
      [&](rpc::Agent& a) {
        if (absl::Status s = rpc::Assign(DistAutograd::Install(a), engines[static_cast<size_t>(a.self().rank)]); !s.ok()) {
          return s;
        }
        return dist_nn::RegisterModuleFactory(a, "linear", [](int64_t in, int64_t out, int64_t seed) {
          return MakeLinear(in, out, static_cast<uint64_t>(seed));
        });
      },
      o);
  ASSERT_NE(group, nullptr);
  rpc::Agent& w0 = (*group)[0];
  {
    // worker0: Linear(6, 5) + tanh here; worker1: Linear(5, 3) as a RemoteModule.
    auto first = MakeLinear(6, 5, 1);
    absl::StatusOr<dist_nn::RemoteModule> second = dist_nn::RemoteModule::Create(w0, "worker1", "linear", int64_t{5},
                                                                         int64_t{3}, int64_t{2});
    ASSERT_TRUE(second.ok()) << second.status();
    std::vector<rpc::RRef<Tensor>> params;
    for (const Tensor& p : first->Parameters()) params.push_back(w0.Own(p));
    absl::StatusOr<std::vector<rpc::RRef<Tensor>>> remote = second->RemoteParameters();
    ASSERT_TRUE(remote.ok()) << remote.status();
    for (auto& p : *remote) params.push_back(p);
    const optim::Sgd sgd{.lr = 0.1, .momentum = 0.9};
    auto opt = DistributedOptimizer::Create(w0, sgd, params);
    ASSERT_TRUE(opt.ok()) << opt.status();

    // The same model, trained locally.
    auto l1 = MakeLinear(6, 5, 1), l2 = MakeLinear(5, 3, 2);
    std::vector<Tensor> local_params = l1->Parameters();
    for (const Tensor& p : l2->Parameters()) local_params.push_back(p);
    optim::Optimizer local_opt(local_params, sgd);

    Generator data(3);
    for (int step = 0; step < 3; ++step) {
      Tensor x = Tensor::Randn({4, 6}, data);
      Tensor target = Tensor::Randn({4, 3}, data);
      {
        Context ctx(*engines[0]);
        absl::StatusOr<Tensor> y = second->Forward(Tanh(first->Forward(x)));
        ASSERT_TRUE(y.ok()) << y.status();
        Tensor diff = Sub(*y, target);
        absl::Status s = ctx.Backward({Mean(Mul(diff, diff))});
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_TRUE((*opt)->Step(ctx).ok());
      }
      local_opt.ZeroGrad();
      Tensor ldiff = Sub(l2->Forward(Tanh(l1->Forward(x))), target);
      autograd::Backward({Mean(Mul(ldiff, ldiff))});
      local_opt.Step();
      // Every parameter, where it lives, equals the local one.
      for (size_t i = 0; i < params.size(); ++i) {
        absl::StatusOr<Tensor> now = params[i].ToHere();
        ASSERT_TRUE(now.ok()) << now.status();
        EXPECT_LT(kernels::MaxAbsDiff(*now, local_params[i]), 1e-5) << "step " << step << " param " << i;
      }
    }
    EXPECT_FALSE(first->Parameters()[0].grad().defined());  // gradients stayed in the contexts
  }
  for (auto& e : engines) EXPECT_EQ(e->live_contexts(), 0u);
  absl::Status down = group->ShutdownAll();
  EXPECT_TRUE(down.ok()) << down;
}

TEST(DistributedOptimizerTest, BadConfigIsRejectedAndParametersWithoutAGradientStayUnchanged) {
  std::vector<std::shared_ptr<DistAutograd>> engines(2);
  auto group = rpc::testing::AgentGroup::Start(
      2, [&](rpc::Agent& a) { return rpc::Assign(DistAutograd::Install(a), engines[static_cast<size_t>(a.self().rank)]); });
  ASSERT_NE(group, nullptr);
  rpc::Agent& w0 = (*group)[0];
  rpc::RRef<Tensor> p = w0.Own(Tensor::Ones({2}).set_requires_grad(true));
  auto bad = DistributedOptimizer::Create(w0, optim::Sgd{.lr = -1}, {p});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  auto ok = DistributedOptimizer::Create(w0, optim::Adam{}, {p});
  ASSERT_TRUE(ok.ok()) << ok.status();
  // A context in which p got no gradient leaves it unchanged.
  {
    Context ctx(*engines[0]);
    ASSERT_TRUE((*ok)->Step(ctx).ok());
  }
  EXPECT_EQ(p.LocalValue()->ToVector<float>(), std::vector<float>(2, 1.0f));
}

// Fetching a whole module's parameters, or a list of parameters through an RRef, inside a
// context: the gradients land on the owner (PyTorch leaves them on the fetched copies).
// An owner of parameters without DistAutograd::Install: the error says that distributed
// autograd is not installed there and how to install it, not which internal function
// was missing.
TEST(DistributedOptimizerTest, AnOwnerWithoutDistributedAutogradIsToldToInstallIt) {
  std::shared_ptr<DistAutograd> engine;
  auto group = rpc::testing::AgentGroup::Start(2, [&](rpc::Agent& a) -> absl::Status {
    if (a.self().rank == 0) return rpc::Assign(DistAutograd::Install(a), engine);
    return a.Register("parameter", [&a] { return a.Own(Tensor::Ones({3})); });  // no DistAutograd here
  });
  ASSERT_NE(group, nullptr);
  rpc::Agent& w0 = (*group)[0];
  {
    absl::StatusOr<rpc::RRef<Tensor>> param = w0.Sync<rpc::RRef<Tensor>>("worker1", "parameter");
    ASSERT_TRUE(param.ok()) << param.status();
    auto opt = DistributedOptimizer::Create(w0, optim::Sgd{.lr = 0.1}, {*param});
    ASSERT_FALSE(opt.ok());
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kNotFound) << opt.status();
    EXPECT_EQ(opt.status().message().rfind(
                  "DistributedOptimizer: registering parameters on worker1: distributed autograd is not installed on "
                  "worker1: call dist_autograd::DistAutograd::Install(agent) in its Agent::Start setup",
                  0),
              0u)
        << opt.status();
    EXPECT_EQ(opt.status().message().find("__"), std::string::npos) << opt.status();
  }
  absl::Status down = group->ShutdownAll();
  ASSERT_TRUE(down.ok()) << down;
}

TEST(RemoteModuleAutogradTest, FetchedParametersRouteTheirGradientsToTheOwner) {
  std::vector<std::shared_ptr<DistAutograd>> engines(2);
  auto module = MakeLinear(4, 3, 5);  // lives on worker1
  rpc::AgentOptions strict;
  strict.rref_leak_check = rpc::AgentOptions::LeakCheck::kError;
  auto group = rpc::testing::AgentGroup::Start(2, [&](rpc::Agent& a) {
    (void)dist_nn::RegisterModuleFactory(a, "the_linear", [&module] { return std::shared_ptr<nn::Module>(module); });
    (void)a.Register("param_list", [&a, &module] { return a.Own(module->Parameters()); });
    return rpc::Assign(DistAutograd::Install(a), engines[static_cast<size_t>(a.self().rank)]);
  }, strict);
  ASSERT_NE(group, nullptr);
  rpc::Agent& w0 = (*group)[0];
  absl::StatusOr<dist_nn::RemoteModule> remote = dist_nn::RemoteModule::Create(w0, "worker1", "the_linear");
  ASSERT_TRUE(remote.ok()) << remote.status();
  Generator data(9);
  Tensor x = Tensor::Randn({2, 4}, data);
  auto l = MakeLinear(4, 3, 5);  // local reference
  autograd::Backward({Sum(Tanh(l->Forward(x)))});
  {
    Context ctx(*engines[0]);
    absl::StatusOr<std::map<std::string, Tensor>> p = remote->FetchParameters();
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->size(), 2u);
    Tensor w = p->at("weight"), b = p->at("bias");
    ASSERT_TRUE(ctx.Backward({Sum(Tanh(Linear(x, w, b)))}).ok());
    EXPECT_LT(kernels::MaxAbsDiff(engines[1]->GradOf(ctx.id(), module->Parameters()[0]), l->Parameters()[0].grad()), 1e-6);
    EXPECT_LT(kernels::MaxAbsDiff(engines[1]->GradOf(ctx.id(), module->Parameters()[1]), l->Parameters()[1].grad()), 1e-6);
    EXPECT_FALSE(w.grad().defined());
  }
  {
    Context ctx(*engines[0]);
    absl::StatusOr<rpc::RRef<std::vector<Tensor>>> list = w0.Sync<rpc::RRef<std::vector<Tensor>>>("worker1", "param_list");
    ASSERT_TRUE(list.ok()) << list.status();
    absl::StatusOr<std::vector<Tensor>> wb = list->ToHere();
    ASSERT_TRUE(wb.ok()) << wb.status();
    ASSERT_TRUE(ctx.Backward({Sum(Tanh(Linear(x, (*wb)[0], (*wb)[1])))}).ok());
    EXPECT_LT(kernels::MaxAbsDiff(engines[1]->GradOf(ctx.id(), module->Parameters()[0]), l->Parameters()[0].grad()), 1e-6);
  }
  remote = absl::InternalError("dropped");  // no reference left at shutdown
  absl::Status down = group->ShutdownAll();
  EXPECT_TRUE(down.ok()) << down;
}

}  // namespace
}  // namespace gw::dist_autograd
