// `gradwire launch --nnodes 2 --node-rank K` on two simulated hosts (testing::HostNetwork:
// network namespaces on a bridge), as a user runs one launcher per machine: the data-
// parallel example with one replica per host, so its process group (and every DDP
// allreduce) goes between the hosts over TCP, after the agents met at rank 0's
// rendezvous on host 0. Both launchers must exit 0 and the replicas must reach the
// required accuracy. Needs root and iproute2 (skipped otherwise; CI runs as root).
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "host_network.h"

namespace gw::examples {
namespace {

using testing::HostNetwork;
using testing::HostProcess;

TEST(LaunchAcrossHostsTest, DataParallelReplicasOnTwoHostsUnderOneLauncherEach) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(2);
  ASSERT_TRUE(network.ok()) << network.status();
  std::vector<HostProcess*> launchers;
  for (int node = 0; node < 2; ++node) {
    absl::StatusOr<HostProcess*> p = (*network)->Start(
        node,
        {GRADWIRE_CLI, "launch", "--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr",
         (*network)->address(0), "--master-port", "29501", "-n", "1", DDP_FASHION_MNIST, "--epochs=1",
         "--min_accuracy=0.80"},
        {{"OMP_NUM_THREADS", "1"}});  // the two "machines" share this one's cores
    ASSERT_TRUE(p.ok()) << p.status();
    launchers.push_back(*p);
  }
  const std::vector<int> codes = HostNetwork::WaitAll(launchers, absl::Now() + absl::Seconds(240));
  for (int node = 0; node < 2; ++node) {
    const std::string out = launchers[static_cast<size_t>(node)]->output();
    EXPECT_EQ(codes[static_cast<size_t>(node)], 0) << "node " << node << ":\n" << out;
    EXPECT_NE(out.find(absl::StrCat("node ", node, " of 2: starting ranks ", node, "-", node, " of 2")),
              std::string::npos)
        << out;
  }
  // Replica 0 (worker0, on node 0) reports what the two replicas reached together.
  EXPECT_NE(launchers[0]->output().find("[worker0] final test accuracy"), std::string::npos) << launchers[0]->output();
  EXPECT_NE(launchers[0]->output().find("over 2 replicas"), std::string::npos) << launchers[0]->output();
}

}  // namespace
}  // namespace gw::examples
