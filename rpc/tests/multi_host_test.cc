// Jobs across hosts: workers in different network namespaces (testing::HostNetwork, one
// per simulated host) find each other through the rendezvous store at MASTER_ADDR (or a
// real etcd on another host, GRADWIRE_RDZV),
// announce an address of their host that the others can dial, and send tensors over TCP,
// never through shared memory. Each worker is this binary re-run in a role (test_main.cc).
// Needs root and iproute2 (skipped otherwise; CI runs as root).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "etcd_server.h"
#include "host_network.h"

namespace gw::rpc {
namespace {

using gw::testing::HostNetwork;
using gw::testing::HostProcess;

constexpr absl::Duration kJobTimeout = absl::Seconds(60);

std::unique_ptr<HostNetwork> MakeNetwork(int hosts) {
  absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(hosts);
  EXPECT_TRUE(network.ok()) << network.status();
  return network.ok() ? *std::move(network) : nullptr;
}

struct PairCase {
  std::string name;
  int second_host;  // where rank 1 runs; rank 0 (which hosts the store) is on host 0
  std::map<std::string, std::string> env;
  bool same_host;
  // The workers meet through a real etcd on a third host (GRADWIRE_RDZV) instead of rank
  // 0's store: each then announces the address of its interface that reaches etcd.
  bool etcd = false;
};

void PrintTo(const PairCase& c, std::ostream* os) { *os << c.name; }

class HostPairTest : public ::testing::TestWithParam<PairCase> {};

TEST_P(HostPairTest, ALargeTensorGoesToTheOtherWorkerAndBack) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  const PairCase& c = GetParam();
  if (c.etcd && !testing::EtcdServer::Available()) GTEST_SKIP() << testing::EtcdServer::kMissing;
  char etcd_dir[] = "/tmp/gw-etcd-host-XXXXXX";  // removed after the network (and etcd) are gone
  std::unique_ptr<char, void (*)(char*)> remove_dir(c.etcd ? ::mkdtemp(etcd_dir) : nullptr, [](char* dir) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  });
  std::unique_ptr<HostNetwork> network = MakeNetwork(c.etcd ? 3 : 2);
  ASSERT_NE(network, nullptr);
  std::map<std::string, std::string> rendezvous = {{"MASTER_ADDR", network->address(0)}, {"MASTER_PORT", "29500"}};
  if (c.etcd) {
    ASSERT_NE(remove_dir.get(), nullptr);
    const std::string client = absl::StrCat("http://", network->address(2), ":2379");
    const std::string peer = absl::StrCat("http://", network->address(2), ":2380");
    absl::StatusOr<HostProcess*> etcd = network->Start(
        2, {testing::EtcdServer::kBinary, "--name=rdzv", absl::StrCat("--data-dir=", etcd_dir, "/data"),
            "--listen-client-urls=" + client, "--advertise-client-urls=" + client, "--listen-peer-urls=" + peer,
            "--initial-advertise-peer-urls=" + peer, "--initial-cluster=rdzv=" + peer});
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    // The workers wait for it to answer (their start_timeout).
    rendezvous = {{"GRADWIRE_RDZV", absl::StrCat("etcd://", network->address(2), ":2379/pair")}};
  }
  std::vector<HostProcess*> workers;
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, std::string> env = c.env;
    env.insert({{"GW_TEST_ROLE", "host_pair"}, {"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}});
    env.insert(rendezvous.begin(), rendezvous.end());
    absl::StatusOr<HostProcess*> p = network->Start(rank == 0 ? 0 : c.second_host, {"/proc/self/exe"}, env);
    ASSERT_TRUE(p.ok()) << p.status();
    workers.push_back(*p);
  }
  const std::vector<int> codes = HostNetwork::WaitAll(workers, absl::Now() + kJobTimeout);
  for (int rank = 0; rank < 2; ++rank) {
    const HostProcess& w = *workers[static_cast<size_t>(rank)];
    const HostProcess& peer = *workers[static_cast<size_t>(1 - rank)];
    const std::string host = network->address(rank == 0 ? 0 : c.second_host);
    EXPECT_EQ(codes[static_cast<size_t>(rank)], 0) << "rank " << rank << ":\n" << w.output();
    // Each announced an address of its own host, and the other dials exactly that.
    EXPECT_EQ(w.Field("address").rfind(host + ":", 0), 0u) << "rank " << rank << ":\n" << w.output();
    EXPECT_EQ(peer.Field("peer_address"), w.Field("address")) << peer.output();
    // Across hosts nothing goes through shared memory; on one host (the control) the
    // tensor and its echo do.
    EXPECT_EQ(w.Field("shared_memory_connections") != "0", c.same_host) << "rank " << rank << ":\n" << w.output();
    EXPECT_EQ(w.Field("shared_memory_tensors"), c.same_host ? "1" : "0") << "rank " << rank << ":\n" << w.output();
  }
  EXPECT_EQ(workers[1]->Field("echo"), "ok") << workers[1]->output();
}

INSTANTIATE_TEST_SUITE_P(
    Hosts, HostPairTest,
    ::testing::Values(
        // The defaults: each binds and announces the address that routes to MASTER_ADDR.
        PairCase{"TwoHostsByDefault", 1, {}, false},
        PairCase{"OneHostSharesMemory", 0, {}, true},
        // Bound to every interface, each announces the one that reaches the store.
        PairCase{"TwoHostsListeningOnAWildcardOverGrpc", 1,
                 {{"GRADWIRE_LISTEN", "0.0.0.0"}, {"GRADWIRE_TRANSPORT", "grpc"}}, false},
        PairCase{"TwoHostsOverTcp", 1, {{"GRADWIRE_TRANSPORT", "tcp"}}, false},
        PairCase{"TwoHostsMeetingThroughEtcdOnAThird", 1, {}, false, /*etcd=*/true}),
    [](const ::testing::TestParamInfo<PairCase>& info) { return info.param.name; });

// A host cut off mid-call (its cable pulled: no FIN, no RST, nothing arrives): the heartbeats
// declare its worker dead, the pending call fails with UNAVAILABLE naming it long before
// its own two-minute deadline, and the third host's worker is unaffected.
TEST(MultiHostTest, AHostCutOffMidCallIsDeclaredDeadByTheHeartbeats) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  std::unique_ptr<HostNetwork> network = MakeNetwork(3);
  ASSERT_NE(network, nullptr);
  std::vector<HostProcess*> workers;
  for (int rank = 0; rank < 3; ++rank) {
    absl::StatusOr<HostProcess*> p = network->Start(
        rank, {"/proc/self/exe"},
        {{"GW_TEST_ROLE", "partition"}, {"RANK", std::to_string(rank)}, {"WORLD_SIZE", "3"},
         {"MASTER_ADDR", network->address(0)}, {"MASTER_PORT", "29500"}});
    ASSERT_TRUE(p.ok()) << p.status();
    workers.push_back(*p);
  }
  ASSERT_EQ(workers[0]->AwaitField("connected", absl::Now() + kJobTimeout), "1") << workers[0]->output();
  ASSERT_TRUE(network->SetLink(1, /*up=*/false).ok());
  const absl::Time cut = absl::Now();
  const std::string failed_at = workers[0]->AwaitField("failed_at_unix_ms", absl::Now() + absl::Minutes(3));
  ASSERT_FALSE(failed_at.empty()) << workers[0]->output();
  workers[1]->Kill();
  const std::vector<int> codes = HostNetwork::WaitAll({workers[0], workers[2]}, absl::Now() + kJobTimeout);
  EXPECT_EQ(codes[0], 0) << workers[0]->output();
  EXPECT_EQ(codes[1], 0) << workers[2]->output();
  EXPECT_EQ(workers[0]->Field("call_code"), "UNAVAILABLE") << workers[0]->output();
  EXPECT_NE(workers[0]->Field("call_error").find("worker1 (rank 1) is unavailable: declared dead by worker0"),
            std::string::npos)
      << workers[0]->output();
  EXPECT_EQ(workers[0]->Field("other"), "worker2") << workers[0]->output();
  int64_t failed_ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(failed_at, &failed_ms));
  std::printf("cut-off host reported after %s (default heartbeats)\n",
              absl::FormatDuration(absl::FromUnixMillis(failed_ms) - cut).c_str());
}

