// Internal: TrainerRegistry, which worker each trainer of a parameter server pushes from,
// and which of those workers were declared dead (rpc::Agent::WatchPeers).
//
// Contract
//   - Pushed(trainer, rank, worker) records that trainer index `trainer` pushed from the
//     worker of agent rank `rank`; a trainer that pushes is alive (a restarted trainer
//     pushes again under its index).
//   - WorkerGone(rank) marks the trainers that last pushed from that worker dead; it
//     returns whether any was.
//   - DeadAmong(trainers) describes the first dead trainer of the list ("trainer 1
//     (worker2)"), or returns "" when none is: a step that waits for a dead trainer's push
//     fails at once (UNAVAILABLE naming it) instead of at the table's sync_timeout.
//   - RankOf(trainer): the agent rank it last pushed from, -1 before its first push.
//   - Thread-safe.
#ifndef GRADWIRE_PARAM_SERVER_SRC_TRAINER_REGISTRY_H_
#define GRADWIRE_PARAM_SERVER_SRC_TRAINER_REGISTRY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace gw::param_server::internal {

class TrainerRegistry {
 public:
  void Pushed(int64_t trainer, int rank, const std::string& worker);
  bool WorkerGone(int rank);
  std::string DeadAmong(const std::vector<int>& trainers) const;
  // The agent rank trainer `trainer` last pushed from (-1: it has not pushed).
  int RankOf(int64_t trainer) const;

 private:
  struct Trainer {
    int rank = -1;
    std::string worker;
    bool dead = false;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int64_t, Trainer> trainers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_TRAINER_REGISTRY_H_
