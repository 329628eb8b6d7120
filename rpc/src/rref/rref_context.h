// Internal: RRefContext, one per agent: the owner table, the user forks, and the
// reference-counting protocol described in rpc/include/gradwire/rpc/rref.h.
//
// Threading: every method may be called from any thread (user threads, transport I/O
// threads, the worker pool). mu_ guards all state; no call into the Agent, no
// completion and no RRefState destructor runs while mu_ is held.
#ifndef GRADWIRE_RPC_SRC_RREF_RREF_CONTEXT_H_
#define GRADWIRE_RPC_SRC_RREF_RREF_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/rpc/worker.h"
#include "rref/rref_messages.h"

namespace gw::rpc {
class Agent;  // agent.h: rref_context.cc registers and sends the protocol's messages through it
}  // namespace gw::rpc

namespace gw::rpc::internal {

class RRefContext : public std::enable_shared_from_this<RRefContext> {
 public:
  // What the context needs from its agent.
  struct Hooks {
    Agent* agent = nullptr;            // not used once the context is closed
    GlobalIdGenerator* ids = nullptr;  // the agent's: RRef and fork ids
    int self_rank = 0;
    int world_size = 1;  // ranks lie below it (the group's capacity: workers may join)
    // Why a worker declared gone is (left, or declared dead); default DeclaredDeadError.
    std::function<absl::Status(int rank)> gone_error;
    absl::Duration default_timeout = absl::Seconds(60);
    // Runs the registered function `function` here (on the pool unless it is inline).
    std::function<Future<Value>(const std::string& caller, const std::string& function, ValueList args)> invoke;
    // The same, on this thread whatever the function's mode (the caller is a pool thread).
    std::function<Future<Value>(const std::string& caller, const std::string& function, ValueList args)> invoke_here;
    // Runs work on the pool (batched with the current read's work when called from an
    // inline handler).
    std::function<void(std::function<void()>)> defer;
    std::function<bool(const std::string& function)> has_function;
    // The NOT_FOUND for a function that is not registered here (Dispatcher::MissingFunctionError).
    std::function<absl::Status(const std::string& function)> missing_function;
    // RRefs one peer may have this worker own for it (PeerLimits::max_rrefs; 0: no limit).
    int64_t max_rrefs_per_peer = 0;
  };

  explicit RRefContext(Hooks hooks);
  // Worker names by rank, once the group is known (until then names read "rank N").
  void SetWorkerNames(std::vector<std::string> names);
  // Serves the protocol's messages (rref_messages.h) on the agent.
  absl::Status RegisterFunctions();

  RRefPtr Remote(int owner, const std::string& function, ValueList args, CallOptions options, std::string type,
                 GlobalId self_rref = {});
  RRefPtr Own(Value value, std::string type);

  // Outgoing payloads: every attached RRef becomes a new child fork for `dest`. On
  // error nothing was forked. Incoming payloads: forks become attached references.
  absl::Status PrepareOutgoing(Value* payload, int dest);
  absl::Status AdoptIncoming(Value* payload, int from);
  // A prepared payload that will not be sent: its new forks are withdrawn.
  void AbandonOutgoing(Value* payload);

  // A worker's connections closed: it is dead to us.
  void OnPeerGone(int rank);
  // True when no control message (nor a REMOTE awaiting its acknowledgement) is in
  // flight or queued.
  bool Idle() const;
  bool AwaitIdle(absl::Time deadline) const;
  // Owned values still referenced by other workers, one line each.
  std::vector<std::string> Leaks() const;
  RRefStats Stats() const;
  // Waits until until(Stats()) holds, re-checked whenever the tables change.
  bool AwaitStats(const std::function<bool(const RRefStats&)>& until, absl::Time deadline) const;
  // The agent is closing: fail everything, break reference cycles.
  void Close();

  // For RRefState.
  std::string WorkerName(int rank) const;
  // How long a wait on a result may last: `timeout`, else the agent's default (+1 s for
  // the call's own deadline to fire first).
  absl::Duration WaitBudget(absl::Duration timeout) const;
  bool Confirmed(const RRefDescriptor& d, bool is_owner) const;
  Future<Value> Fetch(const RRefDescriptor& d, bool is_owner, CallOptions options);
  absl::StatusOr<Value> LocalValue(const RRefDescriptor& d);
  Future<Value> Call(const RRefDescriptor& d, bool is_owner, const std::string& method, ValueList args,
                     CallOptions options);
  void Release(const RRefDescriptor& d, bool is_owner);

