// Internal: Members, an agent's table of the workers of its group, by rank and by name:
// the group formed at Start, the workers that joined it since (AgentOptions::join), and
// which of them left (Agent::Leave).
//
// Contract
//   - Ranks lie in [0, capacity): capacity is AgentOptions::max_world_size (the ranks a
//     running group can grow to), world_size the size of the group Start formed.
//   - SetKnown(workers) records the group this worker found at Start (for a worker that
//     joined later: every member it found in the store); known() says it did.
//   - Admit(w) records a worker that introduced itself in its hello: it must lie in
//     [0, capacity) and its name must be its own (one name, one rank; a member that left
//     keeps its name: it may still answer the calls it took).
//     A rank already known must come with the name it has; a new one is recorded from
//     the hello (a peer of Start's group may dial before this worker read the records;
//     it announced the same record), and one above Start's group is a worker that
//     joined (`joined` is set).
//   - MarkLeft(rank) records that a member left; true the first time. A rank that left
//     stays so: its name resolves, but state() says kLeft.
//   - A rank's record is written once and read without a lock (Name, Get: the
//     dispatcher names the caller of every request); RankOf(name) takes a reader lock.
//   - Present() lists the members that have not left, by rank.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_SRC_CLUSTER_MEMBERS_H_
#define GRADWIRE_RPC_SRC_CLUSTER_MEMBERS_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/worker.h"

namespace gw::rpc::internal {

class Members {
 public:
  enum class State { kAbsent, kPresent, kLeft };

  Members(int world_size, int capacity);

  int world_size() const { return world_size_; }
  int capacity() const { return capacity_; }
  bool known() const { return known_.load(std::memory_order_acquire); }

  void SetKnown(const std::vector<WorkerInfo>& workers);
  absl::Status Admit(const WorkerInfo& w, bool* joined);
  bool MarkLeft(int rank);

  State state(int rank) const;
  std::optional<WorkerInfo> Get(int rank) const;
  // "worker1", or "rank 7" for a rank with no record.
  std::string Name(int rank) const;
  int RankOf(const std::string& name) const;  // -1: no such member
  std::vector<WorkerInfo> Present() const;
  std::string PresentNames() const;  // "worker0, worker1, ..."

 private:
  struct Slot {
    std::atomic<State> state{State::kAbsent};
    WorkerInfo info;  // written once, before state leaves kAbsent
  };
  // Writes rank's record unless it has one. REQUIRES: mu_ held.
  void Record(const WorkerInfo& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int world_size_;
  const int capacity_;
  std::atomic<bool> known_{false};
  std::unique_ptr<Slot[]> slots_;
  mutable absl::Mutex mu_;  // writers of slots_, and by_name_
  absl::flat_hash_map<std::string, int> by_name_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CLUSTER_MEMBERS_H_
