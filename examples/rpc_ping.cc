// A first multi-process program: every worker registers "add" and "whoami"; each worker
// calls the next one, checks the answer, and all shut down together.
//
//   build-release/worker/gradwire launch -n 3 build-release/examples/rpc_ping
#include <cstdio>

#include "gradwire/gradwire.h"
#include "gradwire/rpc/agent.h"

int main() {
  absl::StatusOr<gw::rpc::AgentOptions> options = gw::rpc::AgentOptions::FromEnv();
  if (!options.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::shared_ptr<gw::rpc::Agent>> agent =
      gw::rpc::Agent::Start(*options, [](gw::rpc::Agent& a) {
        (void)a.Register("add", [](gw::Tensor x, gw::Tensor y) { return gw::kernels::Add(x, y); });
        (void)a.Register("whoami", [&a] { return a.self().name; });
      });
  if (!agent.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(agent.status().message()).c_str());
    return 1;
  }
  gw::rpc::Agent& a = **agent;

  const auto& workers = a.workers();
  const std::string next = workers[(a.self().rank + 1) % workers.size()].name;
  gw::Tensor x = gw::Tensor::Full({2, 3}, a.self().rank), y = gw::Tensor::Ones({2, 3});
  absl::StatusOr<gw::Tensor> sum = a.Sync<gw::Tensor>(next, "add", x, y);
  absl::StatusOr<std::string> name = a.Sync<std::string>(next, "whoami");
  if (!sum.ok() || !name.ok()) {
    std::fprintf(stderr, "error: %s\n",
                 std::string((sum.ok() ? name.status() : sum.status()).message()).c_str());
    return 1;
  }
  std::printf("%s asked %s: add -> %s\n", a.self().name.c_str(), name->c_str(),
              sum->ToString().c_str());
  const bool ok = sum->ToVector<float>()[0] == static_cast<float>(a.self().rank + 1);
  absl::Status shutdown = a.Shutdown();  // graceful: waits for every worker
  if (!shutdown.ok()) std::fprintf(stderr, "shutdown: %s\n", std::string(shutdown.message()).c_str());
  return ok && shutdown.ok() ? 0 : 1;
}
