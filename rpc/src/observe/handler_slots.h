// Internal: HandlerSlots, what each thread that runs handlers runs now: the waits' "runs"
// records (rpc/waits.h), kept for `gradwire debug` and the stall report.
//
// Contract
//   - A Running(slots, function, caller), made on the thread about to run a handler,
//     records the run until it is destroyed. A thread running a handler inside another
//     (an inline call) keeps its outermost one.
//   - Each thread has its own slot (observe/per_thread.h): entering an outermost handler
//     takes that slot's lock (uncontended but for a concurrent AppendWaits); a nested one
//     and leaving only change the thread's own depth. What that costs per request is
//     measured by bench_call_metrics (BENCHMARKS.md, "Metrics").
//   - AppendWaits(out, name_of) adds a "runs" record for each thread in a handler: the
//     function, its caller (name_of(rank); a negative rank is "itself"), since when, and
//     the thread's name. Thread-safe.
#ifndef GRADWIRE_RPC_SRC_OBSERVE_HANDLER_SLOTS_H_
#define GRADWIRE_RPC_SRC_OBSERVE_HANDLER_SLOTS_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/waits.h"

namespace gw::rpc::internal {

class HandlerSlots {
  struct Slot;

 public:
  HandlerSlots();
  ~HandlerSlots();
  HandlerSlots(const HandlerSlots&) = delete;
  HandlerSlots& operator=(const HandlerSlots&) = delete;

  class Running {
   public:
    Running(HandlerSlots& slots, const std::string& function, int caller);
    ~Running();
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;

   private:
    Slot* slot_;
  };

  void AppendWaits(std::vector<Wait>& out, const std::function<std::string(int rank)>& name_of) const;

 private:
  struct Slot {
    std::string thread;
    mutable absl::Mutex mu;
    // Handlers the thread is in: changed by the thread only; the outermost's fields are
    // written under mu while it is 0.
    std::atomic<int> depth{0};
    std::string function ABSL_GUARDED_BY(mu);
    int caller ABSL_GUARDED_BY(mu) = -1;
    std::chrono::steady_clock::time_point since ABSL_GUARDED_BY(mu);
  };
  Slot& OfThisThread();

  const uint64_t uid_;  // PerThread's owner id of the slots
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_OBSERVE_HANDLER_SLOTS_H_
