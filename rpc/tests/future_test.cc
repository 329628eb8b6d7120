// Unit: Future / Promise / ThreadPool.
#include "gradwire/rpc/future.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace gw {
namespace {

using rpc::ThreadPool;

TEST(FutureTest, SetOnceAndWait) {
  ThreadPool pool(2, "test");
  Promise<int> p(pool);
  Future<int> f = p.future();
  EXPECT_FALSE(f.IsReady());
  EXPECT_EQ(f.WaitFor(absl::Milliseconds(10)).code(), absl::StatusCode::kDeadlineExceeded);
  std::thread t([p] { p.Set(42); });
  EXPECT_EQ(*f.Get(absl::Seconds(5)), 42);
  t.join();
  EXPECT_FALSE(p.Set(7));  // the first result sticks
  EXPECT_EQ(*f.Get(), 42);
}

TEST(FutureTest, ErrorsPropagateThroughThen) {
  ThreadPool pool(1, "test");
  Promise<int> p(pool);
  Future<std::string> g = p.future().Then([](const absl::StatusOr<int>& v) -> absl::StatusOr<std::string> {
    if (!v.ok()) return v.status();
    return std::to_string(*v);
  });
  p.SetError(absl::UnavailableError("peer gone"));
  absl::StatusOr<std::string> r = g.Get(absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "peer gone");
}

TEST(FutureTest, ThenNeverRunsInlineEvenWhenReady) {
  ThreadPool pool(1, "test");
  Future<int> ready = MakeReadyFuture<int>(pool, 1);
  const std::thread::id me = std::this_thread::get_id();
  std::atomic<bool> inline_call{false};
  Future<int> next = ready.Then([&](const absl::StatusOr<int>& v) {
    inline_call = std::this_thread::get_id() == me;
    return *v + 1;
  });
  EXPECT_EQ(*next.Get(absl::Seconds(5)), 2);
  EXPECT_FALSE(inline_call);
}

TEST(FutureTest, ThenChainsFuturesAndCatchesExceptions) {
  ThreadPool pool(2, "test");
  Promise<int> inner(pool);
  Future<int> chained = MakeReadyFuture<int>(pool, 5).Then(
      [inner](const absl::StatusOr<int>&) { return inner.future(); });
  EXPECT_FALSE(chained.WaitFor(absl::Milliseconds(20)).ok());
  inner.Set(9);
  EXPECT_EQ(*chained.Get(absl::Seconds(5)), 9);
  Future<int> thrown = MakeReadyFuture<int>(pool, 1).Then(
      [](const absl::StatusOr<int>&) -> int { throw std::runtime_error("boom"); });
  EXPECT_EQ(thrown.Get(absl::Seconds(5)).status().code(), absl::StatusCode::kInternal);
  Future<bool> v = MakeReadyFuture<int>(pool, 1).Then([](const absl::StatusOr<int>&) {});
  EXPECT_TRUE(*v.Get(absl::Seconds(5)));
}

TEST(ThreadPoolTest, RunsEverythingQueuedBeforeShutdown) {
  std::atomic<int> n{0};
  {
    ThreadPool pool(3, "test");
    for (int i = 0; i < 1000; ++i) pool.Post([&] { n.fetch_add(1); });
    pool.Shutdown();
    EXPECT_FALSE(pool.Post([&] { n.fetch_add(1000); }));
  }
  EXPECT_EQ(n.load(), 1000);
}

TEST(FutureTest, MapRunsOnTheCompletingThreadAndTurnsAThrowIntoAnError) {
  ThreadPool pool(1, "test");
  Promise<int> p(pool);
  Future<int> doubled = Map<int>(p.future(), [](const absl::StatusOr<int>& v) -> absl::StatusOr<int> { return *v * 2; });
  Future<int> thrown = Map<int>(p.future(), [](const absl::StatusOr<int>&) -> absl::StatusOr<int> {
    throw std::runtime_error("bad shard");
  });
  p.Set(21);
  // Completed by Set itself, on this thread.
  EXPECT_EQ(*doubled.Get(absl::ZeroDuration()), 42);
  EXPECT_EQ(thrown.Get(absl::ZeroDuration()).status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(thrown.Get(absl::ZeroDuration()).status().message().find("bad shard"), std::string::npos);
}

TEST(ParallelForTest, EveryTaskRunsOnceAlsoFromAFullPoolAndAfterShutdown) {
  ThreadPool pool(2, "test");
  std::vector<std::atomic<int>> runs(100);
  rpc::ParallelFor(pool, 100, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
  for (const auto& r : runs) EXPECT_EQ(r.load(), 1);
  // Called from both pool threads at once, each waiting for its own tasks: the callers
  // take the tasks no helper gets to, so nothing waits on a pool that is all busy.
  std::atomic<int64_t> sum{0};
  absl::Notification both_done;
  std::atomic<int> done{0};
  for (int caller = 0; caller < 2; ++caller) {
    pool.Post([&] {
      rpc::ParallelFor(pool, 50, [&](int64_t i) { sum.fetch_add(i + 1); });
      if (done.fetch_add(1) == 1) both_done.Notify();
    });
  }
  ASSERT_TRUE(both_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(sum.load(), 2 * 50 * 51 / 2);
  pool.Shutdown();
  int after = 0;
  rpc::ParallelFor(pool, 7, [&](int64_t) { ++after; });  // no helpers: all on this thread
  EXPECT_EQ(after, 7);
}

}  // namespace
}  // namespace gw
