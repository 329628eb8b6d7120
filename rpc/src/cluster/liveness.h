// Internal: Liveness, the failure detector of one agent: which peers it still hears from.
//
// Contract
//   - Every frame received from a peer on an identified connection (calls, replies,
//     heartbeats; not the hello that identifies it), counts as hearing from it:
//     Heard(rank) is one relaxed atomic increment on the transport's I/O thread (no lock,
//     no clock; the agent finds the rank with the reader-locked lookup it needs anyway).
//   - Tick(now, connected) runs every `interval` (the agent's TimerQueue) over the ranks
//     this worker has a connection to, and answers what to do:
//       ping  the peers not heard from for at least `interval`: the agent sends each a
//             heartbeat, which the peer's I/O thread answers at once (a peer whose
//             handlers compute for seconds still answers: only a frozen process, a dead
//             host or a cut network stay silent);
//       dead  the peers not heard from for `timeout`: the agent declares them dead
//             (closes their connections with UNAVAILABLE naming them, so every pending call
//             fails and every layer is told through the peer-gone path).
//     So a silent peer is declared dead within timeout + interval of the last frame it
//     sent, and a connection that carries traffic is never pinged (heartbeats cost a busy
//     job nothing). A peer's silence is counted from the first tick that sees a
//     connection to it; after it is declared dead, or when it has no connection any more,
//     its count starts again. The agent also calls Heard for every new connection to a
//     peer (dialled, or its hello accepted), so a peer declared dead and reached again is
//     not declared dead at once for the old connection's silence.
//   - A pure state machine: it sends and closes nothing itself; tests drive it with their
//     own clock. Heard is thread-safe; Tick is called by one thread at a time.
#ifndef GRADWIRE_RPC_SRC_CLUSTER_LIVENESS_H_
#define GRADWIRE_RPC_SRC_CLUSTER_LIVENESS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"

namespace gw::rpc::internal {

class Liveness {
 public:
  struct Actions {
    std::vector<int> ping;
    std::vector<int> dead;
  };

  // REQUIRES: interval > 0, timeout >= interval.
  Liveness(int world_size, absl::Duration interval, absl::Duration timeout);

  void Heard(int rank) {
    if (rank >= 0 && rank < world_size_) heard_[static_cast<size_t>(rank)].fetch_add(1, std::memory_order_relaxed);
  }
  // `connected`: the ranks this worker has at least one open connection to.
  Actions Tick(absl::Time now, const std::vector<int>& connected);

  absl::Duration interval() const { return interval_; }
  absl::Duration timeout() const { return timeout_; }

 private:
  struct Watch {
    bool watching = false;
    uint64_t heard = 0;    // heard_[rank] at the last tick
    absl::Time last_news;  // when the count last moved (or watching began)
  };

  const int world_size_;
  const absl::Duration interval_;
  const absl::Duration timeout_;
  std::unique_ptr<std::atomic<uint64_t>[]> heard_;
  std::vector<Watch> watch_;  // Tick's alone
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CLUSTER_LIVENESS_H_
