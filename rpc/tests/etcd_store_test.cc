// Unit: EtcdStore (etcd_store.h) against a real etcd (etcd_server.h): addresses, waits
// woken through watches, timeouts naming every missing key, job namespaces, an etcd that
// restarts under waiting and calling clients, and unreachable or foreign servers. The
// semantics it shares with the built-in store are checked by store_test.cc.
#include "store/etcd_store.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "etcd_server.h"

namespace gw::rpc::internal {
namespace {

using gw::rpc::testing::EtcdServer;
using gw::rpc::testing::EtcdTest;

bool Watching(double watchers) { return watchers >= 1; }
constexpr char kTxns[] = "grpc_server_started_total";
constexpr char kTxnLabels[] = "grpc_method=\"Txn\"";

std::unique_ptr<Store> MustConnect(const std::string& url) {
  absl::StatusOr<std::unique_ptr<Store>> store = ConnectStore(url, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

using EtcdStoreTest = EtcdTest;

TEST(EtcdUrlTest, ParsesEtcdAddressesAndRefusesOthersSayingTheForm) {
  absl::StatusOr<EtcdUrl> url = ParseEtcdUrl("etcd://10.0.0.1:2379/job-1.a_B");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->endpoint, "10.0.0.1:2379");
  EXPECT_EQ(url->host, "10.0.0.1");
  EXPECT_EQ(url->job, "job-1.a_B");
  EXPECT_EQ(url->prefix, "/gradwire/job-1.a_B/");
  url = ParseEtcdUrl("etcd://[::1]:2379/j");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->host, "::1");
  EXPECT_EQ(url->endpoint, "[::1]:2379");
  EXPECT_TRUE(IsEtcdUrl("etcd://h:1/j"));
  EXPECT_FALSE(IsEtcdUrl("127.0.0.1:29500"));
  for (const char* bad : {"etcd://10.0.0.1:2379", "etcd://10.0.0.1/j", "etcd://h:2379/", "etcd://h:2379/a/b",
                          "etcd://h:2379/a b", "etcd://:2379/j", "http://h:2379/j"}) {
    absl::StatusOr<EtcdUrl> r = ParseEtcdUrl(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("expected etcd://HOST:PORT/JOB"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status();
  }
  absl::StatusOr<std::unique_ptr<Store>> store = ConnectStore("etcd://h:2379", absl::Now() + absl::Seconds(1));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << store.status();
}

TEST_F(EtcdStoreTest, AWaitIsWokenByALaterSetThroughAWatchNotByPolling) {
  std::unique_ptr<Store> waiter = MustConnect(etcd_->Url("job")), setter = MustConnect(etcd_->Url("job"));
  ASSERT_TRUE(waiter && setter);
  absl::Status waited;
  std::thread t([&] { waited = waiter->Wait({"late"}, absl::Seconds(60)); });
  // The waiter read once and now watches the key.
  ASSERT_TRUE(etcd_->AwaitWatchers(Watching));
  const double reads = etcd_->Metric(kTxns, kTxnLabels);
  ASSERT_TRUE(setter->Set("late", "v").ok());
  t.join();
  EXPECT_TRUE(waited.ok()) << waited;
  // One more read after the watch fired; none while it waited.
  EXPECT_EQ(etcd_->Metric(kTxns, kTxnLabels), reads + 1);
  EXPECT_TRUE(etcd_->AwaitWatchers([](double watchers) { return watchers == 0; }))
      << "the watch ends with the wait";
}

TEST_F(EtcdStoreTest, TimeoutsNameEveryMissingKeyAndAShortTimeoutStillLooks) {
  std::unique_ptr<Store> store = MustConnect(etcd_->Url("job"));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("b", "there").ok());
  absl::Status s = store->Wait({"a", "b", "c"}, absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("store keys 'a', 'c' did not appear in time"), std::string::npos) << s;
  EXPECT_NE(s.message().find(etcd_->Url("job")), std::string::npos) << s;
  EXPECT_EQ(*store->Get("b", absl::ZeroDuration()), "there");
  EXPECT_EQ(store->Get("a", absl::ZeroDuration()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(store->Wait({}, absl::ZeroDuration()).ok());
}

TEST_F(EtcdStoreTest, JobsOnOneEtcdNeverMixKeys) {
  std::unique_ptr<Store> a = MustConnect(etcd_->Url("job-a")), b = MustConnect(etcd_->Url("job-b"));
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Set("k", "from a").ok());
  EXPECT_EQ(b->Get("k", absl::Milliseconds(100)).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(b->Set("k", "from b").ok());
  EXPECT_EQ(*a->Add("n", 1), 1);
  EXPECT_EQ(*b->Add("n", 10), 10);
  EXPECT_EQ(*a->Get("k", absl::Seconds(1)), "from a");
  EXPECT_TRUE(*a->Delete("k"));
  EXPECT_EQ(*b->Get("k", absl::Seconds(1)), "from b");
  EXPECT_EQ(*b->Get("n", absl::Seconds(1)), "10");
  // In etcd the keys are /gradwire/<job>/<key> (seen with etcdctl where it is installed).
  if (::access("/usr/bin/etcdctl", X_OK) == 0) {
    const std::string command = absl::StrCat("ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=", etcd_->endpoint(),
                                             " get --prefix --keys-only /gradwire/job- 2>&1");
    std::FILE* p = ::popen(command.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[256];
    while (std::fgets(buf, sizeof(buf), p)) out += buf;
    ::pclose(p);
    EXPECT_NE(out.find("/gradwire/job-a/n\n"), std::string::npos) << out;
    EXPECT_NE(out.find("/gradwire/job-b/k\n"), std::string::npos) << out;
    EXPECT_NE(out.find("/gradwire/job-b/n\n"), std::string::npos) << out;
    EXPECT_EQ(out.find("/gradwire/job-a/k\n"), std::string::npos) << out;
  }
  // DeletePrefix removes one job's keys under a prefix, and nothing else.
  absl::StatusOr<std::unique_ptr<EtcdStore>> direct = ConnectEtcdStore(etcd_->Url("job-b"), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(direct.ok()) << direct.status();
  ASSERT_TRUE((*direct)->Set("run/x", "1").ok());
  ASSERT_TRUE((*direct)->Set("run/y", "1").ok());
  EXPECT_EQ(*(*direct)->DeletePrefix("run/"), 2);
  EXPECT_EQ(*b->Get("k", absl::Seconds(1)), "from b");
  EXPECT_EQ(*a->Get("n", absl::Seconds(1)), "1");
}

TEST_F(EtcdStoreTest, AnEtcdThatRestartsIsRiddenOutByWaitsAndCalls) {
  std::unique_ptr<Store> waiter = MustConnect(etcd_->Url("job")), caller = MustConnect(etcd_->Url("job"));
  ASSERT_TRUE(waiter && caller);
  ASSERT_TRUE(caller->Set("before", "1").ok());
  absl::Status waited;
  std::thread wait([&] { waited = waiter->Wait({"after"}, absl::Seconds(60)); });
  ASSERT_TRUE(etcd_->AwaitWatchers(Watching));
  etcd_->Stop();  // as a crash, while a Wait watches
  // Calls made while etcd is down wait for it (each has 10 s).
  absl::Status set;
  absl::StatusOr<int64_t> added;
  std::thread calls([&] {
    set = caller->Set("during", "x");
    added = caller->Add("n", 2);
  });
  ASSERT_TRUE(etcd_->Restart().ok());  // same data dir
  calls.join();
  EXPECT_TRUE(set.ok()) << set;
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 2);
  std::unique_ptr<Store> late = MustConnect(etcd_->Url("job"));
  ASSERT_NE(late, nullptr);
  ASSERT_TRUE(late->Set("after", "1").ok());
  wait.join();
  EXPECT_TRUE(waited.ok()) << waited;
  // The data survived, and the Add counted once.
  EXPECT_EQ(*late->Get("before", absl::Seconds(1)), "1");
  EXPECT_EQ(*late->Get("during", absl::Seconds(1)), "x");
  EXPECT_EQ(*late->Get("n", absl::Seconds(1)), "2");
}

TEST_F(EtcdStoreTest, AnUnreachableEtcdIsUnavailableNamingItsAddress) {
  std::unique_ptr<Store> store = MustConnect(etcd_->Url("job"));
  ASSERT_NE(store, nullptr);
  etcd_->Stop();
  absl::StatusOr<std::string> get = store->Get("k", absl::Milliseconds(300));
  EXPECT_EQ(get.status().code(), absl::StatusCode::kUnavailable) << get.status();
  EXPECT_NE(get.status().message().find("cannot reach etcd at " + etcd_->endpoint()), std::string::npos)
      << get.status();
  EXPECT_NE(get.status().message().find("etcdctl --endpoints="), std::string::npos) << get.status();
  absl::StatusOr<std::unique_ptr<Store>> gone = ConnectStore(etcd_->Url("job"), absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable) << gone.status();
  EXPECT_NE(gone.status().message().find(etcd_->endpoint()), std::string::npos) << gone.status();
}

TEST(EtcdStoreForeignTest, AServerThatIsNotEtcdIsRefused) {
  absl::StatusOr<std::unique_ptr<StoreServer>> builtin = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  const std::string url = absl::StrCat("etcd://", (*builtin)->address(), "/job");
  absl::StatusOr<std::unique_ptr<Store>> store = ConnectStore(url, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_NE(store.status().message().find("not as etcd"), std::string::npos) << store.status();
  (*builtin)->Shutdown();
}

}  // namespace
}  // namespace gw::rpc::internal
