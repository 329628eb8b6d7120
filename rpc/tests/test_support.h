// Test support for the rpc suite: groups of agents on threads, and child processes that
// re-run this test binary in a role (see test_main.cc).
#ifndef GRADWIRE_RPC_TESTS_TEST_SUPPORT_H_
#define GRADWIRE_RPC_TESTS_TEST_SUPPORT_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/agent.h"

namespace gw::rpc::testing {

// Starts `n` agents on threads of this process sharing a fresh store server; every
// agent has `register_fn` applied before the group is returned.
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

// An object that lives on its owner (RRef tests).
class Counter {
 public:
  explicit Counter(int64_t start) : total_(start) {}
  int64_t Add(int64_t d) {
    absl::MutexLock lock(&mu_);
    return total_ += d;
  }

 private:
  absl::Mutex mu_;
  int64_t total_ ABSL_GUARDED_BY(mu_);
};

// Registers the functions every test worker offers: "add", "echo", "sleep_ms", "fail",
// "throw", "kinds", "later" (answers through a Future), "whoami"; for RRefs
// "rref_stash" (keeps an RRef<Tensor>, returns the sum of its value), "rref_clear",
// "rref_forward" (stashes it on another worker), "rref_own" (returns an RRef owned by
// the callee), "rref_echo", "rref_stats", "make_full", "scale", "make_counter" and
// "counter_add" (a Counter object and its method), "add_in_place" (adds a constant to
// a tensor in place), and the module factory "linear" (in, out, seed) -> nn::Linear.
void RegisterTestFunctions(Agent& agent);

// Runs this binary as a child with GW_TEST_ROLE=role and the given extra environment.
pid_t SpawnSelf(const std::string& role, const std::map<std::string, std::string>& env);
// Runs the role named by GW_TEST_ROLE; returns the process exit code.
int RunRole(const std::string& role);

int CountThreads();
int CountOpenFds();

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_TEST_SUPPORT_H_
