#include "gradwire/rpc/timer_queue.h"

#include <pthread.h>

#include <vector>

namespace gw::rpc {

TimerQueue::TimerQueue(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { Loop(); });
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

TimerQueue::~TimerQueue() { Shutdown(); }

TimerQueue::Handle TimerQueue::At(absl::Time when, std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      const uint64_t seq = next_seq_++;
      timers_.emplace(std::make_pair(when, seq), std::move(fn));
      return Handle{when, seq};
    }
  }
  fn();  // the queue has shut down: run rather than lose it
  return Handle{};
}

bool TimerQueue::Cancel(const Handle& handle) {
  if (handle.empty()) return false;
  std::function<void()> dropped;  // destroyed after the lock: it may own anything
  absl::MutexLock lock(&mu_);
  auto it = timers_.find({handle.when, handle.seq});
  if (it == timers_.end()) return false;
  dropped = std::move(it->second);
  timers_.erase(it);
  return true;
}

size_t TimerQueue::pending() const {
  absl::MutexLock lock(&mu_);
  return timers_.size();
}

void TimerQueue::Shutdown() {
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> left;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  {
    absl::MutexLock lock(&mu_);
    left.swap(timers_);
  }
  for (auto& [key, fn] : left) fn();
}

void TimerQueue::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time next = timers_.empty() ? absl::InfiniteFuture() : timers_.begin()->first.first;
    // Wakes for: shutdown, or a timer scheduled earlier than the one we wait for.
    auto changed = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (!timers_.empty() && timers_.begin()->first.first < next);
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), next);
    if (stopping_) return;
    const absl::Time now = absl::Now();
    std::vector<std::function<void()>> due;
    while (!timers_.empty() && timers_.begin()->first.first <= now) {
      due.push_back(std::move(timers_.begin()->second));
      timers_.erase(timers_.begin());
    }
    if (due.empty()) continue;
    mu_.Unlock();
    for (auto& fn : due) fn();
    due.clear();  // destroyed outside the lock
    mu_.Lock();
  }
}

}  // namespace gw::rpc
