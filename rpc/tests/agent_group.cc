// AgentGroup: agents on threads of one process, sharing a fresh store (tests only).
#include "agent_group.h"

#include <gtest/gtest.h>

#include <thread>

namespace gw::rpc::testing {

std::unique_ptr<AgentGroup> AgentGroup::Start(int n, const std::function<void(Agent&)>& register_fn,
                                              AgentOptions base) {
  auto group = std::make_unique<AgentGroup>();
  auto server = StoreServer::Start("127.0.0.1", 0);
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return nullptr;
  }
  group->store_ = std::move(*server);
  group->store_address_ = group->store_->address();
  std::vector<absl::StatusOr<std::shared_ptr<Agent>>> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      AgentOptions o = base;
      o.rank = r;
      o.world_size = n;
      o.rendezvous = group->store_address_;
      o.host_store = false;
      results[static_cast<size_t>(r)] = Agent::Start(o, register_fn);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) {
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return nullptr;
    }
    group->agents_.push_back(*r);
  }
  return group;
}

AgentGroup::~AgentGroup() {
  agents_.clear();
  if (store_) store_->Shutdown();
}

absl::Status AgentGroup::ShutdownAll() {
  std::vector<absl::Status> results(agents_.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < agents_.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = agents_[i]->Shutdown(/*graceful=*/true); });
  }
  for (auto& t : threads) t.join();
  for (auto& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace gw::rpc::testing
