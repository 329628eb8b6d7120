// Unit: the rendezvous store over real gRPC on loopback.
#include "gradwire/rpc/store.h"

#include <gtest/gtest.h>

#include <thread>

namespace gw::rpc {
namespace {

TEST(StoreTest, SetGetAddWaitDelete) {
  auto server = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto store = ConnectStore((*server)->address(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(*(*store)->Get("a", absl::Seconds(1)), std::string("x\0y", 3));
  EXPECT_EQ(*(*store)->Add("n", 5), 5);
  EXPECT_EQ(*(*store)->Add("n", -2), 3);
  EXPECT_EQ((*store)->Add("a", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(*(*store)->Delete("a"));
  EXPECT_FALSE(*(*store)->Delete("a"));
  // Get waits for a key set later by another client.
  std::thread setter([&] {
    auto other = ConnectStore((*server)->address(), absl::Now() + absl::Seconds(10));
    absl::SleepFor(absl::Milliseconds(100));
    (void)(*other)->Set("late", "v");
  });
  EXPECT_EQ(*(*store)->Get("late", absl::Seconds(10)), "v");
  setter.join();
  EXPECT_TRUE((*store)->Wait({"late", "n"}, absl::Seconds(1)).ok());
}

TEST(StoreTest, TimeoutsAndUnreachableServersAreClearErrors) {
  auto server = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto store = ConnectStore((*server)->address(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(store.ok());
  const absl::Time start = absl::Now();
  absl::Status s = (*store)->Wait({"never"}, absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("never"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const std::string address = (*server)->address();
  (*server)->Shutdown();
  auto gone = ConnectStore(address, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(gone.status().message().find(address), std::string::npos) << gone.status();
}

}  // namespace
}  // namespace gw::rpc
