// Job: agents on threads of this process with the collectives layer installed, and
// their groups; for tests of the collectives and of the layers above them.
#ifndef GRADWIRE_COLLECTIVES_TESTS_COLLECTIVES_JOB_H_
#define GRADWIRE_COLLECTIVES_TESTS_COLLECTIVES_JOB_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "agent_group.h"
#include "gradwire/collectives/collectives.h"

namespace gw::collectives::testing {

using rpc::testing::AgentGroup;

struct Job {
  std::unique_ptr<AgentGroup> agents;
  std::vector<std::shared_ptr<Collectives>> layers;

  // `more` is run in every agent's setup after the collectives were installed (e.g. to
  // install distributed autograd as well).
  static Job Start(int n, rpc::AgentOptions base = {}, rpc::Setup more = {}) {
    return Start(n, base, [more](rpc::Agent& agent, const std::shared_ptr<Collectives>&) { return more(agent); });
  }
  // `more` also gets the agent's collectives layer (e.g. for layers built on it).
  static Job Start(int n, rpc::AgentOptions base,
                   std::function<absl::Status(rpc::Agent&, const std::shared_ptr<Collectives>&)> more) {
    Job job;
    job.layers.resize(static_cast<size_t>(n));
    auto* layers = &job.layers;
    job.agents = AgentGroup::Start(
        n,
        [layers, more](rpc::Agent& agent) {
          auto& layer = (*layers)[static_cast<size_t>(agent.self().rank)];
          absl::Status s = rpc::Assign(Collectives::Install(agent), layer);
          return s.ok() ? more(agent, layer) : s;
        },
        base);
    return job;
  }
  int size() const { return static_cast<int>(layers.size()); }
  // Runs fn(rank) on one thread per rank.
  void OnEveryRank(const std::function<void(int)>& fn) const {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }
  std::vector<std::shared_ptr<ProcessGroup>> Groups(std::vector<int> ranks = {}, GroupOptions options = {}) {
    std::vector<std::shared_ptr<ProcessGroup>> groups(static_cast<size_t>(size()));
    std::vector<int> members = ranks;
    if (members.empty()) {
      for (int r = 0; r < size(); ++r) members.push_back(r);
    }
    for (int r : members) {
      auto g = layers[static_cast<size_t>(r)]->NewGroup(ranks, options);
      EXPECT_TRUE(g.ok()) << g.status();
      if (g.ok()) groups[static_cast<size_t>(r)] = *g;
    }
    return groups;
  }
};

}  // namespace gw::collectives::testing

#endif  // GRADWIRE_COLLECTIVES_TESTS_COLLECTIVES_JOB_H_
