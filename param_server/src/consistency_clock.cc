#include "consistency_clock.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gw::param_server::internal {

ConsistencyClock::ConsistencyClock(Consistency mode, int trainers, int64_t staleness)
    : mode_(mode), trainers_(trainers), staleness_(staleness), next_(static_cast<size_t>(trainers), 0) {}

absl::Status ConsistencyClock::Push(int64_t clock, int64_t trainer, const Ops& ops) {
  if (mode_ == Consistency::kAsync) {
    ops.apply_now();
    return absl::OkStatus();
  }
  if (trainer < 0 || trainer >= trainers_) {
    return absl::InvalidArgumentError(absl::StrCat("no trainer ", trainer, " (the table has ", trainers_, ")"));
  }
  if (mode_ == Consistency::kSync) return AddToStep(clock, static_cast<int>(trainer), ops);
  int64_t& next = next_[static_cast<size_t>(trainer)];
  if (clock < next) return absl::OkStatus();  // a retried push already applied
  ops.apply_now();
  next = clock + 1;
  return absl::OkStatus();
}

absl::Status ConsistencyClock::AddToStep(int64_t clock, int trainer, const Ops& ops) {
  if (clock < applied_) return absl::OkStatus();  // a retry of a push already applied
  if (clock > applied_ && restored_) {
    // The server restarted from a checkpoint taken before the trainers' current step: the
    // steps in between (and the checkpoint's open step, which the trainers have passed)
    // were lost with it; join the trainers where they are.
    ops.drop_step();
    pushed_.clear();
    applied_ = clock;
  }
  if (clock != applied_) {
    return absl::FailedPreconditionError(
        absl::StrCat("push for step ", clock, " while step ", applied_, " is being aggregated"));
  }
  if (pushed_.contains(trainer)) return absl::OkStatus();  // a retried push of this step
  ops.accumulate();  // may throw: the trainer is counted only once its push is
  pushed_.insert(trainer);
  if (static_cast<int>(pushed_.size()) < trainers_) return absl::OkStatus();
  ops.apply_step();
  ++applied_;
  pushed_.clear();
  restored_ = false;
  return absl::OkStatus();
}

bool ConsistencyClock::Readable(int64_t clock) const {
  switch (mode_) {
    case Consistency::kAsync: return true;
    case Consistency::kSync: return applied_ >= clock;
    case Consistency::kBoundedStaleness: return *std::min_element(next_.begin(), next_.end()) >= clock - staleness_;
  }
  return false;
}

std::vector<int> ConsistencyClock::Lagging(int64_t clock) const {
  std::vector<int> out;
  for (int t = 0; t < trainers_; ++t) {
    const bool behind = mode_ == Consistency::kBoundedStaleness ? next_[static_cast<size_t>(t)] < clock - staleness_
                        : mode_ == Consistency::kSync           ? applied_ < clock && !pushed_.contains(t)
                                                                : false;
    if (behind) out.push_back(t);
  }
  return out;
}

void ConsistencyClock::Restore(int64_t applied, std::vector<int64_t> next_clocks, std::set<int> pushed) {
  applied_ = applied;
  next_ = std::move(next_clocks);
  pushed_ = std::move(pushed);
  restored_ = true;
}

}  // namespace gw::param_server::internal
