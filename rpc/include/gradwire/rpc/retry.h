// RetryPolicy and Retry: the one retry loop of gradwire's layers (RRef control
// messages, the parameter-server client's reconnection), driven by a TimerQueue: no
// thread sleeps while an operation waits for its next attempt.
//
// Contract
//   - Retry<T>(executor, timers, policy, attempt) calls attempt(n) for n = 0, 1, ... until
//     an attempt succeeds, fails with an error that policy.retryable refuses (by default
//     only what a retry can fix: IsRetryable, i.e. UNAVAILABLE), max_attempts were made,
//     or the next attempt would start after policy.deadline (counted from the first
//     attempt). The result is the last attempt's; an error after retries says so:
//     "<error> (gave up after 4 attempts in 1.2s)".
//   - Between attempts it waits initial_backoff * multiplier^k, capped at max_backoff and
//     spread by +-jitter, on the TimerQueue; the next attempt is posted to `executor`
//     (attempts may block, e.g. while dialling), or runs on the timer's thread when the
//     executor refuses work (shut down), where it fails fast.
//   - The first attempt runs on the calling thread. attempt must not throw.
//   - The returned future completes on whichever thread completed the last attempt.
#ifndef GRADWIRE_RPC_RETRY_H_
#define GRADWIRE_RPC_RETRY_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/executor.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/timer_queue.h"

namespace gw::rpc {

struct RetryPolicy {
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(1);
  double multiplier = 2.0;
  double jitter = 0.2;  // each wait is scaled by a factor in [1 - jitter, 1 + jitter]
  int max_attempts = 0;  // 0: no limit but the deadline
  absl::Duration deadline = absl::Seconds(60);
  std::function<bool(const absl::Status&)> retryable = IsRetryable;

  // The wait before attempt n + 1 (n >= 0), without jitter.
  absl::Duration Backoff(int n) const {
    absl::Duration d = initial_backoff;
    for (int i = 0; i < n && d < max_backoff; ++i) d = d * multiplier;
    return std::min(d, max_backoff);
  }
};

namespace internal {

template <typename T>
class RetryLoop : public std::enable_shared_from_this<RetryLoop<T>> {
 public:
  RetryLoop(Executor& executor, TimerQueue& timers, RetryPolicy policy,
            std::function<Future<T>(int attempt)> attempt)
      : executor_(executor),
        timers_(timers),
        policy_(std::move(policy)),
        attempt_(std::move(attempt)),
        out_(executor),
        start_(absl::Now()),
        rng_(static_cast<uint32_t>(absl::ToUnixNanos(start_) ^ reinterpret_cast<uintptr_t>(this))) {}

  Future<T> result() const { return out_.future(); }

  void Attempt() {
    auto self = this->shared_from_this();
    attempt_(n_).Subscribe([self](const absl::StatusOr<T>& r) { self->Done(r); });
  }

 private:
  void Done(const absl::StatusOr<T>& r) {
    const int made = ++n_;
    if (r.ok() || !policy_.retryable(r.status()) || (policy_.max_attempts > 0 && made >= policy_.max_attempts)) {
      Finish(r, made);
      return;
    }
    const double spread = std::uniform_real_distribution<double>(1.0 - policy_.jitter, 1.0 + policy_.jitter)(rng_);
    const absl::Duration wait = policy_.Backoff(made - 1) * spread;
    if (absl::Now() + wait - start_ > policy_.deadline) {
      Finish(r, made);
      return;
    }
    auto self = this->shared_from_this();
    timers_.After(wait, [self] {
      if (!self->executor_.Post([self] { self->Attempt(); })) self->Attempt();
    });
  }

  void Finish(const absl::StatusOr<T>& r, int made) {
    if (r.ok() || made == 1) {
      out_.Set(r);
      return;
    }
    out_.Set(absl::Status(r.status().code(),
                          absl::StrCat(r.status().message(), " (gave up after ", made, " attempts in ",
                                       absl::FormatDuration(absl::Trunc(absl::Now() - start_, absl::Milliseconds(1))),
                                       ")")));
  }

  Executor& executor_;
  TimerQueue& timers_;
  const RetryPolicy policy_;
  const std::function<Future<T>(int)> attempt_;
  Promise<T> out_;
  const absl::Time start_;
  int n_ = 0;  // attempts made; touched by one attempt's completion at a time
  std::minstd_rand rng_;
};

}  // namespace internal

template <typename T>
Future<T> Retry(Executor& executor, TimerQueue& timers, RetryPolicy policy,
                std::function<Future<T>(int attempt)> attempt) {
  auto loop = std::make_shared<internal::RetryLoop<T>>(executor, timers, std::move(policy), std::move(attempt));
  Future<T> result = loop->result();
  loop->Attempt();
  return result;
}

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_RETRY_H_
