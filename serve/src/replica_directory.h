// Internal: which workers serve which model, as one worker knows it (serving.h).
//
// Each worker's announcements are ordered by (incarnation, version): a state older than
// the one held is ignored, so a late answer to a query never undoes a newer
// announcement, and a worker declared dead stays out until a newer incarnation (its
// restarted process) announces. Thread-safe; Replicas() is a snapshot shared with the
// routers (no copy per request).
#ifndef GRADWIRE_SERVE_SRC_REPLICA_DIRECTORY_H_
#define GRADWIRE_SERVE_SRC_REPLICA_DIRECTORY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "messages.h"

namespace gw::serve::internal {

class ReplicaDirectory {
 public:
  using ReplicaList = std::shared_ptr<const std::vector<std::string>>;

  // Applies `worker`'s state if it is newer than what is held; returns whether it was.
  bool Apply(const std::string& worker, const ReplicaState& state) {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker);
    if (it != workers_.end()) {
      const Entry& held = it->second;
      const bool newer = state.incarnation > held.state.incarnation ||
                         (state.incarnation == held.state.incarnation && state.version > held.state.version);
      if (!newer) return false;
    }
    workers_[worker] = Entry{state};
    Rebuild();
    return true;
  }

  // The worker is dead: it serves nothing until a newer incarnation announces.
  void MarkDead(const std::string& worker) {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker);
    if (it == workers_.end() || it->second.state.models.empty()) return;
    it->second.state.models.clear();
    it->second.state.version = INT64_MAX;  // nothing of this incarnation is newer
    Rebuild();
  }

  ReplicaList Replicas(const std::string& model) const {
    absl::MutexLock lock(&mu_);
    auto it = by_model_.find(model);
    return it == by_model_.end() ? std::make_shared<const std::vector<std::string>>() : it->second;
  }

 private:
  struct Entry {
    ReplicaState state;
  };
  void Rebuild() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::map<std::string, std::vector<std::string>> lists;
    for (const auto& [worker, entry] : workers_) {
      for (const std::string& m : entry.state.models) lists[m].push_back(worker);
    }
    by_model_.clear();
    for (auto& [model, list] : lists) by_model_[model] = std::make_shared<const std::vector<std::string>>(std::move(list));
  }

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ReplicaList> by_model_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::serve::internal

#endif  // GRADWIRE_SERVE_SRC_REPLICA_DIRECTORY_H_
