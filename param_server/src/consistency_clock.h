// Internal: ConsistencyClock, one shard's consistency protocol (server.h: kSync, kAsync,
// kBoundedStaleness) without data, locks or RPC, so that it can be tested alone.
//
// Contract
//   - Push(clock, trainer, ops) runs one push through the protocol and calls the data
//     operations it needs:
//       kSync             clock one before the open step: a retry of a push already
//                         applied, nothing happens; an earlier clock: FAILED_PRECONDITION
//                         (not a retry: a trainer that does not know where the table is,
//                         e.g. one that did not resume a restored checkpoint). A clock restored from a checkpoint meeting a
//                         later clock: ops.drop_step and the step jumps there (the steps
//                         in between were lost with the server). Another clock:
//                         FAILED_PRECONDITION. A trainer that pushed this step already: a
//                         retry, nothing happens. Otherwise ops.accumulate, and once every
//                         trainer has pushed, ops.apply_step and the step advances.
//       kAsync            ops.apply_now (no identity: a retried push applies again).
//       kBoundedStaleness clock one below the trainer's next clock: a retry; further
//                         below: FAILED_PRECONDITION, as kSync (but a trainer's first
//                         push after Restore, which is applied at whatever clock: a
//                         resumed trainer, or one whose server restarted); otherwise
//                         ops.apply_now and the trainer's next clock is clock + 1.
//     kSync and kBoundedStaleness check the trainer: INVALID_ARGUMENT when it is not one
//     of the table's (also once it left: a bounded-staleness trainer at once, a
//     synchronous one when its last step was applied; before that a later step is
//     FAILED_PRECONDITION), FAILED_PRECONDITION for a step before it joined. A retry of a
//     synchronous push already applied is a no-op whoever sent it.
//     An op that throws leaves the clock as if the push had not come (the trainer is not
//     counted) and the exception propagates.
//   - Trainers: 0 .. trainers-1 from clock 0 (the table's creation), then elastic:
//       Join(t, from, ops)  trainer t takes part from clock `from` on. kSync: a step that
//                           has started (from < the open step) cannot take it: the open
//                           step is returned instead, to ask again with (the client asks
//                           every server with the largest answer until all admit it). A
//                           trainer admitted before that has not pushed moves to the later
//                           clock (the step it was admitted to may then complete without
//                           it: ops.apply_step). kBoundedStaleness: its clock starts at
//                           `from`. kAsync: nothing to do. Returns the clock it takes part
//                           from. JoinHint() is where a trainer would join now (kSync: the
//                           open step; kBoundedStaleness: the furthest trainer's clock).
//       Leave(t, last, ops) trainer t took part up to its push at clock `last`: kSync steps
//                           after `last` complete without it (the open step at once, with
//                           ops.apply_step, when the others have pushed it), and
//                           kBoundedStaleness pulls stop waiting for it.
//     A kSync step is the mean of the pushes of the trainers that take part in it (those
//     that joined at or before it and did not leave before it).
//   - Readable(clock): a pull for `clock` may be served now (kSync: step clock - 1 was
//     applied; kBoundedStaleness: every trainer has reached clock - staleness; kAsync:
//     always).
//   - Lagging(clock): the trainers a pull for `clock` waits for, by index.
//   - Restore(...) sets the state a checkpoint saved and marks the clock restored.
//   - Not thread-safe: the shard's mutex guards it.
#ifndef GRADWIRE_PARAM_SERVER_SRC_CONSISTENCY_CLOCK_H_
#define GRADWIRE_PARAM_SERVER_SRC_CONSISTENCY_CLOCK_H_

#include <cstdint>
#include <climits>
#include <functional>
#include <map>
#include <set>
#include <string>
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

  static constexpr int64_t kForever = INT64_MAX;
  // A trainer of the table: it takes part in clocks [from, until].
  struct Trainer {
    int64_t from = 0;
    int64_t until = kForever;
    int64_t next = 0;  // kBoundedStaleness: the clock after its last push
  };

  ConsistencyClock(Consistency mode, int trainers, int64_t staleness);

  absl::Status Push(int64_t clock, int64_t trainer, const Ops& ops);
  bool Readable(int64_t clock) const;
  std::vector<int> Lagging(int64_t clock) const;

  int64_t JoinHint() const;
  int64_t Join(int trainer, int64_t from, const Ops& ops);
  void Leave(int trainer, int64_t last, const Ops& ops);

  Consistency mode() const { return mode_; }
  int64_t staleness() const { return staleness_; }
  // kSync: steps applied (the open step's clock).
  int64_t applied() const { return applied_; }
  // kSync: trainers counted in the open step, and how many take part in it.
  const std::set<int>& pushed() const { return pushed_; }
  int taking_part() const;
  // Every trainer the table has had and may still hear from, by index.
  const std::map<int, Trainer>& trainers() const { return trainers_; }
  bool restored() const { return restored_; }
  void ClearRestored() { restored_ = false; }

  // REQUIRES: every pushed trainer is one of `trainers`.
  void Restore(int64_t applied, std::map<int, Trainer> trainers, std::set<int> pushed);

 private:
  absl::Status AddToStep(int64_t clock, int trainer, const Ops& ops);
  bool TakesPart(int trainer, int64_t clock) const;
  // kSync: applies the open step once every trainer taking part pushed it.
  void CompleteStep(const Ops& ops);
  std::string Names() const;  // "0, 1, 2"
  absl::Status Passed(int64_t clock, int64_t trainer, int64_t at) const;  // a push of a long-passed step

  const Consistency mode_;
  const int64_t staleness_;
  int64_t applied_ = 0;
  std::set<int> pushed_;
  std::map<int, Trainer> trainers_;
  bool restored_ = false;
  std::set<int> unheard_;  // kBoundedStaleness: restored trainers that have not pushed since
};

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_CONSISTENCY_CLOCK_H_
