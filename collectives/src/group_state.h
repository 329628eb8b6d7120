// Internal: the state of one process group on one worker (process_group.h) and the
// running collective's view of it (Op), which the algorithms (algorithms.h) use.
//
// Collectives of the group run one at a time on the group's own thread, in issue order.
// Data for them arrives on transport threads (Deliver) into an inbox keyed by
// (collective number, step, sender); the answer to a piece (its Ack) is held until the
// group's thread has taken the piece: a sender that waits for its answers (Op::Finish)
// knows its memory is free again, and pieces not yet taken hold back the sender's next
// collectives beyond kMaxUnanswered (flow control). A failed collective's pieces are
// answered with its error, so their senders fail it too.
#ifndef GRADWIRE_COLLECTIVES_SRC_GROUP_STATE_H_
#define GRADWIRE_COLLECTIVES_SRC_GROUP_STATE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/collectives/process_group.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/waits.h"
#include "messages.h"

namespace gw::collectives {

// Pieces a group holds before its thread takes them (a bound against a member that floods).
inline constexpr size_t kMaxInbox = size_t{1} << 16;
// Pieces sent and not yet taken beyond which the next collective waits before it starts.
inline constexpr int kMaxUnanswered = 1024;
// Failed collectives whose error late pieces are answered with.
inline constexpr size_t kRecentFailures = 16;

class GroupState;

// The collective that runs now, as its algorithm sees it. Group ranks throughout.
class Op {
 public:
  Op(GroupState& group, int64_t seq, const internal::Signature& signature, absl::Time deadline)
      : group_(group), seq_(seq), signature_(signature), deadline_(deadline) {}
  const internal::Signature& signature() const { return signature_; }
  int rank() const;
  int size() const;
  const GroupOptions& options() const;
  // Sends `data` (a contiguous tensor or view) as piece `step` to member `to`. The bytes
  // may be read until Finish() returns: do not write them before (unless the receiver has
  // answered causally, e.g. its data depends on them).
  void Send(int to, int64_t step, Tensor data);
  // Waits for piece `step` from member `from`, which must hold `numel` elements (any
  // number when numel < 0) of the collective's dtype; fails with the collective's error (a peer's abort, a dead member,
  // the deadline, a malformed piece).
  absl::StatusOr<Tensor> Recv(int from, int64_t step, int64_t numel);
  // Waits until every piece sent was taken by its receiver (or an error).
  absl::Status Finish();

 private:
  GroupState& group_;
  const int64_t seq_;
  const internal::Signature& signature_;
  const absl::Time deadline_;
};

class GroupState : public std::enable_shared_from_this<GroupState> {
 public:
  struct Config {
    rpc::Agent* agent = nullptr;
    int64_t id = 0;
    std::vector<int> ranks;  // agent ranks, sorted
    int rank = 0;            // this worker's group rank
    GroupOptions options;
    absl::Duration timeout;
    std::shared_ptr<void> owner;  // kept alive with the group (the layer that routes to it)
  };
  // A collective as issued: its signature, an error found before it ran (it then fails
  // on every member), the algorithm, and how to hand its outcome to the caller.
  struct Job {
    internal::Signature signature;
    absl::Status invalid;
    std::function<absl::Status(Op&)> run;  // calls Op::Finish() when it sent the caller's memory
    std::function<void(absl::Status)> complete;
  };

  explicit GroupState(Config config);
  ~GroupState();  // Close()
  void Start();

  int rank() const { return config_.rank; }
  int size() const { return static_cast<int>(config_.ranks.size()); }
  const std::vector<int>& ranks() const { return config_.ranks; }
  const std::string& name() const { return config_.options.name; }
  const GroupOptions& options() const { return config_.options; }
  int64_t id() const { return config_.id; }
  rpc::Executor& executor() { return config_.agent->executor(); }
  // The group rank of an agent rank, or -1.
  int GroupRankOf(int agent_rank) const;

  void Enqueue(Job job);
  void Close();

  // From transport threads.
  Future<rpc::Ack> Deliver(int from_agent_rank, internal::CollectiveChunk chunk);
  void Abort(int from_agent_rank, const internal::CollectiveAbort& abort);
  void OnPeerGone(int agent_rank);

