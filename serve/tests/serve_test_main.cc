// main() of the serve test binary: the GoogleTest runner, or (GW_TEST_ROLE set) a process
// of a test deployment:
//   replica   serves W13's model (testing::Mlp(GW_SERVE_SEED)) as "mnist", version "v1",
//             until the group shuts down or it is killed
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_TEST_ROLE")) {
    if (std::string(role) == "replica") return RunReplica();
    std::fprintf(stderr, "unknown GW_TEST_ROLE %s\n", role);
    return 2;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
