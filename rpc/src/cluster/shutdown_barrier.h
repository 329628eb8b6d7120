// Internal: the graceful-shutdown protocol of a group, over the rendezvous store.
//
// Contract
//   Run(deadline, steps) on every worker of the group, each from its own Shutdown:
//     1. steps.drain: this worker's own calls (and the RRef control messages they caused)
//        finish or time out;
//     2. "shutdown/<rank>": every worker has reached shutdown, while all still serve;
//     3. steps.drain again (messages peers sent before they stopped may have started
//        more RRef traffic), then "rrefs_drained/<rank>": every owner's table is final,
//        and steps.check_leaks reports values still referenced elsewhere;
//     4. "exited/<rank>"; steps.await_handlers lets handlers still running for peers end;
//     5. the worker that hosts the store waits for every "exited/" key, so the store
//        stays up until everyone has read the barrier. With a store whose keys outlive
//        the job (etcd), nobody waits: a worker that finds every "exited/" key right
//        after writing its own (the last one out does, as etcd's reads are
//        linearizable) removes the run's keys (Rendezvous::ForgetRun), so that the next
//        run under the same job name starts clean; when that fails it warns on stderr
//        with the command that removes them.
//   The ranks waited for are those handed out (Start's group and the workers that joined
//   it: Rendezvous::Ranks), read again whenever those known so far arrived, so a worker
//   that joins while the others wait in their shutdown is waited for too. A worker that left (Agent::Leave) called
//   Depart, which passes every step for it at once: nobody waits for it. Every wait is bounded by `deadline`; a barrier
//   that does not complete is DEADLINE_EXCEEDED "<worker>: graceful shutdown did not complete: ..." naming the ranks
//   that did not arrive. Otherwise the result is check_leaks's.
#ifndef GRADWIRE_RPC_SRC_CLUSTER_SHUTDOWN_BARRIER_H_
#define GRADWIRE_RPC_SRC_CLUSTER_SHUTDOWN_BARRIER_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/rendezvous.h"

namespace gw::rpc::internal {

class ShutdownBarrier {
 public:
  struct Steps {
    std::function<void(absl::Time deadline)> drain;
    std::function<absl::Status()> check_leaks;
    std::function<void(absl::Time deadline)> await_handlers;
    // Whether a worker is gone (declared dead, not reconnected): a worker that joined the
    // group and is gone is not waited for (it may have died before its shutdown; the
    // workers of Start's group are, until the deadline, named if missing).
    std::function<bool(int rank)> gone;
  };

  // `capacity`: the ranks the group may grow to (AgentOptions::max_world_size).
  ShutdownBarrier(Rendezvous& rendezvous, std::string name, int rank, int world_size, int capacity)
      : rendezvous_(rendezvous), name_(std::move(name)), rank_(rank), world_size_(world_size), capacity_(capacity) {}

  absl::Status Run(absl::Time deadline, const Steps& steps);
  // This worker leaves the group: it is marked as through every step (and as left).
  absl::Status Depart();

 private:
  // Publishes "<what><rank>" and waits for every rank's.
  absl::Status Arrive(const char* what, absl::Time deadline);
  absl::Status AwaitAll(const char* what, absl::Time deadline);
  std::function<bool(int rank)> gone_;  // Run's steps.gone
  static constexpr const char* kSteps[] = {"shutdown/", "rrefs_drained/", "exited/"};

  Rendezvous& rendezvous_;
  const std::string name_;
  const int rank_;
  const int world_size_;
  const int capacity_;
  int ranks_ = 0;  // the ranks handed out, as last read
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CLUSTER_SHUTDOWN_BARRIER_H_
