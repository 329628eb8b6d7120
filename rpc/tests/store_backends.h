// StoreBackendTest: the fixture of suites that run over both rendezvous stores
// (store_test.cc, rendezvous_test.cc): the built-in StoreServer, and a real etcd
// (etcd_server.h; the etcd cases skip when /usr/bin/etcd is missing).
//
//   class MyTest : public StoreBackendTest {};
//   TEST_P(MyTest, ...) { auto store = ConnectStore(address(), ...); }
//   INSTANTIATE_TEST_SUITE_P(Stores, MyTest, kBothStores, StoreBackendName);
//
// address() is the store's address in the backend's form ("127.0.0.1:PORT" or
// "etcd://127.0.0.1:PORT/test"); nothing_at(FreeLoopbackPort()) an address of the same
// form where no store answers. Each test gets a fresh store.
#ifndef GRADWIRE_RPC_TESTS_STORE_BACKENDS_H_
#define GRADWIRE_RPC_TESTS_STORE_BACKENDS_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "etcd_server.h"
#include "gradwire/rpc/store.h"

namespace gw::rpc::testing {

enum class StoreBackend { kBuiltIn, kEtcd };

inline const auto kBothStores = ::testing::Values(StoreBackend::kBuiltIn, StoreBackend::kEtcd);

inline std::string StoreBackendName(const ::testing::TestParamInfo<StoreBackend>& info) {
  return info.param == StoreBackend::kEtcd ? "Etcd" : "BuiltIn";
}

class StoreBackendTest : public ::testing::TestWithParam<StoreBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == StoreBackend::kEtcd) {
      if (!EtcdServer::Available()) GTEST_SKIP() << EtcdServer::kMissing;
      absl::StatusOr<std::unique_ptr<EtcdServer>> etcd = EtcdServer::Start();
      ASSERT_TRUE(etcd.ok()) << etcd.status();
      etcd_ = *std::move(etcd);
      address_ = etcd_->Url("test");
    } else {
      absl::StatusOr<std::unique_ptr<StoreServer>> server = StoreServer::Start("127.0.0.1", 0);
      ASSERT_TRUE(server.ok()) << server.status();
      server_ = *std::move(server);
      address_ = server_->address();
    }
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  const std::string& address() const { return address_; }
  std::string nothing_at(int free_port) const {
    const std::string host_port = "127.0.0.1:" + std::to_string(free_port);
    return GetParam() == StoreBackend::kEtcd ? "etcd://" + host_port + "/test" : host_port;
  }
  std::unique_ptr<Store> Connect() {
    absl::StatusOr<std::unique_ptr<Store>> store = ConnectStore(address_, absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  std::unique_ptr<EtcdServer> etcd_;
  std::unique_ptr<StoreServer> server_;
  std::string address_;
};

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_STORE_BACKENDS_H_
