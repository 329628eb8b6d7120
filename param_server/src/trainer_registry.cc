#include "trainer_registry.h"

#include "absl/strings/str_cat.h"

namespace gw::param_server::internal {

void TrainerRegistry::Pushed(int64_t trainer, int rank, const std::string& worker) {
  absl::MutexLock lock(&mu_);
  Trainer& t = trainers_[trainer];
  if (t.rank == rank && !t.dead) return;  // the common case: nothing changes
  t = Trainer{rank, worker, false};
}

bool TrainerRegistry::WorkerGone(int rank) {
  absl::MutexLock lock(&mu_);
  bool any = false;
  for (auto& [index, t] : trainers_) {
    if (t.rank == rank && !t.dead) {
      t.dead = true;
      any = true;
    }
  }
  return any;
}

std::string TrainerRegistry::DeadAmong(const std::vector<int>& trainers) const {
  absl::MutexLock lock(&mu_);
  for (int index : trainers) {
    auto it = trainers_.find(index);
    if (it != trainers_.end() && it->second.dead) return absl::StrCat("trainer ", index, " (", it->second.worker, ")");
  }
  return "";
}

int TrainerRegistry::RankOf(int64_t trainer) const {
  absl::MutexLock lock(&mu_);
  auto it = trainers_.find(trainer);
  return it == trainers_.end() ? -1 : it->second.rank;
}

}  // namespace gw::param_server::internal
