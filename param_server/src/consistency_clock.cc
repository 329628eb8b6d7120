#include "consistency_clock.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gw::param_server::internal {

ConsistencyClock::ConsistencyClock(Consistency mode, int trainers, int64_t staleness) : mode_(mode), staleness_(staleness) {
  for (int t = 0; t < trainers; ++t) trainers_[t] = Trainer{};
}

std::string ConsistencyClock::Names() const {
  std::vector<int> ids;
  for (const auto& [t, _] : trainers_) ids.push_back(t);
  return absl::StrJoin(ids, ", ");
}

absl::Status ConsistencyClock::Passed(int64_t clock, int64_t trainer, int64_t at) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "push of step ", clock, " by trainer ", trainer, ", but the table is at step ", at,
      restored_ ? " (restored from a checkpoint)" : "",
      ": not a retry of the last step (only step ", at - 1,
      " could be); a trainer that starts on a restored deployment continues from its step (Client::Resume)"));
}

bool ConsistencyClock::TakesPart(int trainer, int64_t clock) const {
  auto it = trainers_.find(trainer);
  return it != trainers_.end() && it->second.from <= clock && clock <= it->second.until;
}

int ConsistencyClock::taking_part() const {
  int n = 0;
  for (const auto& [t, _] : trainers_) n += TakesPart(t, applied_) ? 1 : 0;
  return n;
}

absl::Status ConsistencyClock::Push(int64_t clock, int64_t trainer, const Ops& ops) {
  if (mode_ == Consistency::kAsync) {
    ops.apply_now();
    return absl::OkStatus();
  }
  if (trainer < 0 || trainer > INT32_MAX) return absl::InvalidArgumentError(absl::StrCat("no trainer ", trainer));
  // A retry of an applied push (maybe of a trainer that left since) is of the step before
  // the open one: a trainer pushes a step only after the step before it completed.
  if (mode_ == Consistency::kSync && clock < applied_) {
    if (clock + 1 == applied_) return absl::OkStatus();
    return Passed(clock, trainer, applied_);
  }
  auto it = trainers_.find(static_cast<int>(trainer));
  if (it == trainers_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("no trainer ", trainer, " (the table's trainers: ", Names(),
                                                   "; a trainer that joins later calls Client::Join first)"));
  }
  if (mode_ == Consistency::kSync) return AddToStep(clock, static_cast<int>(trainer), ops);
  Trainer& t = it->second;
  // A trainer's first push after a restore is where it is now (a resumed job, or a server
  // restarted alone): applied, whatever the restored clock.
  if (unheard_.erase(static_cast<int>(trainer)) > 0) t.next = clock;
  if (clock + 1 == t.next) return absl::OkStatus();  // a retried push already applied
  if (clock < t.next) return Passed(clock, trainer, t.next);
  if (clock > t.until) {
    return absl::FailedPreconditionError(absl::StrCat("trainer ", trainer, " left after clock ", t.until));
  }
  ops.apply_now();
  t.next = clock + 1;
  return absl::OkStatus();
}

absl::Status ConsistencyClock::AddToStep(int64_t clock, int trainer, const Ops& ops) {
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
  if (!TakesPart(trainer, clock)) {
    const Trainer& t = trainers_.at(trainer);
    return absl::FailedPreconditionError(
        clock < t.from ? absl::StrCat("trainer ", trainer, " takes part from step ", t.from, ", not ", clock)
                       : absl::StrCat("trainer ", trainer, " left after step ", t.until));
  }
  if (pushed_.contains(trainer)) return absl::OkStatus();  // a retried push of this step
  ops.accumulate();  // may throw: the trainer is counted only once its push is
  pushed_.insert(trainer);
  CompleteStep(ops);
  return absl::OkStatus();
}

void ConsistencyClock::CompleteStep(const Ops& ops) {
  if (pushed_.empty() || static_cast<int>(pushed_.size()) < taking_part()) return;
  ops.apply_step();
  ++applied_;
  pushed_.clear();
  restored_ = false;
  // Trainers that left before the new step are done with.
  std::erase_if(trainers_, [&](const auto& e) { return e.second.until < applied_; });
}

int64_t ConsistencyClock::JoinHint() const {
  switch (mode_) {
    case Consistency::kAsync: return 0;
    case Consistency::kSync: return applied_;
    case Consistency::kBoundedStaleness: {
      int64_t furthest = 0;
      for (const auto& [_, t] : trainers_) furthest = std::max(furthest, t.next);
      return furthest;
    }
  }
  return 0;
}

int64_t ConsistencyClock::Join(int trainer, int64_t from, const Ops& ops) {
  if (mode_ == Consistency::kAsync) return from;
  auto it = trainers_.find(trainer);
  if (mode_ == Consistency::kSync) {
    if (pushed_.contains(trainer)) return it->second.from;  // it takes part already
    if (from < applied_) return applied_;                   // that step started: ask again
    trainers_[trainer] = Trainer{from, kForever, from};
    CompleteStep(ops);  // it may have moved out of the open step
    return from;
  }
  if (it != trainers_.end() && it->second.until == kForever && it->second.next > from) return it->second.next;
  trainers_[trainer] = Trainer{from, kForever, from};
  return from;
}

void ConsistencyClock::Leave(int trainer, int64_t last, const Ops& ops) {
  auto it = trainers_.find(trainer);
  if (it == trainers_.end() || mode_ == Consistency::kAsync) return;
  Trainer& t = it->second;
  t.until = std::max(last, t.from - 1);
  if (mode_ == Consistency::kBoundedStaleness) {
    trainers_.erase(it);
    return;
  }
  if (pushed_.contains(trainer)) t.until = std::max(t.until, applied_);  // its push of the open step counts
  if (t.until < applied_) trainers_.erase(it);
  CompleteStep(ops);
}

bool ConsistencyClock::Readable(int64_t clock) const {
  switch (mode_) {
    case Consistency::kAsync: return true;
    case Consistency::kSync: return applied_ >= clock;
    case Consistency::kBoundedStaleness:
      return std::all_of(trainers_.begin(), trainers_.end(),
                         [&](const auto& e) { return e.second.next >= clock - staleness_; });
  }
  return false;
}

std::vector<int> ConsistencyClock::Lagging(int64_t clock) const {
  std::vector<int> out;
  for (const auto& [id, t] : trainers_) {
    const bool behind = mode_ == Consistency::kBoundedStaleness ? t.next < clock - staleness_
                        : mode_ == Consistency::kSync ? applied_ < clock && TakesPart(id, applied_) && !pushed_.contains(id)
                                                      : false;
    if (behind) out.push_back(id);
  }
  return out;
}

void ConsistencyClock::Restore(int64_t applied, std::map<int, Trainer> trainers, std::set<int> pushed) {
  applied_ = applied;
  trainers_ = std::move(trainers);
  pushed_ = std::move(pushed);
  restored_ = true;
  unheard_.clear();
  if (mode_ == Consistency::kBoundedStaleness) {
    for (const auto& [t, _] : trainers_) unheard_.insert(t);
  }
}

}  // namespace gw::param_server::internal
