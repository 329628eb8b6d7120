// RemoteModule: a module built on one worker, called from others (agents on threads of
// this process, real loopback connections).
#include "gradwire/dist_nn/remote_module.h"

#include <gtest/gtest.h>

#include <thread>

#include "agent_group.h"
#include "gradwire/nn/layers.h"
#include "gradwire/tensor/kernels.h"

namespace gw::dist_nn {
namespace {

using rpc::Agent;
using rpc::AgentOptions;
using rpc::RRef;

// The module factories and helpers every test worker offers.
void RegisterModules(Agent& agent) {
  (void)RegisterModuleFactory(agent, "null_module", [] { return std::shared_ptr<nn::Module>(); });
  (void)RegisterModuleFactory(agent, "linear", [](int64_t in, int64_t out, int64_t seed) {
    Generator gen(static_cast<uint64_t>(seed));
    return std::make_shared<nn::Linear>(in, out, gen);
  });
  (void)agent.Register("module_echo", [](ModuleRRef r) { return r; });
  (void)agent.Register("add_in_place", [](Tensor t, double v) {
    kernels::AddInPlace(t, Tensor::Full(t.sizes(), v));
    return true;
  });
}

std::unique_ptr<rpc::testing::AgentGroup> StartGroup(int n) {
  AgentOptions o;
  o.rref_leak_check = AgentOptions::LeakCheck::kError;
  o.default_timeout = absl::Seconds(20);
  return rpc::testing::AgentGroup::Start(n, RegisterModules, o);
}

TEST(RemoteModuleTest, ForwardMatchesTheSameModuleRunLocally) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  {
    absl::StatusOr<RemoteModule> m = RemoteModule::Create((*g)[0], "worker1", "linear", int64_t{8}, int64_t{3},
                                                          int64_t{42});
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->worker(), "worker1");
    EXPECT_NE(m->Describe()->find("Linear(in_features=8, out_features=3"), std::string::npos) << *m->Describe();
    Generator gen(42);
    nn::Linear local(8, 3, gen);
    Generator data(7);
    Tensor x = Tensor::Randn({5, 8}, data);
    absl::StatusOr<Tensor> y = m->Forward(x);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(kernels::MaxAbsDiff(*y, local.Forward(x)), 0.0);
    absl::StatusOr<Tensor> y2 = m->ForwardAsync(x).Get();
    ASSERT_TRUE(y2.ok());
    EXPECT_EQ(kernels::MaxAbsDiff(*y2, *y), 0.0);
    // A wrong input shape is the module's error, reported with worker and method.
    absl::StatusOr<Tensor> bad = m->Forward(Tensor::Ones({5, 7}));
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("worker1"), std::string::npos) << bad.status();
  }
  absl::Status down = g->ShutdownAll();
  ASSERT_TRUE(down.ok()) << down;
}

TEST(RemoteModuleTest, RemoteParametersAreTheModulesOwnTensors) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  {
    absl::StatusOr<RemoteModule> m = RemoteModule::Create((*g)[0], "worker1", "linear", int64_t{4}, int64_t{2},
                                                          int64_t{1});
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<std::vector<RRef<Tensor>>> params = m->RemoteParameters();
    ASSERT_TRUE(params.ok()) << params.status();
    ASSERT_EQ(params->size(), 2u);  // weight, bias
    for (const RRef<Tensor>& p : *params) EXPECT_EQ(p.Owner(), "worker1");
    Generator gen(1);
    nn::Linear local(4, 2, gen);
    EXPECT_EQ(kernels::MaxAbsDiff(*(*params)[0].ToHere(), local.Parameters()[0]), 0.0);
    // Changing the parameter where it lives changes the module.
    ASSERT_TRUE((*params)[1].Sync<bool>("add_in_place", 1.0).ok());
    Tensor x = Tensor::Zeros({1, 4});
    absl::StatusOr<Tensor> y = m->Forward(x);
    ASSERT_TRUE(y.ok());
    EXPECT_EQ(kernels::MaxAbsDiff(*y, kernels::AddScalar(local.Forward(x), 1.0)), 0.0);
  }
  absl::Status down = g->ShutdownAll();
  ASSERT_TRUE(down.ok()) << down;
}

TEST(RemoteModuleTest, ManyClientsCallOneModuleConcurrently) {
  auto g = StartGroup(3);
  ASSERT_NE(g, nullptr);
  {
    absl::StatusOr<RemoteModule> m = RemoteModule::Create((*g)[1], "worker0", "linear", int64_t{16}, int64_t{4},
                                                          int64_t{9});
    ASSERT_TRUE(m.ok()) << m.status();
    // worker2 gets its own handle to the same module by receiving its RRef.
    absl::StatusOr<RRef<std::shared_ptr<nn::Module>>> other =
        (*g)[1].Sync<ModuleRRef>("worker2", "module_echo", m->module_rref());
    ASSERT_TRUE(other.ok()) << other.status();
    Generator gen(9);
    nn::Linear local(16, 4, gen);
    std::vector<std::thread> threads;
    std::atomic<int> wrong{0};
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        Generator data(static_cast<uint64_t>(100 + t));
        for (int i = 0; i < 20; ++i) {
          Tensor x = Tensor::Randn({3, 16}, data);
          // Odd threads call through the RRef worker2 received, by the module's own message.
          absl::StatusOr<Tensor> y = t % 2 == 0 ? m->Forward(x) : RemoteModule::FromRRef(*other).Forward(x);
          if (!y.ok() || kernels::MaxAbsDiff(*y, local.Forward(x)) != 0.0) ++wrong;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
  }
  absl::Status down = g->ShutdownAll();
  ASSERT_TRUE(down.ok()) << down;
}

TEST(RemoteModuleTest, FactoryErrorsSurfaceFromCreate) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  absl::StatusOr<RemoteModule> missing = RemoteModule::Create((*g)[0], "worker1", "no_such_factory");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  // In this layer's words, with no internal name (the RRef protocol's) in it.
  EXPECT_EQ(missing.status().message(),
            "worker1 has no module factory 'no_such_factory' (register it with dist_nn::RegisterModuleFactory in that "
            "worker's Agent::Start setup; functions registered there: add_in_place, linear, module_echo, null_module)");
  // A module built here (this worker owns it) says the same.
  absl::StatusOr<RemoteModule> missing_here = RemoteModule::Create((*g)[0], "worker0", "mpl");
  EXPECT_EQ(missing_here.status().code(), absl::StatusCode::kNotFound) << missing_here.status();
  EXPECT_EQ(missing_here.status().message().rfind("worker0 has no module factory 'mpl' (register it with", 0), 0u)
      << missing_here.status();
  absl::StatusOr<RemoteModule> wrong_args = RemoteModule::Create((*g)[0], "worker1", "linear", std::string("x"));
  EXPECT_EQ(wrong_args.status().code(), absl::StatusCode::kInvalidArgument) << wrong_args.status();
  absl::StatusOr<RemoteModule> null = RemoteModule::Create((*g)[0], "worker1", "null_module");
  EXPECT_EQ(null.status().code(), absl::StatusCode::kFailedPrecondition) << null.status();
  absl::Status down = g->ShutdownAll();
  ASSERT_TRUE(down.ok()) << down;
}

}  // namespace
}  // namespace gw::dist_nn
