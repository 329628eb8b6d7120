#include "cluster/members.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gw::rpc::internal {

Members::Members(int world_size, int capacity)
    : world_size_(world_size),
      capacity_(std::max(capacity, world_size)),
      slots_(new Slot[static_cast<size_t>(capacity_)]) {}

void Members::Record(const WorkerInfo& w) {
  Slot& slot = slots_[static_cast<size_t>(w.rank)];
  if (slot.state.load(std::memory_order_acquire) != State::kAbsent) return;
  slot.info = w;
  by_name_[w.name] = w.rank;
  slot.state.store(State::kPresent, std::memory_order_release);
}

void Members::SetKnown(const std::vector<WorkerInfo>& workers) {
  {
    absl::MutexLock lock(&mu_);
    for (const WorkerInfo& w : workers) {
      if (w.rank >= 0 && w.rank < capacity_) Record(w);
    }
  }
  known_.store(true, std::memory_order_release);
}

absl::Status Members::Admit(const WorkerInfo& w, bool* joined) {
  *joined = false;
  if (w.rank < 0 || w.rank >= capacity_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its hello names '", w.name, "' as rank ", w.rank, ", which is not a rank of this group (", world_size_,
        " workers", capacity_ > world_size_ ? absl::StrCat(", at most ", capacity_, " with those that join") : "",
        "; AgentOptions::max_world_size, GRADWIRE_MAX_WORLD_SIZE), or was it started for another job?"));
  }
  absl::MutexLock lock(&mu_);
  const Slot& slot = slots_[static_cast<size_t>(w.rank)];
  switch (slot.state.load(std::memory_order_acquire)) {
    case State::kLeft:  // it still answers what it took before it left
    case State::kPresent:
      if (slot.info.name == w.name) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat("its hello names '", w.name, "' as rank ", w.rank,
                                                        ", which is ", slot.info.name,
                                                        " (was it started for another job?)"));
    case State::kAbsent:
      break;
  }
  if (auto it = by_name_.find(w.name); it != by_name_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("it introduces itself as '", w.name, "' (rank ", w.rank,
                                                      "), a name rank ", it->second, " has; names must be unique"));
  }
  Record(w);
  // A rank of Start's group may say hello before this worker read the records: its hello
  // is its record (it announced the same one).
  *joined = w.rank >= world_size_;
  return absl::OkStatus();
}

bool Members::MarkLeft(int rank) {
  if (rank < 0 || rank >= capacity_) return false;
  absl::MutexLock lock(&mu_);
  Slot& slot = slots_[static_cast<size_t>(rank)];
  if (slot.state.load(std::memory_order_acquire) != State::kPresent) return false;
  slot.state.store(State::kLeft, std::memory_order_release);
  return true;
}

Members::State Members::state(int rank) const {
  if (rank < 0 || rank >= capacity_) return State::kAbsent;
  return slots_[static_cast<size_t>(rank)].state.load(std::memory_order_acquire);
}

std::optional<WorkerInfo> Members::Get(int rank) const {
  if (state(rank) == State::kAbsent) return std::nullopt;
  return slots_[static_cast<size_t>(rank)].info;
}

std::string Members::Name(int rank) const {
  if (state(rank) == State::kAbsent) return absl::StrCat("rank ", rank);
  return slots_[static_cast<size_t>(rank)].info.name;
}

int Members::RankOf(const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

std::vector<WorkerInfo> Members::Present() const {
  std::vector<WorkerInfo> out;
  for (int r = 0; r < capacity_; ++r) {
    if (state(r) == State::kPresent) out.push_back(slots_[static_cast<size_t>(r)].info);
  }
  return out;
}

std::string Members::PresentNames() const {
  std::vector<std::string> names;
  for (const WorkerInfo& w : Present()) names.push_back(w.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace gw::rpc::internal