 private:
  struct Owned {
    explicit Owned(Executor& ex) : promise(ex), value(promise.future()) {}
    Promise<Value> promise;  // completed when the creating function finishes
    Future<Value> value;
    absl::flat_hash_map<GlobalId, int> forks;  // fork id -> rank holding it
    int64_t local = 0;                         // this worker's handles
    bool created = false;                      // REMOTE (or Own) arrived
    std::string type;
  };
  enum class ForkState { kPending, kConfirmed, kFailed };
  struct UserFork {
    GlobalId rref_id;
    int owner = -1;
    ForkState state = ForkState::kPending;
    absl::Status error;
    bool released = false;
    absl::flat_hash_map<GlobalId, int> children;  // unconfirmed child forks -> rank sent to
    int accept_to = -1;                           // parent to tell once settled
    GlobalId accept_parent_fork;
    // Requests through a fork received from another user wait until the owner has
    // registered it (its FORK is acknowledged): they could otherwise overtake the FORK and
    // the creator's REMOTE and reach an owner that does not know the RRef yet.
    std::vector<std::function<void()>> after_registration;
    bool maybe_registered = false;  // failed by a timeout: the owner may know it
  };
  struct DeleteQueue {
    std::vector<ForkOf> queued;
    bool in_flight = false;
  };
  // Work found under mu_ and done after it is released.
  struct Outbox {
    std::vector<std::function<void()>> actions;
    std::vector<Owned> garbage;  // freed values: destroying them may release RRefs
  };

  bool closed() const;
  RRefStats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool ContainsRRef(const Value& v);
  void StartCreation(Promise<Value> promise, const std::string& caller, const std::string& function, ValueList args,
                     std::optional<Future<Value>> self_value);
  void Unfork(const RRefDescriptor& child, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UsableFork(const RRefDescriptor& d);
  // A FETCH or CALL through the user fork `d`: fails with the fork's error, or is sent
  // now, or once the owner has registered the fork (UserFork::after_registration).
  template <typename M>
  Future<Value> SendThroughFork(const RRefDescriptor& d, M message, CallOptions options);
  std::function<void(absl::StatusOr<Value>)> Completion(const RRefDescriptor& d, Promise<Value> promise);
  Owned& OwnedEntry(GlobalId rref_id, const std::string& type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeFree(GlobalId rref_id, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeDelete(GlobalId fork_id, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Settles a PENDING fork; `in_flight` is the control message that carried it.
  void Confirm(GlobalId fork_id, absl::Status status, bool in_flight);
  Executor& Exec();  // the agent's pool, or closed_executor_ once closed
  void QueueDelete(int owner, GlobalId rref_id, GlobalId fork_id, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendDeletes(int owner);
  // Sends control message M (RRefFork, RRefAccept, RRefDelete) from the pool, retried by
  // the agent's retry policy while the peer is UNAVAILABLE and not known to be gone.
  template <typename M>
  void SendControl(int to, M message, std::function<void(absl::Status)> done);
  // Queues an RRefAccept to `parent` (counted in flight until it is answered).
  void QueueAccept(int parent, GlobalId parent_fork, GlobalId fork, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a failed creation and fails an entry that forks created first.
  void FailUnfilled(GlobalId rref_id, const absl::Status& s);
  bool KnownOrForeign(GlobalId rref_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE: `rank` was declared dead (OnPeerGone) and stays so for RRefs.
  absl::Status GoneError(int rank) const;
  // Fails a placeholder entry whose creator was declared gone (its value never comes).
  void FailIfCreatorGone(GlobalId rref_id, Owned& e, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Outbox& out);
  Future<Value> Failed(absl::Status s);
  absl::Status ShutDown() const;
  Future<Value> ValueOf(GlobalId rref_id);
  absl::Status Walk(Value* v, const std::function<absl::Status(RRefPtr&)>& fn);

  // Handlers of the protocol's messages.
  absl::Status OnRemote(const CallInfo& info, RRefRemote m);
  Future<Value> OnFetch(const RRefFetch& m);
  Future<Value> OnCall(const CallInfo& info, RRefCall m);
  absl::Status OnFork(const CallInfo& info, const RRefFork& m);
  absl::Status OnAccept(const RRefAccept& m);
  absl::Status OnDelete(const RRefDelete& m);

  const Hooks hooks_;
  // Completes futures after the agent closed (callbacks then run inline).
  class ClosedExecutor final : public Executor {
   public:
    bool Post(std::function<void()>) override { return false; }
  } closed_executor_;

  mutable absl::Mutex mu_;
  std::atomic<bool> closed_{false};
  std::shared_ptr<const std::vector<std::string>> names_;  // atomic access
  absl::flat_hash_map<GlobalId, Owned> owned_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, int64_t> owned_for_peer_ ABSL_GUARDED_BY(mu_);  // owned_ by the ids' creator rank
  absl::flat_hash_map<GlobalId, UserFork> users_ ABSL_GUARDED_BY(mu_);     // by fork id
  absl::flat_hash_map<int, DeleteQueue> deletes_ ABSL_GUARDED_BY(mu_);     // by owner rank
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // REMOTEs that failed here (bounded, oldest dropped): a fork of one that arrives later
  // gets the creation's error instead of waiting for a value that never comes.
  absl::flat_hash_map<GlobalId, absl::Status> failed_creations_ ABSL_GUARDED_BY(mu_);
  std::deque<GlobalId> failed_order_ ABSL_GUARDED_BY(mu_);
  // Workers declared dead (OnPeerGone): control messages to them are not retried.
  absl::flat_hash_set<int> gone_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_RREF_RREF_CONTEXT_H_