// FromEnv's default on a host that is not the master's: the address of the interface
// that reaches MASTER_ADDR; without a route there, an error that says what to set.
TEST(MultiHostTest, FromEnvPicksTheAddressThatReachesMasterAddrOrSaysWhatToSet) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  std::unique_ptr<HostNetwork> network = MakeNetwork(2);
  ASSERT_NE(network, nullptr);
  auto options = [&](const std::string& master_addr, const std::map<std::string, std::string>& extra = {}) {
    std::map<std::string, std::string> env = extra;
    env.insert({{"GW_TEST_ROLE", "options"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", master_addr},
                {"MASTER_PORT", "29500"}});
    absl::StatusOr<HostProcess*> p = network->Start(1, {"/proc/self/exe"}, env);
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) HostNetwork::WaitAll({*p}, absl::Now() + kJobTimeout);
    return p.ok() ? *p : nullptr;
  };
  const HostProcess* out = options(network->address(0));
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->Field("listen"), network->address(1)) << out->output();
  EXPECT_EQ(out->Field("advertise"), "") << out->output();
  out = options("127.0.0.1");  // a local job stays on loopback
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->Field("listen"), "127.0.0.1") << out->output();
  out = options("198.51.100.1");  // no route from this host
  ASSERT_NE(out, nullptr);
  for (const char* says : {"MASTER_ADDR=198.51.100.1", "GRADWIRE_LISTEN", "GRADWIRE_ADVERTISE"}) {
    EXPECT_NE(out->Field("error").find(says), std::string::npos) << out->output();
  }
  out = options("198.51.100.1", {{"GRADWIRE_ADVERTISE", "203.0.113.9"}});  // told: no route needed
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->Field("listen"), "0.0.0.0") << out->output();
  EXPECT_EQ(out->Field("advertise"), "203.0.113.9") << out->output();
}

}  // namespace
}  // namespace gw::rpc
