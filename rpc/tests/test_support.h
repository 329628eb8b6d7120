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
#include "agent_group.h"
#include "gradwire/rpc/agent.h"

namespace gw::rpc::testing {

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

// Registers the functions every test worker offers: "add", "echo", "sleep_ms", "spin_ms"
// (computes for that long), "fail",
// "throw", "kinds", "later" (answers through a Future), "whoami"; for RRefs
// "rref_stash" (keeps an RRef<Tensor>, returns the sum of its value), "rref_clear",
// "rref_forward" (stashes it on another worker), "rref_own" (returns an RRef owned by
// the callee), "rref_echo", "rref_stats", "make_full", "scale", "make_counter" and
// "counter_add" (a Counter object and its method), "add_in_place" (adds a constant to
// a tensor in place).
void RegisterTestFunctions(Agent& agent);

// Runs the role named by GW_TEST_ROLE; returns the process exit code. Roles: "worker"
// (serves the test functions until the group shuts down), "options" (prints the
// addresses AgentOptions::FromEnv picks), "host_pair" (rank 1 of two sends rank 0 a large
// tensor; both print their addresses and shared-memory stats), "probe" (a TCP connect to
// PROBE_ADDR:PROBE_PORT, printing the local address and the outcome), "partition" (one of
// three workers whose second host is cut off, multi_host_test.cc), "scale" (meets the
// group, calls every other worker once, reports its footprint, scale_test.cc).
int RunRole(const std::string& role);

int CountThreads();
int CountOpenFds();
int CountSockets();
// Calls "noop" on every other worker at once and waits for every answer.
absl::Status CallEveryOtherWorker(Agent& agent);

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_TEST_SUPPORT_H_
