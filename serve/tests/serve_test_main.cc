// main() of the serve test binary: the GoogleTest runner, or (GW_TEST_ROLE set) a process
// of a test deployment:
//   replica   serves W13's model (testing::Mlp(GW_SERVE_SEED)) as "mnist", version "v1",
//             until the group shuts down or it is killed
//   endpoint  a job of two workers in this process (worker1 serves testing::Mlp(5) as
//             "mnist", version "v7"; worker0 runs an InferenceEndpoint on a free port) for
//             clients in other languages (grpc_python_client.py): prints one JSON line
//             {"address", "expected"} (the model's output for the input row x[i] = (i % 17) /
//             100), then serves until its stdin closes
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent_group.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/serve/inference_endpoint.h"
#include "gradwire/serve/serving.h"
#include "serve_testing.h"

namespace {

int RunReplica() {
  auto options = gw::rpc::AgentOptions::FromEnv();
  if (!options.ok()) return 2;
  options->host_store = false;
  std::shared_ptr<gw::serve::Serving> serving;
  absl::Status installed;
  auto agent = gw::rpc::Agent::Start(*options, [&](gw::rpc::Agent& a) {
    auto s = gw::serve::Serving::Install(a);
    installed = s.status();
    if (s.ok()) serving = *s;
  });
  if (!agent.ok() || !installed.ok()) {
    std::fprintf(stderr, "replica: %s %s\n", agent.status().ToString().c_str(), installed.ToString().c_str());
    return 3;
  }
  const uint64_t seed = std::strtoull(std::getenv("GW_SERVE_SEED"), nullptr, 10);
  if (absl::Status s = serving->Serve({.name = "mnist", .input_shape = {784}}, gw::serve::testing::Mlp(seed), "v1");
      !s.ok()) {
    std::fprintf(stderr, "replica: %s\n", s.ToString().c_str());
    return 4;
  }
  (void)(*agent)->store().Set("serving/" + (*agent)->self().name, "1");
  return (*agent)->Shutdown().ok() ? 0 : 5;
}

int RunEndpoint() {
  std::vector<std::shared_ptr<gw::serve::Serving>> serving(2);
  absl::Mutex mu;
  auto agents = gw::rpc::testing::AgentGroup::Start(2, [&](gw::rpc::Agent& a) -> absl::Status {
    absl::StatusOr<std::shared_ptr<gw::serve::Serving>> s = gw::serve::Serving::Install(a);
    if (!s.ok()) return s.status();
    absl::MutexLock lock(&mu);
    serving[static_cast<size_t>(a.self().rank)] = *s;
    return absl::OkStatus();
  });
  if (!agents) return 3;
  const std::shared_ptr<gw::nn::Module> model = gw::serve::testing::Mlp(5);
  if (absl::Status s = serving[1]->Serve({.name = "mnist", .input_shape = {784}}, model, "v7"); !s.ok()) {
    std::fprintf(stderr, "endpoint: %s\n", s.ToString().c_str());
    return 4;
  }
  auto endpoint = gw::serve::InferenceEndpoint::Start(serving[0], "127.0.0.1", 0);
  if (!endpoint.ok()) {
    std::fprintf(stderr, "endpoint: %s\n", endpoint.status().ToString().c_str());
    return 5;
  }
  std::vector<float> x(784);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) / 100.0f;
  gw::Tensor expected;
  {
    gw::autograd::NoGradGuard no_grad;
    expected = model->Forward(gw::Tensor::FromVector(x, {1, 784}));
  }
  std::vector<std::string> values;
  for (float v : expected.ToVector<float>()) values.push_back(absl::StrFormat("%.9g", v));
  std::printf("{\"address\": \"%s\", \"expected\": [%s]}\n", (*endpoint)->address().c_str(),
              absl::StrJoin(values, ", ").c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  (*endpoint)->Shutdown();
  serving.clear();
  return agents->ShutdownAll().ok() ? 0 : 6;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_TEST_ROLE")) {
    if (std::string(role) == "replica") return RunReplica();
    if (std::string(role) == "endpoint") return RunEndpoint();
    std::fprintf(stderr, "unknown GW_TEST_ROLE %s\n", role);
    return 2;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
