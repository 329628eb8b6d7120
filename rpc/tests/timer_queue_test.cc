// Units: TimerQueue and the retry loop built on it (retry.h).
#include "gradwire/rpc/timer_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gradwire/rpc/retry.h"

namespace gw::rpc {
namespace {

TEST(TimerQueueTest, RunsCallbacksInTimeOrderNotScheduleOrder) {
  TimerQueue timers;
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification done;
  const absl::Time now = absl::Now();
  timers.At(now + absl::Milliseconds(60), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(3);
    done.Notify();
  });
  timers.At(now + absl::Milliseconds(20), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(1);
  });
  timers.At(now + absl::Milliseconds(40), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(2);
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - now, absl::Milliseconds(60));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(TimerQueueTest, CancelledTimersNeverRun) {
  TimerQueue timers;
  std::atomic<int> ran{0};
  absl::Notification later;
  TimerQueue::Handle h = timers.After(absl::Milliseconds(30), [&] { ++ran; });
  timers.After(absl::Milliseconds(80), [&] { later.Notify(); });
  EXPECT_TRUE(timers.Cancel(h));
  EXPECT_FALSE(timers.Cancel(h));  // once
  EXPECT_FALSE(timers.Cancel(TimerQueue::Handle{}));
  ASSERT_TRUE(later.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(ran.load(), 0);
}

TEST(TimerQueueTest, ShutdownRunsWhatIsLeftSoNothingWaitsForever) {
  TimerQueue timers;
  std::atomic<int> ran{0};
  timers.After(absl::Hours(1), [&] { ++ran; });
  timers.After(absl::Hours(2), [&] { ++ran; });
  EXPECT_EQ(timers.pending(), 2u);
  timers.Shutdown();
  EXPECT_EQ(ran.load(), 2);
  // After shutdown a timer runs at once, on the caller's thread.
  TimerQueue::Handle h = timers.After(absl::Hours(1), [&] { ++ran; });
  EXPECT_TRUE(h.empty());
  EXPECT_EQ(ran.load(), 3);
}

// An operation that fails `failures` times with `code`, then succeeds.
struct Flaky {
  explicit Flaky(int f, absl::StatusCode c = absl::StatusCode::kUnavailable) : failures(f), code(c) {}
  int failures;
  absl::StatusCode code;
  std::vector<absl::Time> attempts;
  Future<int> Attempt(Executor& ex, int n) {
    attempts.push_back(absl::Now());
    EXPECT_EQ(n, static_cast<int>(attempts.size()) - 1);
    if (n < failures) return MakeReadyFuture<int>(ex, absl::Status(code, "worker1 is unavailable: try again"));
    return MakeReadyFuture<int>(ex, 42);
  }
};

RetryPolicy Fast() {
  RetryPolicy p;
  p.initial_backoff = absl::Milliseconds(10);
  p.max_backoff = absl::Milliseconds(40);
  p.jitter = 0;
  p.deadline = absl::Seconds(10);
  return p;
}

TEST(RetryTest, RetriesUnavailableWithGrowingBackoffUntilItSucceeds) {
  ThreadPool pool(1, "test");
  TimerQueue timers;
  Flaky flaky(4);
  absl::StatusOr<int> r =
      Retry<int>(pool, timers, Fast(), [&](int n) { return flaky.Attempt(pool, n); }).Get(absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 42);
  ASSERT_EQ(flaky.attempts.size(), 5u);
  // Waits of 10, 20, 40, 40 ms (capped): no attempt comes early.
  const absl::Duration want[] = {absl::Milliseconds(10), absl::Milliseconds(20), absl::Milliseconds(40),
                                 absl::Milliseconds(40)};
  for (size_t i = 1; i < flaky.attempts.size(); ++i) {
    EXPECT_GE(flaky.attempts[i] - flaky.attempts[i - 1], want[i - 1] - absl::Milliseconds(1)) << i;
  }
  EXPECT_EQ(Fast().Backoff(0), absl::Milliseconds(10));
  EXPECT_EQ(Fast().Backoff(10), absl::Milliseconds(40));
}

TEST(RetryTest, OnlyWhatARetryCanFixIsRetried) {
  ThreadPool pool(1, "test");
  TimerQueue timers;
  for (absl::StatusCode code : {absl::StatusCode::kInternal, absl::StatusCode::kDeadlineExceeded,
                                absl::StatusCode::kCancelled, absl::StatusCode::kInvalidArgument,
                                absl::StatusCode::kResourceExhausted}) {
    Flaky flaky(1, code);
    absl::StatusOr<int> r =
        Retry<int>(pool, timers, Fast(), [&](int n) { return flaky.Attempt(pool, n); }).Get(absl::Seconds(10));
    EXPECT_EQ(r.status().code(), code);
    EXPECT_EQ(flaky.attempts.size(), 1u) << absl::StatusCodeToString(code);
    EXPECT_EQ(r.status().message(), "worker1 is unavailable: try again");  // not dressed up: never retried
  }
}

TEST(RetryTest, GivesUpAtMaxAttemptsOrTheDeadlineAndSaysSo) {
  ThreadPool pool(1, "test");
  TimerQueue timers;
  RetryPolicy p = Fast();
  p.max_attempts = 3;
  Flaky flaky(100);
  absl::StatusOr<int> r = Retry<int>(pool, timers, p, [&](int n) { return flaky.Attempt(pool, n); }).Get(absl::Seconds(10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(flaky.attempts.size(), 3u);
  EXPECT_NE(r.status().message().find("gave up after 3 attempts"), std::string::npos) << r.status();

  p.max_attempts = 0;
  p.deadline = absl::Milliseconds(100);
  Flaky forever(1000);
  const absl::Time start = absl::Now();
  r = Retry<int>(pool, timers, p, [&](int n) { return forever.Attempt(pool, n); }).Get(absl::Seconds(10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_GE(forever.attempts.size(), 2u);
  EXPECT_LE(forever.attempts.back() - start, absl::Milliseconds(100) + absl::Milliseconds(50));
}

TEST(RetryTest, ATimerQueueThatShutsDownEndsTheLoopInsteadOfLeavingItPending) {
  ThreadPool pool(1, "test");
  TimerQueue timers;
  RetryPolicy p = Fast();
  p.initial_backoff = absl::Hours(1);  // the next attempt would wait an hour...
  p.max_backoff = absl::Hours(1);
  p.deadline = absl::Hours(10);
  p.max_attempts = 2;
  Flaky flaky(100);
  Future<int> f = Retry<int>(pool, timers, p, [&](int n) { return flaky.Attempt(pool, n); });
  timers.Shutdown();  // ...but the queue runs it now
  absl::StatusOr<int> r = f.Get(absl::Seconds(10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(flaky.attempts.size(), 2u);
}

}  // namespace
}  // namespace gw::rpc
