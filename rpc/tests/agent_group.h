// AgentGroup: `n` agents on threads of this process sharing a fresh store server, for
// tests of rpc and the layers above it.
#ifndef GRADWIRE_RPC_TESTS_AGENT_GROUP_H_
#define GRADWIRE_RPC_TESTS_AGENT_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/rpc/agent.h"

namespace gw::rpc::testing {

// Every agent has `register_fn` applied (in its setup) before the group is returned.
class AgentGroup {
 public:
  static std::unique_ptr<AgentGroup> Start(int n, const std::function<void(Agent&)>& register_fn = {},
                                           AgentOptions base = {});
  ~AgentGroup();
  Agent& operator[](int rank) { return *agents_[static_cast<size_t>(rank)]; }
  int size() const { return static_cast<int>(agents_.size()); }
  // Graceful shutdown of every agent at once; returns the first error.
  absl::Status ShutdownAll();
  const std::string& store_address() const { return store_address_; }

 private:
  std::unique_ptr<StoreServer> store_;
  std::string store_address_;
  std::vector<std::shared_ptr<Agent>> agents_;
};

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_AGENT_GROUP_H_