 private:
  friend class Op;
  using Key = std::tuple<int64_t, int64_t, int>;  // seq, step, sender
  struct Arrival {
    internal::Signature signature;
    Tensor data;
    Promise<rpc::Ack> taken;
  };
  struct Queued {
    int64_t seq;
    Job job;
  };

  void Run();
  void BeginLocked(const Queued& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a collective on the group's thread and completes it.
  void Execute(Queued& q);
  // Wakes whoever waits for the group's state to change.
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until Wake is called or the deadline passes.
  void WaitLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls (without the lock) for up to GroupOptions::spin for a change; returns whether
  // one came, with the lock held again.
  bool SpinLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "allreduce #3 of group 'g'"
  std::string Describe(const internal::Signature& s, int64_t seq) const;
  std::string Member(int group_rank) const;  // "rank 1 (worker1)"
  std::string DescribeIssue(const internal::Signature& s) const;  // "allreduce(sum) of float32 [2, 3]"
  // Fails collective `seq` (the running one or a later one) unless it already failed.
  void FailLocked(int64_t seq, absl::Status status, bool from_peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckSignatureLocked(int sender, const internal::Signature& theirs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Breaks the group for good from collective `since` on (0: every collective, e.g. a
  // member died; a member that closed its group after collective k breaks it from k + 1).
  // Keeps an earlier break; returns whether this one took effect.
  bool BreakLocked(absl::Status status, bool from_peer, int64_t since) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BrokenAtLocked(int64_t seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Failure {
    absl::Status status;
    bool from_peer;  // a member told us (then we do not tell the others again)
  };
  // The error that ends collective `seq` now, if any.
  std::optional<Failure> ErrorLocked(int64_t seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Label() const;  // "group 'g'" or "group [0, 1, 2]"
  // Issued, completed, failed, queued, and the running one's number and age.
  void AppendStatistics(std::vector<rpc::Sample>& out) const;
  // What the group waits for (waits.h): the running collective, the member whose piece it
  // waits for and the members heard from; and the last collective completed.
  void AppendWaits(std::vector<rpc::Wait>& out) const;
  // Drops what is left of collectives up to `seq`; the held answers go out.
  void RetireLocked(int64_t seq, std::vector<Promise<rpc::Ack>>* answers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BroadcastAbort(int64_t seq, const absl::Status& status, bool broken);

  const Config config_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;     // number of the next collective issued
  int64_t running_ ABSL_GUARDED_BY(mu_) = -1;     // the collective on the thread now
  int64_t retired_ ABSL_GUARDED_BY(mu_) = -1;     // every collective up to here is done
  internal::Signature running_signature_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, Arrival> inbox_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, Failure> failed_ ABSL_GUARDED_BY(mu_);  // by seq
  std::map<int64_t, absl::Status> recently_failed_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> broken_ ABSL_GUARDED_BY(mu_);
  bool broken_from_peer_ ABSL_GUARDED_BY(mu_) = false;
  int64_t broken_since_ ABSL_GUARDED_BY(mu_) = 0;  // the first collective the break fails
  // By group rank: every collective below this completed on that member (it said so when
  // it broke the group, e.g. by closing it).
  std::vector<int64_t> completed_below_ ABSL_GUARDED_BY(mu_);
  bool broken_told_ ABSL_GUARDED_BY(mu_) = false;  // the others were told the group broke
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int unanswered_ ABSL_GUARDED_BY(mu_) = 0;  // pieces sent and not yet taken
  std::atomic<uint64_t> events_{0};           // bumped by Wake (for SpinLocked)
  absl::Time running_since_ ABSL_GUARDED_BY(mu_);
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;  // collectives that failed here
  // For the waits: the member (group rank) the running collective waits for a piece from
  // (-1: none), the members heard from in it, and the last one completed.
  int waiting_for_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<bool> heard_ ABSL_GUARDED_BY(mu_);
  internal::Signature last_signature_ ABSL_GUARDED_BY(mu_);
  absl::Time last_done_at_ ABSL_GUARDED_BY(mu_);
  // The group in the agent's statistics (a metrics endpoint's gradwire_collectives_*)
  // and waits: the last members, dropped first.
  rpc::Statistics::Source statistics_;
  rpc::Waits::Source waits_;
};

}  // namespace gw::collectives

#endif  // GRADWIRE_COLLECTIVES_SRC_GROUP_STATE_H_
