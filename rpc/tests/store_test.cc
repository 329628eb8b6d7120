// Unit: the rendezvous store over real gRPC on loopback, one suite for both stores: the
// built-in StoreServer and a real etcd (store_backends.h). etcd's own cases (watches,
// restarts, job namespaces) are in etcd_store_test.cc.
#include "gradwire/rpc/store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "store_backends.h"

namespace gw::rpc::testing {
namespace {

class StoreTest : public StoreBackendTest {};

TEST_P(StoreTest, SetGetAddWaitDelete) {
  std::unique_ptr<Store> store = Connect();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(*store->Get("a", absl::Seconds(1)), std::string("x\0y", 3));
  ASSERT_TRUE(store->Set("a", "overwritten").ok());
  EXPECT_EQ(*store->Get("a", absl::Seconds(1)), "overwritten");
  EXPECT_EQ(*store->Add("n", 5), 5);
  EXPECT_EQ(*store->Add("n", -2), 3);
  EXPECT_EQ(*store->Get("n", absl::Seconds(1)), "3");
  absl::StatusOr<int64_t> not_a_counter = store->Add("a", 1);
  EXPECT_EQ(not_a_counter.status().code(), absl::StatusCode::kFailedPrecondition) << not_a_counter.status();
  EXPECT_NE(not_a_counter.status().message().find("'a' does not hold a counter"), std::string::npos)
      << not_a_counter.status();
  EXPECT_TRUE(*store->Delete("a"));
  EXPECT_FALSE(*store->Delete("a"));
  // Get waits for a key set later by another client.
  std::thread setter([&] {
    std::unique_ptr<Store> other = Connect();
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(other->Set("late", "v").ok());
  });
  EXPECT_EQ(*store->Get("late", absl::Seconds(10)), "v");
  setter.join();
  EXPECT_TRUE(store->Wait({"late", "n"}, absl::Seconds(1)).ok());
}

TEST_P(StoreTest, TimeoutsAndUnreachableServersAreClearErrors) {
  std::unique_ptr<Store> store = Connect();
  ASSERT_NE(store, nullptr);
  const absl::Time start = absl::Now();
  absl::Status s = store->Wait({"never"}, absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("'never' did not appear in time"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::StatusOr<std::string> get = store->Get("nor_this", absl::Milliseconds(200));
  EXPECT_EQ(get.status().code(), absl::StatusCode::kDeadlineExceeded) << get.status();
  EXPECT_NE(get.status().message().find("nor_this"), std::string::npos) << get.status();
  absl::StatusOr<int> port = FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto gone = ConnectStore(nothing_at(*port), absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable) << gone.status();
  EXPECT_NE(gone.status().message().find("127.0.0.1:" + std::to_string(*port)), std::string::npos) << gone.status();
}

TEST_P(StoreTest, AddsFromConcurrentClientsAreAtomic) {
  constexpr int kClients = 4, kAdds = 25;
  std::vector<std::vector<int64_t>> seen(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<Store> store = Connect();
      ASSERT_NE(store, nullptr);
      for (int i = 0; i < kAdds; ++i) {
        absl::StatusOr<int64_t> v = store->Add("counter", 1);
        ASSERT_TRUE(v.ok()) << v.status();
        seen[static_cast<size_t>(c)].push_back(*v);
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every Add saw a distinct value: 1 ... kClients * kAdds, each exactly once.
  std::vector<int64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(kClients * kAdds));
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], static_cast<int64_t>(i + 1));
  EXPECT_EQ(*Connect()->Get("counter", absl::Seconds(1)), std::to_string(kClients * kAdds));
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, kBothStores, StoreBackendName);

}  // namespace
}  // namespace gw::rpc::testing
