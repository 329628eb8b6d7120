// Test helper of the param_server tests that start real server processes: this test
// process as rank 0 of `world`, hosting the store at 127.0.0.1:port (nullptr, with a test
// failure, if it cannot start).
#ifndef GRADWIRE_PARAM_SERVER_TESTS_RANK_ZERO_H_
#define GRADWIRE_PARAM_SERVER_TESTS_RANK_ZERO_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "gradwire/rpc/agent.h"

namespace gw::param_server::testing {

inline std::shared_ptr<rpc::Agent> StartRankZero(int world, int port) {
  rpc::AgentOptions o;
  o.world_size = world;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.start_timeout = absl::Seconds(30);
  auto agent = rpc::Agent::Start(o);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? *agent : nullptr;
}

}  // namespace gw::param_server::testing

#endif  // GRADWIRE_PARAM_SERVER_TESTS_RANK_ZERO_H_
