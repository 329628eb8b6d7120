// main() of the param_server test binary: the GoogleTest runner, or (GW_TEST_ROLE set) a
// process of a test deployment:
//   ps_server   a parameter server (AgentOptions from the torchrun variables; checkpoints
//               in GW_PS_CHECKPOINT_DIR) that serves until the group shuts down
//   ps_trainer  trainer GW_PS_TRAINER of 2 on servers "worker1", "worker2": creates the
//               synchronous table "w" of 8 zeros and pushes step 0 to worker1 only, then
//               waits to be killed (a trainer dying mid-step)
#include <gtest/gtest.h>

#include <cstdlib>

#include "agent_group.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"

namespace {

int RunServer() {
  auto options = gw::rpc::AgentOptions::FromEnv();
  if (!options.ok()) return 2;
  options->host_store = false;
  options->shutdown_timeout = absl::Seconds(120);
  gw::param_server::ServerOptions server_options;
  if (const char* dir = std::getenv("GW_PS_CHECKPOINT_DIR")) server_options.checkpoint_dir = dir;
  std::shared_ptr<gw::param_server::ParameterServer> server;
  absl::Status installed;
  auto agent = gw::rpc::Agent::Start(*options, [&](gw::rpc::Agent& a) {
    auto s = gw::param_server::ParameterServer::Install(a, server_options);
    installed = s.status();
    if (s.ok()) server = *s;
  });
  if (!agent.ok() || !installed.ok()) {
    std::fprintf(stderr, "ps_server: %s %s\n", agent.status().ToString().c_str(), installed.ToString().c_str());
    return 3;
  }
  (void)(*agent)->store().Set("ready/" + (*agent)->self().name + "/" + std::to_string(::getpid()), "1");
  return (*agent)->Shutdown().ok() ? 0 : 4;
}

int RunTrainer() {
  auto options = gw::rpc::AgentOptions::FromEnv();
  if (!options.ok()) return 2;
  options->host_store = false;
  auto agent = gw::rpc::Agent::Start(*options);
  if (!agent.ok()) return 3;
  const int trainer = std::atoi(std::getenv("GW_PS_TRAINER"));
  gw::param_server::Client ps(**agent, {"worker1"}, trainer, 2, absl::Seconds(2));
  if (!ps.CreateDense("w", gw::Tensor::Zeros({8}), gw::optim::Sgd{.lr = 1}, gw::param_server::Consistency::kSync).ok() ||
      !ps.Push("w", 0, gw::Tensor::Ones({8})).Get().ok()) {
    return 4;
  }
  (void)(*agent)->store().Set("pushed/" + std::to_string(trainer), "1");
  absl::SleepFor(absl::Hours(1));  // killed by the test
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_TEST_ROLE")) {
    if (std::string(role) == "ps_server") return RunServer();
    if (std::string(role) == "ps_trainer") return RunTrainer();
    std::fprintf(stderr, "unknown GW_TEST_ROLE %s\n", role);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
