// Unit: CallTable, the calls an agent awaits, with their deadlines.
#include "calls/call_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace gw::rpc::internal {
namespace {

std::string Describe(int rank) { return absl::StrCat("worker", rank, " (rank ", rank, ")"); }

// Records the one result of a call.
struct Result {
  absl::Notification done;
  absl::StatusOr<Value> value = absl::UnknownError("not completed");
  std::atomic<int> calls{0};
  CallTable::Done Callback() {
    return [this](absl::StatusOr<Value> v) {
      value = std::move(v);
      ++calls;
      done.Notify();
    };
  }
};

TEST(CallTableTest, EachCallCompletesExactlyOnceWhicheverComesFirst) {
  TimerQueue timers;
  CallTable table(timers, Describe);
  Result answered, late;
  // A later call with an earlier deadline re-arms the table's timer (else `late` would
  // wait for a's ten minutes).
  const uint64_t a = table.Add(1, "add", absl::Minutes(10), answered.Callback());
  const uint64_t b = table.Add(1, "slow", absl::Milliseconds(20), late.Callback());
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  size_t before = 99;
  Result c;
  const uint64_t third = table.Add(2, "noop", absl::Seconds(10), c.Callback(), &before);
  EXPECT_EQ(before, 2u);
  ASSERT_TRUE(table.Find(a).has_value());
  EXPECT_EQ(table.Find(a)->rank, 1);
  EXPECT_EQ(table.Find(a)->function, "add");
  EXPECT_TRUE(table.Complete(a, Value(int64_t{5})));
  EXPECT_FALSE(table.Complete(a, Value(int64_t{6})));  // a second reply is dropped
  EXPECT_EQ(answered.value->get<int64_t>(), 5);
  ASSERT_TRUE(late.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(late.value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.value.status().message(), "call to worker1 (rank 1).slow timed out after 20ms");
  EXPECT_FALSE(table.Complete(b, Value()));  // the reply after the timeout
  EXPECT_EQ(late.calls.load(), 1);
  EXPECT_TRUE(table.Complete(third, Value()));
  EXPECT_EQ(table.size(), 0u);
  EXPECT_TRUE(table.AwaitEmpty(absl::Now()));
}

TEST(CallTableTest, DeadlinesOfCompletedCallsAreDroppedAndTheOthersStillFire) {
  TimerQueue timers;
  CallTable table(timers, Describe);
  // Thousands of calls answered in time (their heap entries go stale and are compacted)
  // around a few that are not: exactly those time out, each once.
  std::vector<std::unique_ptr<Result>> results;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3000; ++i) {
    results.push_back(std::make_unique<Result>());
    const bool slow = i % 1000 == 999;
    ids.push_back(table.Add(1, slow ? "slow" : "fast", slow ? absl::Milliseconds(30) : absl::Minutes(10),
                            results.back()->Callback()));
    if (i >= 10 && (i - 10) % 1000 != 999) table.Complete(ids[static_cast<size_t>(i - 10)], Value(int64_t{i}));
  }
  for (int i = 2990; i < 3000; ++i) {
    if (i % 1000 != 999) table.Complete(ids[static_cast<size_t>(i)], Value(int64_t{i}));
  }
  for (int i = 0; i < 3000; ++i) {
    Result& r = *results[static_cast<size_t>(i)];
    ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10))) << i;
    EXPECT_EQ(r.calls.load(), 1);
    EXPECT_EQ(r.value.ok(), i % 1000 != 999) << i;
  }
  EXPECT_EQ(table.size(), 0u);
  // One more call still gets its deadline once the table was empty.
  Result again;
  table.Add(2, "slow", absl::Milliseconds(10), again.Callback());
  ASSERT_TRUE(again.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(again.value.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(CallTableTest, APeerThatGoesAwayFailsOnlyItsCallsNamingIt) {
  TimerQueue timers;
  CallTable table(timers, Describe);
  Result to1, to2, refused;
  table.Add(1, "stage", absl::Seconds(10), to1.Callback());
  table.Add(2, "stage", absl::Seconds(10), to2.Callback());
  table.FailPeer(1, absl::UnavailableError("connection reset by peer"));
  ASSERT_TRUE(to1.done.HasBeenNotified());
  EXPECT_EQ(to1.value.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(to1.value.status().message(), "call to worker1 (rank 1).stage failed: connection reset by peer");
  EXPECT_FALSE(to2.done.HasBeenNotified());
  // A peer refused for its protocol version keeps that code: a retry cannot fix it.
  table.FailPeer(2, absl::FailedPreconditionError("worker2 speaks gradwire protocol 9"));
  EXPECT_EQ(to2.value.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.size(), 0u);
}

TEST(CallTableTest, CloseFailsEverythingAndRefusesNewCalls) {
  TimerQueue timers;
  CallTable table(timers, Describe);
  Result pending, after;
  table.Add(1, "stage", absl::Seconds(10), pending.Callback());
  table.Close(absl::CancelledError("worker0 is shutting down"));
  EXPECT_EQ(pending.value.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(timers.pending(), 0u);  // the deadline timer was disarmed
  EXPECT_EQ(table.Add(1, "stage", absl::Seconds(10), after.Callback()), 0u);
  ASSERT_TRUE(after.done.HasBeenNotified());  // at once, with the close reason
  EXPECT_EQ(after.value.status().message(), "worker0 is shutting down");
}

TEST(CallTableTest, RacingRepliesAndDeadlinesCompleteEachCallOnce) {
  TimerQueue timers;
  CallTable table(timers, Describe);
  constexpr int kCalls = 2000;
  std::vector<std::unique_ptr<Result>> results;
  std::vector<uint64_t> ids;
  for (int i = 0; i < kCalls; ++i) {
    results.push_back(std::make_unique<Result>());
    // Deadlines of 0-2 ms race the replies below.
    ids.push_back(table.Add(i % 3, "f", absl::Microseconds(1000 * (i % 3)), results.back()->Callback()));
  }
  std::thread replier([&] {
    for (int i = 0; i < kCalls; ++i) table.Complete(ids[static_cast<size_t>(i)], Value(int64_t{i}));
  });
  replier.join();
  for (auto& r : results) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(r->calls.load(), 1);
    EXPECT_TRUE(r->value.ok() || r->value.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
  EXPECT_TRUE(table.AwaitEmpty(absl::Now() + absl::Seconds(5)));
}

}  // namespace
}  // namespace gw::rpc::internal
