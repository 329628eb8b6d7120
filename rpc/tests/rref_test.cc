// RRefs between agents over real loopback connections (three agents on threads of this
// process; rref death tests with real processes are in agent_process_test.cc).
#include "gradwire/rpc/rref.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/match.h"
#include "gradwire/rpc/faults.h"
#include "gradwire/tensor/kernels.h"
#include "test_support.h"

namespace gw::rpc {
namespace {

using testing::AgentGroup;
using testing::InjectFaults;

std::unique_ptr<AgentGroup> StartGroup(int n, std::shared_ptr<FaultInjector> faults = nullptr) {
  AgentOptions o;
  o.transport_options.faults = std::move(faults);
  o.rref_leak_check = AgentOptions::LeakCheck::kError;
  o.default_timeout = absl::Seconds(20);
  return AgentGroup::Start(n, testing::RegisterTestFunctions, o);
}

// Every agent's tables drain to empty (the protocol finished and freed everything).
void ExpectAllReleased(AgentGroup& g, absl::Duration timeout = absl::Seconds(20)) {
  absl::Status s = g.AwaitRRefsReleased(timeout);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(RRefTest, RemoteThenToHereCopiesTheValueAndTheOwnerFreesItAfterTheLastUser) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  {
    RRef<Tensor> r = (*g)[0].Remote<Tensor>("worker1", "make_full", int64_t{1000}, 2.5);
    EXPECT_FALSE(r.IsOwner());
    EXPECT_EQ(r.Owner(), "worker1");
    absl::StatusOr<Tensor> t = r.ToHere();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->sizes(), Shape({1000}));
    EXPECT_EQ(kernels::Sum(*t).item(), 2500.0);
    EXPECT_TRUE(r.ConfirmedByOwner());  // the fetch came after the acknowledgement
    EXPECT_EQ((*g)[1].rref_stats().owned, 1);
    EXPECT_EQ((*g)[1].rref_stats().owner_forks, 1);
    RRef<Tensor> copy = r;  // copies share one fork
    EXPECT_EQ((*g)[0].rref_stats().users, 1);
  }
  ExpectAllReleased(*g);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

TEST(RRefTest, OwnerHandlesSeeTheSameStorageAndUsersGetCopies) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  Tensor t = Tensor::Full({4}, 1.0);
  {
    RRef<Tensor> mine = (*g)[0].Own(t);
    EXPECT_TRUE(mine.IsOwner());
    EXPECT_TRUE(mine.ConfirmedByOwner());
    absl::StatusOr<Tensor> local = mine.LocalValue();
    ASSERT_TRUE(local.ok());
    EXPECT_EQ(local->raw_data(), t.raw_data());  // the very tensor, not a copy
    // worker1 stashes a fork, and reads the value through it.
    absl::StatusOr<double> sum = (*g)[0].Sync<double>("worker1", "rref_stash", mine);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, 4.0);
    EXPECT_EQ((*g)[0].rref_stats().owner_forks, 1);
    // A user cannot read the value in place.
    RRef<Tensor> theirs = (*g)[1].Remote<Tensor>("worker0", "make_full", int64_t{2}, 1.0);
    EXPECT_EQ(theirs.LocalValue().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  ASSERT_TRUE((*g)[0].Sync<int64_t>("worker1", "rref_clear").ok());
  ExpectAllReleased(*g);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

TEST(RRefTest, MethodProxiesRunOnTheOwner) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  {
    RRef<Tensor> r = (*g)[0].Remote<Tensor>("worker1", "make_full", int64_t{3}, 2.0);
    absl::StatusOr<Tensor> scaled = r.Sync<Tensor>("scale", 5.0);
    ASSERT_TRUE(scaled.ok()) << scaled.status();
    EXPECT_EQ(scaled->ToVector<float>(), std::vector<float>(3, 10.0f));
    RRef<Tensor> chained = r.Remote<Tensor>("scale", 3.0);  // stays on worker1
    EXPECT_EQ(chained.Owner(), "worker1");
    absl::StatusOr<Tensor> v = chained.ToHere();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->ToVector<float>(), std::vector<float>(3, 6.0f));
    // An unknown method, and a method whose first parameter does not fit the value.
    EXPECT_EQ(r.Sync<Tensor>("no_such_method").status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(r.Sync<int64_t>("counter_add", int64_t{1}).status().code(), absl::StatusCode::kInvalidArgument);
  }
  ExpectAllReleased(*g);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

TEST(RRefTest, ObjectsStayOnTheirOwnerAndConcurrentProxiesSeeOneObject) {
  auto g = StartGroup(3);
  ASSERT_NE(g, nullptr);
  {
    RRef<std::shared_ptr<testing::Counter>> counter =
        (*g)[0].Remote<std::shared_ptr<testing::Counter>>("worker2", "make_counter", int64_t{100});
    constexpr int kThreads = 4, kEach = 50;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < kEach; ++i) EXPECT_TRUE(counter.Sync<int64_t>("counter_add", int64_t{1}).ok());
      });
    }
    // worker1 calls it too, through a fork of its own.
    RRef<std::shared_ptr<testing::Counter>> forked =
        *(*g)[0].Sync<RRef<std::shared_ptr<testing::Counter>>>("worker1", "rref_echo_object", counter);
    for (auto& t : threads) t.join();
    absl::StatusOr<int64_t> total = counter.Sync<int64_t>("counter_add", int64_t{0});
    ASSERT_TRUE(total.ok()) << total.status();
    EXPECT_EQ(*total, 100 + kThreads * kEach);
    EXPECT_EQ(*forked.Sync<int64_t>("counter_add", int64_t{1}), 100 + kThreads * kEach + 1);
    // The object cannot be copied to another worker.
    absl::StatusOr<std::shared_ptr<testing::Counter>> here = counter.ToHere();
    EXPECT_EQ(here.status().code(), absl::StatusCode::kFailedPrecondition) << here.status();
    EXPECT_NE(here.status().message().find("stays on its owner"), std::string::npos) << here.status();
    // Nor sent as a plain argument.
    auto obj = std::make_shared<testing::Counter>(0);
    EXPECT_EQ((*g)[0].Sync<int64_t>("worker1", "counter_add", obj, int64_t{1}).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  ExpectAllReleased(*g);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

// One fork path: `first` creates an RRef owned by `owner` (Own or Remote) and hands it to
// `second` (which reads it), `second` hands its fork to `third` (a grandchild), and
// `second` returns it (a new fork for `first`); an object owned by `owner` is called
// through its RRef. Then every worker drops what it holds and every table empties.
void RunForkPath(AgentGroup& g, int owner, int first, int second, int third) {
  SCOPED_TRACE(absl::StrCat("owner ", owner, " first ", first, " second ", second, " third ", third));
  const double value = owner * 100 + first * 10 + second + third * 0.5;
  const std::string owner_name = absl::StrCat("worker", owner), second_name = absl::StrCat("worker", second);
  {
    Agent& a = g[first];
    RRef<Tensor> r = first == owner ? a.Own(Tensor::Full({2}, value))
                                    : a.Remote<Tensor>(owner_name, "make_full", int64_t{2}, value);
    absl::StatusOr<double> s1 = a.Sync<double>(second_name, "rref_stash", r);
    ASSERT_TRUE(s1.ok()) << s1.status();
    EXPECT_EQ(*s1, 2 * value);
    absl::StatusOr<double> s2 = a.Sync<double>(second_name, "rref_forward", r, absl::StrCat("worker", third));
    ASSERT_TRUE(s2.ok()) << s2.status();
    EXPECT_EQ(*s2, 2 * value);
    absl::StatusOr<RRef<Tensor>> back = a.Sync<RRef<Tensor>>(second_name, "rref_echo", r);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->id(), r.id());
    EXPECT_EQ(kernels::Sum(*back->ToHere()).item(), 2 * value);
    RRef<std::shared_ptr<testing::Counter>> counter =
        a.Remote<std::shared_ptr<testing::Counter>>(owner_name, "make_counter", int64_t{7});
    absl::StatusOr<int64_t> added = counter.Sync<int64_t>("counter_add", int64_t{5});
    ASSERT_TRUE(added.ok()) << added.status();
    EXPECT_EQ(*added, 12);
  }  // first drops its handles while the others still hold forks
  for (int w = 0; w < 3; ++w) ASSERT_TRUE(g[0].Sync<int64_t>(absl::StrCat("worker", w), "rref_clear").ok());
  ExpectAllReleased(g);
}

// RunForkPath in every assignment of three workers to owner, first, second and third.
TEST(RRefTest, ForksAcrossThreeWorkersInEveryOrder) {
  auto g = StartGroup(3);
  ASSERT_NE(g, nullptr);
  int cases = 0;
  for (int owner = 0; owner < 3; ++owner) {
    for (int first = 0; first < 3; ++first) {
      for (int second = 0; second < 3; ++second) {
        for (int third = 0; third < 3; ++third) {
          RunForkPath(*g, owner, first, second, third);
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 81);  // 3^4 assignments
  EXPECT_TRUE(g->ShutdownAll().ok());
}

TEST(RRefTest, RRefsReturnedByTheOwnerAreConfirmedOnArrival) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  {
    absl::StatusOr<RRef<Tensor>> r = (*g)[0].Sync<RRef<Tensor>>("worker1", "rref_own", Tensor::Full({5}, 3.0));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->Owner(), "worker1");
    EXPECT_TRUE(r->ConfirmedByOwner());
    EXPECT_EQ(kernels::Sum(*r->ToHere()).item(), 15.0);
  }
  ExpectAllReleased(*g);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

TEST(RRefTest, TenThousandRRefsCreatedAndDroppedLeaveTheOwnerEmpty) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  for (int i = 0; i < 10000; ++i) {
    RRef<Tensor> r = (*g)[0].Remote<Tensor>("worker1", "make_full", int64_t{1}, static_cast<double>(i));
    if (i % 1000 == 0) {
      EXPECT_EQ(kernels::Sum(*r.ToHere()).item(), static_cast<double>(i));
    }
  }
  ExpectAllReleased(*g, absl::Seconds(60));
  EXPECT_TRUE(g->ShutdownAll().ok());
}

TEST(RRefTest, FailedCreationReportsTheErrorAndLeavesNothingBehind) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  {
    RRef<Tensor> missing = (*g)[0].Remote<Tensor>("worker1", "no_such_function");
    absl::StatusOr<Tensor> t = missing.ToHere();
    EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound) << t.status();
    EXPECT_NE(t.status().message().find("no_such_function"), std::string::npos) << t.status();
    EXPECT_FALSE(missing.ConfirmedByOwner());
    // It cannot be passed on either.
    EXPECT_EQ((*g)[0].Sync<double>("worker1", "rref_stash", missing).status().code(),
              absl::StatusCode::kFailedPrecondition);
    // The function ran and failed: the RRef exists, its value is the error.
    RRef<Tensor> failing = (*g)[0].Remote<Tensor>("worker1", "fail", std::string("broken on purpose"));
    absl::StatusOr<Tensor> f = failing.ToHere();
    EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(f.status().message().find("broken on purpose"), std::string::npos) << f.status();
    // No such worker.
    RRef<Tensor> nowhere = (*g)[0].Remote<Tensor>("worker9", "make_full", int64_t{1}, 1.0);
    EXPECT_EQ(nowhere.ToHere().status().code(), absl::StatusCode::kNotFound);
    // The wrong RRef type for a function's parameter.
    RRef<int64_t> wrong = (*g)[0].Own(int64_t{7});
    EXPECT_EQ((*g)[0].Sync<double>("worker1", "rref_stash", wrong).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  ExpectAllReleased(*g);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

TEST(RRefTest, GracefulShutdownReportsValuesStillReferencedByUsers) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  RRef<Tensor> kept = (*g)[1].Remote<Tensor>("worker0", "make_full", int64_t{1}, 1.0);
  ASSERT_TRUE(kept.ToHere().ok());
  absl::Status s = g->ShutdownAll();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("still referenced by 1 fork(s) on worker1"), std::string::npos) << s;
  // After shutdown the handle fails cleanly, with the failure model's code.
  EXPECT_EQ(kept.ToHere().status().code(), absl::StatusCode::kCancelled);
}

// Regressions found by review: each once hung, leaked or read freed memory.

TEST(RRefTest, ShuttingDownWhileACallWaitsForAValueStillBeingCreatedDoesNotHang) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  RRef<int64_t> slow = (*g)[0].Remote<int64_t>("worker1", "sleep_ms", int64_t{300});
  Future<int64_t> waiting = slow.Async<int64_t>("sleep_ms");  // method on the pending value
  // The REMOTE has arrived (the call follows it on the same connection).
  ASSERT_TRUE((*g)[1].AwaitRRefs([](const RRefStats& s) { return s.owned > 0; }, absl::Now() + absl::Seconds(10)));
  const absl::Time start = absl::Now();
  EXPECT_TRUE((*g)[1].Shutdown(/*graceful=*/false).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(waiting.Get(absl::Seconds(20)).ok());
}

TEST(RRefTest, RRefsOutlivingTheirAgentFailCleanly) {
  RRef<Tensor> mine, theirs;
  {
    auto g = StartGroup(2);
    ASSERT_NE(g, nullptr);
    mine = (*g)[0].Own(Tensor::Ones({2}));
    theirs = (*g)[0].Remote<Tensor>("worker1", "make_full", int64_t{2}, 1.0);
    ASSERT_TRUE(theirs.ToHere().ok());
  }  // agents destroyed (not shut down gracefully)
  EXPECT_EQ(mine.Owner(), "worker0");
  EXPECT_EQ(theirs.Owner(), "worker1");
  EXPECT_EQ(mine.ToHere().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(theirs.ToHere().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(mine.LocalValue().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(theirs.Sync<Tensor>("scale", 2.0).status().code(), absl::StatusCode::kCancelled);
}

TEST(RRefTest, AFailedCreationForwardedBeforeItsErrorReturnsFailsEverywhere) {
  auto g = StartGroup(3);
  ASSERT_NE(g, nullptr);
  {
    RRef<Tensor> r = (*g)[0].Remote<Tensor>("worker1", "no_such_function");
    // Sent on at once, usually while the REMOTE is still in flight (then worker2's fork
    // fails with the creation's NOT_FOUND); if the error came back first, sending the
    // failed RRef is refused (FAILED_PRECONDITION). Either way: quickly, naming the cause.
    const absl::Time start = absl::Now();
    absl::StatusOr<double> s = (*g)[0].Sync<double>("worker2", "rref_stash", r, CallOptions{absl::Seconds(10)});
    EXPECT_TRUE(s.status().code() == absl::StatusCode::kNotFound ||
                s.status().code() == absl::StatusCode::kFailedPrecondition)
        << s.status();
    EXPECT_NE(s.status().message().find("no_such_function"), std::string::npos) << s.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  ExpectAllReleased(*g);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

TEST(RRefTest, RRefsInAReplyThatArrivesAfterTheTimeoutAreReleased) {
  auto g = StartGroup(2);
  ASSERT_NE(g, nullptr);
  absl::StatusOr<RRef<Tensor>> late = (*g)[0].Sync<RRef<Tensor>>(
      "worker1", "rref_own_after", Tensor::Ones({3}), int64_t{300}, CallOptions{absl::Milliseconds(50)});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  // The owner creates the value after the caller gave up; the reply's RRef is adopted and
  // dropped, and the owner frees it.
  bool created = false;
  EXPECT_TRUE((*g)[1].AwaitRRefs(
      [&created](const RRefStats& s) {
        created = created || s.owned > 0;
        return created && s.owned == 0 && s.owner_forks == 0;
      },
      absl::Now() + absl::Seconds(20)));
  ExpectAllReleased(*g);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

// ------------------------------------------------------------------ under faults

// Drops, delays, duplicates and reordering that the fault link recovers from change
// nothing: every fork path gives the exact value and every table empties.
TEST(RRefFaultTest, ForksUnderRecoverableLinkFaultsAreExactAndEveryTableEmpties) {
  auto faults = InjectFaults("drop:0.03,delay:0ms-1ms,duplicate:0.03,reorder:4,seed:21");
  auto g = StartGroup(3, faults);
  ASSERT_NE(g, nullptr);
  for (int owner = 0; owner < 3; ++owner) {
    for (int first = 0; first < 3; ++first) {
      for (int second = 0; second < 3; ++second) RunForkPath(*g, owner, first, second, (second + 1) % 3);
    }
  }
  testing::ExpectRepairedWithoutCloses(*faults);
  EXPECT_TRUE(g->ShutdownAll().ok());
}

// Connections that close every few frames: each operation succeeds with the exact value
// or ends in time with an error that names a worker; once the faults stop, every table
// empties (a closed connection counts as its peer's death, rref.h).
TEST(RRefFaultTest, UnderClosingConnectionsEveryOperationEndsInTimeAndEveryTableEmpties) {
  auto faults = InjectFaults("close_after:30,seed:22");
  AgentOptions o;
  o.transport_options.faults = faults;
  o.default_timeout = absl::Seconds(5);
  o.shutdown_timeout = absl::Seconds(5);
  auto g = AgentGroup::Start(3, testing::RegisterTestFunctions, o);
  ASSERT_NE(g, nullptr);
  const absl::Duration kBound = absl::Seconds(10);  // the timeout, and as much again
  int ok = 0, failed = 0;
  auto check = [&](absl::string_view what, int k, absl::Time start, const absl::Status& s) {
    EXPECT_LT(absl::Now() - start, kBound) << what << " " << k << " took too long: " << s;
    if (s.ok()) {
      ++ok;
      return;
    }
    ++failed;
    const absl::StatusCode code = s.code();
    EXPECT_TRUE(code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
                code == absl::StatusCode::kNotFound || code == absl::StatusCode::kFailedPrecondition)
        << what << " " << k << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "worker")) << what << " " << k << " names no worker: " << s;
  };
  for (int k = 0; k < 60; ++k) {
    const int from = k % 3, owner = (k + 1) % 3, other = (k + 2) % 3;
    Agent& a = (*g)[from];
    absl::Time start = absl::Now();
    RRef<Tensor> r = a.Remote<Tensor>(absl::StrCat("worker", owner), "make_full", int64_t{3}, double(k));
    absl::StatusOr<Tensor> here = r.ToHere();
    check("ToHere", k, start, here.status());
    if (here.ok()) {
      EXPECT_EQ(here->ToVector<float>(), std::vector<float>(3, static_cast<float>(k)));
    }
    start = absl::Now();
    absl::StatusOr<double> stashed = a.Sync<double>(absl::StrCat("worker", other), "rref_stash", r, CallOptions{absl::Seconds(8)});
    check("rref_stash", k, start, stashed.status());
    if (stashed.ok()) {
      EXPECT_EQ(*stashed, 3.0 * k);
    }
  }
  EXPECT_GT(ok, 0);
  const FaultStats stats = faults->stats();
  EXPECT_GE(stats.connections_closed, 3u) << stats.ToString();
  EXPECT_GT(failed, 0) << "no operation met a closing connection; " << stats.ToString();
  // The faults stop; the stashes are dropped; nothing may stay behind.
  faults->Set(FaultSpec{});
  for (int w = 0; w < 3; ++w) {
    // A connection that had reached its limit may still close once (then the call is
    // made again on a fresh one).
    absl::StatusOr<int64_t> cleared;
    for (int attempt = 0; attempt < 3; ++attempt) {
      cleared = (*g)[(w + 1) % 3].Sync<int64_t>(absl::StrCat("worker", w), "rref_clear");
      if (cleared.status().code() != absl::StatusCode::kUnavailable) break;
    }
    EXPECT_TRUE(cleared.ok()) << cleared.status();
  }
  ExpectAllReleased(*g, absl::Seconds(30));
  (void)g->ShutdownAll();  // may report peers declared dead by a close: bounded by shutdown_timeout
}

}  // namespace
}  // namespace gw::rpc
