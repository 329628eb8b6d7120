// Internal: CallTable, the calls this agent made that await a reply.
//
// Contract
//   - Add registers a call to worker `rank` with its deadline; it returns the call's id
//     (never 0). Exactly one of these completes it, once:
//       Complete(id, result)  the reply arrived (or sending failed);
//       the deadline          DEADLINE_EXCEEDED "call to <peer>.<function> timed out after <timeout>";
//       FailPeer(rank, why)   the connection to the peer closed: UNAVAILABLE "call to
//                             <peer>.<function> failed: <why>" (FAILED_PRECONDITION when
//                             `why` is, e.g. the peer refused our protocol version);
//       Close(why)            the agent is closing: `why` as it is. Calls added after
//                             Close fail at once with `why` (Add returns 0).
//     Later attempts return false and do nothing: a reply after a timeout is dropped.
//   - REQUIRES: the TimerQueue outlives the table, or at least its Close.
//   - `done` runs on the thread that completes the call (transport I/O thread, timer
//     thread, or the caller), never under the table's lock; it must be quick.
//   - AwaitEmpty(deadline) waits until no call is pending. Thread-safe.
//   - Metrics: a call added with a series (CallMetrics) is recorded in it when it
//     completes, whichever way: its latency from Add, whether it failed, and the reply's
//     bytes given to Complete.
//   - Tracing (trace.h, when the tracer is enabled): a call's completion (the `done` it
//     runs) is a slice on the completing thread, which the reply's flow arrow
//     (Tracer::ReplyFlow) ends at, with the call's time from Add as its argument call_us.
//   - AppendWaits(out): the 16 oldest pending calls, as "waits" records (waits.h) on
//     their peers.
//   - Deadlines: the table keeps them in its own min-heap and arms one TimerQueue timer, at
//     the earliest; a call's entry is dropped lazily once the call completes (the heap is
//     compacted when it holds twice as many entries as pending calls). Adding and completing
//     a call thus take only the table's lock and allocate nothing for the deadline. Close
//     disarms the timer.
#ifndef GRADWIRE_RPC_SRC_CALLS_CALL_TABLE_H_
#define GRADWIRE_RPC_SRC_CALLS_CALL_TABLE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/rpc/timer_queue.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/waits.h"
#include "observe/call_metrics.h"

namespace gw::rpc::internal {

// A traced call's start, which the caller's send span shares: when it began, its
// function's interned name, the trace context it was made in.
struct TracedCallStart {
  int64_t begin_us = 0;  // 0: not taken (CallTable::Add takes it when its tracer is enabled)
  Tracer::Name name = 0;
  uint64_t context = 0;
};

class CallTable {
 public:
  using Done = std::function<void(absl::StatusOr<Value>)>;
  // describe(rank) names a peer in errors ("worker1 (rank 1)").
  // `tracer` (optional) and `self_rank` name this agent's spans and flows.
  CallTable(TimerQueue& timers, std::function<std::string(int rank)> describe, Tracer* tracer = nullptr,
            int self_rank = -1);
  ~CallTable();

  using TracedStart = TracedCallStart;
  // *in_flight (optional): how many calls were pending before this one.
  uint64_t Add(int rank, std::string function, absl::Duration timeout, Done done, size_t* in_flight = nullptr,
               CallMetrics::Series* series = nullptr, TracedStart traced = {});
  // `received_bytes`: the size of the reply's frame (0 when none arrived).
  bool Complete(uint64_t id, absl::StatusOr<Value> result, uint64_t received_bytes = 0);
  // The peer and function of a pending call.
  struct Call {
    int rank = -1;
    std::string function;
  };
  std::optional<Call> Find(uint64_t id) const;
  void FailPeer(int rank, const absl::Status& why);
  void Close(const absl::Status& why);
  size_t size() const;
  bool AwaitEmpty(absl::Time deadline) const;
  void AppendWaits(std::vector<Wait>& out) const;

 private:
  struct Pending {
    Done done;
    int rank;
    std::string function;
    absl::Duration timeout;
    CallMetrics::Series* series = nullptr;
    std::chrono::steady_clock::time_point start = {};
    uint64_t id = 0;
    TracedStart traced;  // begin_us 0: not traced
    // Records the call's end in its series (if any) and its spans, then runs `done`.
    void Finish(CallTable& table, absl::StatusOr<Value> result, uint64_t received_bytes = 0);
  };
  struct Deadline {
    absl::Time when;
    uint64_t id;
    bool operator>(const Deadline& o) const { return when > o.when; }
  };
  // Runs the due deadlines (the timer armed for `armed_for` fired).
  void OnTimer(absl::Time armed_for);
  // Arms the timer for the heap's earliest deadline unless it is armed for that one already
  // (the TimerQueue runs callbacks without its lock, so arming under mu_ cannot deadlock).
  void ArmEarliest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called when pending_ lost entries: drops or compacts the heap's stale entries.
  void Forget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TimerQueue& timers_;
  const std::function<std::string(int)> describe_;
  Tracer* const tracer_;
  const int self_rank_;
  Tracer::Name reply_category_ = 0, peer_arg_ = 0, latency_arg_ = 0;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Deadline> deadlines_ ABSL_GUARDED_BY(mu_);  // min-heap; may name completed calls
  TimerQueue::Handle armed_ ABSL_GUARDED_BY(mu_);         // at armed_.when; empty: none
  absl::Status closed_ ABSL_GUARDED_BY(mu_);              // OK while open
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CALLS_CALL_TABLE_H_
