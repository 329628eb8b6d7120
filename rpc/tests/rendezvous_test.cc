// Units: Rendezvous (how workers find each other) and the ShutdownBarrier protocol, both
// over a real rendezvous store: the built-in one and etcd (store_backends.h).
#include "rendezvous.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "shutdown_barrier.h"
#include "store_backends.h"

namespace gw::rpc::internal {
namespace {

// Over both stores: the built-in one (hosted elsewhere, as for rank 0's peers) and etcd.
class RendezvousTest : public gw::rpc::testing::StoreBackendTest {
 protected:
  AgentOptions Options(int rank, int world) {
    AgentOptions o;
    o.rank = rank;
    o.world_size = world;
    o.rendezvous = address();
    o.host_store = false;
    o.run_id = "job";
    o.start_timeout = absl::Seconds(20);
    return o;
  }
  std::unique_ptr<Rendezvous> Join(int rank, int world) {
    auto r = Rendezvous::Join(Options(rank, world), absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
};

TEST_P(RendezvousTest, EveryWorkerSeesEveryRecordInRankOrder) {
  constexpr int kWorld = 3;
  std::vector<absl::StatusOr<std::vector<WorkerInfo>>> seen(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Rendezvous> rdzv = Join(r, kWorld);
      ASSERT_NE(rdzv, nullptr);
      ASSERT_TRUE(rdzv->Announce({absl::StrCat("w", r), r, absl::StrCat("127.0.0.1:", 1000 + r), 40 + r}).ok());
      seen[static_cast<size_t>(r)] = rdzv->AwaitAll(absl::Now() + absl::Seconds(10));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : seen) {
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->size(), 3u);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ((*s)[static_cast<size_t>(r)].name, absl::StrCat("w", r));
      EXPECT_EQ((*s)[static_cast<size_t>(r)].address, absl::StrCat("127.0.0.1:", 1000 + r));
      EXPECT_EQ((*s)[static_cast<size_t>(r)].pid, 40 + r);
    }
  }
}

TEST_P(RendezvousTest, MissingRanksAreNamedAtTheDeadline) {
  std::unique_ptr<Rendezvous> rdzv = Join(1, 4);
  ASSERT_NE(rdzv, nullptr);
  ASSERT_TRUE(rdzv->Announce({"w1", 1, "127.0.0.1:1", 1}).ok());
  std::unique_ptr<Rendezvous> other = Join(3, 4);
  ASSERT_TRUE(other->Announce({"w3", 3, "127.0.0.1:3", 3}).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<WorkerInfo>> all = rdzv->AwaitAll(absl::Now() + absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(all.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(all.status().message().find("rank(s) 0, 2 of 4"), std::string::npos) << all.status();
  EXPECT_NE(all.status().message().find("WORLD_SIZE"), std::string::npos) << all.status();
}

TEST_P(RendezvousTest, DuplicateNamesAreRefusedAndARestartedWorkerIsFoundAgain) {
  std::unique_ptr<Rendezvous> a = Join(0, 2), b = Join(1, 2);
  ASSERT_TRUE(a->Announce({"same", 0, "127.0.0.1:1", 1}).ok());
  ASSERT_TRUE(b->Announce({"same", 1, "127.0.0.1:2", 2}).ok());
  absl::StatusOr<std::vector<WorkerInfo>> all = a->AwaitAll(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(all.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(all.status().message().find("'same' is used by ranks 0 and 1"), std::string::npos) << all.status();
  // Rank 1 comes back elsewhere: Lookup reads its new record.
  ASSERT_TRUE(b->Announce({"same", 1, "127.0.0.1:9", 9}).ok());
  absl::StatusOr<WorkerInfo> again = a->Lookup(1, absl::Seconds(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->address, "127.0.0.1:9");
  EXPECT_EQ(a->Key("exited/", 3), "job/exited/3");
}

TEST_P(RendezvousTest, ABarrierRunsItsStepsInOrderOnEveryWorker) {
  constexpr int kWorld = 3;
  absl::Mutex mu;
  std::vector<std::string> log;
  std::vector<absl::Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Rendezvous> rdzv = Join(r, kWorld);
      ShutdownBarrier barrier(*rdzv, absl::StrCat("w", r), r, kWorld, kWorld);
      auto note = [&](const std::string& what) {
        absl::MutexLock lock(&mu);
        log.push_back(absl::StrCat(what, r));
      };
      results[static_cast<size_t>(r)] = barrier.Run(
          absl::Now() + absl::Seconds(10),
          {.drain = [&](absl::Time) { note("drain"); },
           .check_leaks = [&] {
             note("leaks");
             return r == 2 ? absl::FailedPreconditionError("w2 leaks") : absl::OkStatus();
           },
           .await_handlers = [&](absl::Time) { note("handlers"); },
           .gone = {}});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(results[0].ok() && results[1].ok()) << results[0] << results[1];
  EXPECT_EQ(results[2].message(), "w2 leaks");  // the leak check's verdict is the result
  // Every worker drained twice before any checked leaks (step 3 waits for all of step 2).
  size_t drains = 0, first_leak = log.size();
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].starts_with("drain")) {
      ++drains;
      EXPECT_LT(i, log.size());
    }
    if (log[i].starts_with("leaks") && first_leak == log.size()) first_leak = i;
  }
  EXPECT_EQ(drains, 6u);
  for (size_t i = first_leak; i < log.size(); ++i) EXPECT_FALSE(log[i].starts_with("drain")) << i;
}

TEST_P(RendezvousTest, ABarrierAWorkerNeverReachesFailsByItsDeadlineNamingIt) {
  std::unique_ptr<Rendezvous> rdzv = Join(0, 2);
  ShutdownBarrier barrier(*rdzv, "w0", 0, 2, 2);
  const absl::Time start = absl::Now();
  absl::Status s = barrier.Run(absl::Now() + absl::Milliseconds(300),
                               {.drain = [](absl::Time) {},
                                .check_leaks = [] { return absl::OkStatus(); },
                                .await_handlers = [](absl::Time) {},
                                .gone = {}});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("w0: graceful shutdown did not complete: rank(s) 1 did not reach 'shutdown/'"),
            std::string::npos)
      << s;
}

INSTANTIATE_TEST_SUITE_P(Stores, RendezvousTest, gw::rpc::testing::kBothStores, gw::rpc::testing::StoreBackendName);

}  // namespace
}  // namespace gw::rpc::internal
