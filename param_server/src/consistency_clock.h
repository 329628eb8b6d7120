// Internal: ConsistencyClock, one shard's consistency protocol (server.h: kSync, kAsync,
// kBoundedStaleness) without data, locks or RPC, so that it can be tested alone.
//
// Contract
//   - Push(clock, trainer, ops) runs one push through the protocol and calls the data
//     operations it needs:
//       kSync             clock < the open step: a retry of a push already applied,
//                         nothing happens. A clock restored from a checkpoint meeting a
//                         later clock: ops.drop_step and the step jumps there (the steps
//                         in between were lost with the server). Another clock:
//                         FAILED_PRECONDITION. A trainer that pushed this step already: a
//                         retry, nothing happens. Otherwise ops.accumulate, and once every
//                         trainer has pushed, ops.apply_step and the step advances.
//       kAsync            ops.apply_now (no identity: a retried push applies again).
//       kBoundedStaleness clock below the trainer's next clock: a retry; otherwise
//                         ops.apply_now and the trainer's next clock is clock + 1.
//     kSync and kBoundedStaleness check the trainer (INVALID_ARGUMENT outside [0,
//     trainers)). An op that throws leaves the clock as if the push had not come (the
//     trainer is not counted) and the exception propagates.
//   - Readable(clock): a pull for `clock` may be served now (kSync: step clock - 1 was
//     applied; kBoundedStaleness: every trainer has reached clock - staleness; kAsync:
//     always).
//   - Lagging(clock): the trainers a pull for `clock` waits for, by index.
//   - Restore(...) sets the state a checkpoint saved and marks the clock restored.
//   - Not thread-safe: the shard's mutex guards it.
#ifndef GRADWIRE_PARAM_SERVER_SRC_CONSISTENCY_CLOCK_H_
#define GRADWIRE_PARAM_SERVER_SRC_CONSISTENCY_CLOCK_H_

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gradwire/param_server/server.h"

namespace gw::param_server::internal {

class ConsistencyClock {
 public:
  // What a push does to the shard's data, by consistency mode.
  struct Ops {
    std::function<void()> accumulate;  // kSync: add this push to the open step
    std::function<void()> apply_step;  // kSync: apply the open step's mean, reset it
    std::function<void()> apply_now;   // kAsync, kBoundedStaleness: apply this push
    std::function<void()> drop_step;   // kSync: forget the open step's pushes
  };

  ConsistencyClock(Consistency mode, int trainers, int64_t staleness);

  absl::Status Push(int64_t clock, int64_t trainer, const Ops& ops);
  bool Readable(int64_t clock) const;
  std::vector<int> Lagging(int64_t clock) const;

  Consistency mode() const { return mode_; }
  int trainers() const { return trainers_; }
  int64_t staleness() const { return staleness_; }
  // kSync: steps applied (the open step's clock).
  int64_t applied() const { return applied_; }
  // kSync: trainers counted in the open step.
  const std::set<int>& pushed() const { return pushed_; }
  // kBoundedStaleness: each trainer's next clock.
  const std::vector<int64_t>& next_clocks() const { return next_; }
  bool restored() const { return restored_; }

  // REQUIRES: next_clocks.size() == trainers, every pushed trainer in [0, trainers).
  void Restore(int64_t applied, std::vector<int64_t> next_clocks, std::set<int> pushed);

 private:
  absl::Status AddToStep(int64_t clock, int trainer, const Ops& ops);

  const Consistency mode_;
  const int trainers_;
  const int64_t staleness_;
  int64_t applied_ = 0;
  std::set<int> pushed_;
  std::vector<int64_t> next_;
  bool restored_ = false;
};

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_CONSISTENCY_CLOCK_H_
