// AgentGroup: `n` agents on threads of this process sharing a fresh store server (or the
// etcd of base.rendezvous, when that is an etcd:// address), for tests of rpc and the
// layers above it.
#ifndef GRADWIRE_RPC_TESTS_AGENT_GROUP_H_
#define GRADWIRE_RPC_TESTS_AGENT_GROUP_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/faults.h"

namespace gw::rpc::testing {

// Every agent has `register_fn` applied (in its setup) before the group is returned; a
// setup that fails (returns an error) fails the test and Start returns null. `per_rank`
// adjusts each rank's copy of `base` (e.g. its device maps) before it starts.
class AgentGroup {
 public:
  using PerRank = std::function<void(int rank, AgentOptions&)>;
  static std::unique_ptr<AgentGroup> Start(int n, Setup register_fn = {}, AgentOptions base = {},
                                           PerRank per_rank = {});
  ~AgentGroup();
  Agent& operator[](int rank) { return *agents_[static_cast<size_t>(rank)]; }
  int size() const { return static_cast<int>(agents_.size()); }
  // Graceful shutdown of every agent at once; returns the first error.
  absl::Status ShutdownAll();
  // Waits (on the agents' RRef events) until no agent owns, uses or is still settling
  // an RRef; the error names each agent that is not empty by the deadline, with its
  // counts.
  absl::Status AwaitRRefsReleased(absl::Duration timeout = absl::Seconds(20));
  const std::string& store_address() const { return store_address_; }
  // Starts a worker that joins this group's running job (AgentOptions::join; `base`'s
  // other options apply, `setup` as in Start); null (and a test failure) if it cannot.
  std::shared_ptr<Agent> Join(Setup setup = {}, AgentOptions base = {}) const;

 private:
  std::unique_ptr<StoreServer> store_;
  std::string store_address_;
  std::vector<std::shared_ptr<Agent>> agents_;
};

// A fault injector following `spec` (faults.h, e.g. "drop:0.05,close_after:40,seed:3")
// for AgentOptions::transport_options.faults; a spec that does not parse fails the test
// and injects nothing.
std::shared_ptr<FaultInjector> InjectFaults(absl::string_view spec);
// Expects the faults of a drop/duplicate plan to have happened and been repaired by the
// link (retransmissions, discarded duplicates) without closing any connection.
void ExpectRepairedWithoutCloses(const FaultInjector& faults);

// Runs this binary (/proc/self/exe) as a child with GW_TEST_ROLE=role and the given extra
// environment; the child is killed when this process dies.
pid_t SpawnSelf(const std::string& role, const std::map<std::string, std::string>& env);
// Waits up to 30 s for `pid` to exit (then kills it): its exit code, 128 + signal, or -1.
int WaitForExit(pid_t pid);

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_AGENT_GROUP_H_
