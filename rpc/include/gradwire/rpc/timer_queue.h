// TimerQueue: one thread that runs callbacks at given times: call deadlines and the
// backoff of retries (retry.h), without a thread sleeping per waiter.
//
// Contract
//   - At(when, fn) / After(delay, fn) schedule fn on the queue's thread at `when` (or as
//     soon after as the thread gets to it) and return a handle for Cancel. Callbacks run
//     one at a time in time order; they must be quick and must not block (work that takes
//     time is posted to an executor).
//   - Cancel(handle) returns true if fn had not started and now never will; false if it
//     ran, is running, was cancelled already, or the handle is empty.
//   - Shutdown() (also the destructor) stops the thread; timers still scheduled then run
//     at once on the calling thread, in time order, so nothing waiting on one is left
//     hanging (they find their owner shutting down). Scheduling after Shutdown runs fn at
//     once on the calling thread and returns an empty handle.
//   - Thread-safe. REQUIRES: Shutdown is not called from a timer callback.
#ifndef GRADWIRE_RPC_TIMER_QUEUE_H_
#define GRADWIRE_RPC_TIMER_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gw::rpc {

class TimerQueue {
 public:
  struct Handle {
    absl::Time when = absl::InfinitePast();
    uint64_t seq = 0;  // 0: empty
    bool empty() const { return seq == 0; }
  };

  explicit TimerQueue(std::string name = "gw-timer");
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  Handle At(absl::Time when, std::function<void()> fn);
  Handle After(absl::Duration delay, std::function<void()> fn) { return At(absl::Now() + delay, std::move(fn)); }
  bool Cancel(const Handle& handle);
  void Shutdown();
  size_t pending() const;

 private:
  void Loop();

  const std::string name_;
  mutable absl::Mutex mu_;
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_TIMER_QUEUE_H_
