// Unit: testing::HostNetwork (host_network.h), the simulated hosts of the multi-host
// tests: hosts reach each other through the bridge from their own addresses, loopback
// works in each, and nothing is left behind — neither by a network that goes out of
// scope nor, after the next Create's sweep, by a run that was killed. Needs root and
// iproute2 (skipped otherwise; CI runs as root).
#include "host_network.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace gw::testing {
namespace {

bool NamespaceExists(const std::string& name) { return std::filesystem::exists("/run/netns/" + name); }

TEST(HostNetworkTest, ThreeHostsReachEachOtherThroughTheBridgeFromTheirOwnAddresses) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(3);
  ASSERT_TRUE(network.ok()) << network.status();
  struct Probe {
    int from;
    std::string to;
  };
  // Nothing listens on port 9: "refused" means the SYN arrived and the RST came back.
  const Probe probes[] = {{0, (*network)->address(1)}, {2, (*network)->address(0)}, {1, (*network)->address(2)},
                          {1, "127.0.0.1"}};
  for (const Probe& p : probes) {
    absl::StatusOr<HostProcess*> probe = (*network)->Start(
        p.from, {"/proc/self/exe"}, {{"GW_TEST_ROLE", "probe"}, {"PROBE_ADDR", p.to}, {"PROBE_PORT", "9"}});
    ASSERT_TRUE(probe.ok()) << probe.status();
    EXPECT_EQ(HostNetwork::WaitAll({*probe}, absl::Now() + absl::Seconds(30)), std::vector<int>{0});
    EXPECT_EQ((*probe)->Field("connect"), "refused") << "host " << p.from << " -> " << p.to << ":\n"
                                                     << (*probe)->output();
    EXPECT_EQ((*probe)->Field("local"), p.to == "127.0.0.1" ? p.to : (*network)->address(p.from))
        << (*probe)->output();
  }
}

TEST(HostNetworkTest, LeavesNothingBehindAndSweepsWhatAKilledRunLeft) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  // What a run killed with SIGKILL leaves: a namespace and a log folder named after its
  // (now dead) pid.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string stale = absl::StrCat("gwhost-", dead, "-0");
  ASSERT_EQ(std::system(absl::StrCat("PATH=$PATH:/usr/sbin:/sbin ip netns add ", stale, "-h0").c_str()), 0);
  ASSERT_TRUE(std::filesystem::create_directory("/tmp/" + stale));

  std::vector<std::string> made;
  pid_t sleeper = 0;
  {
    absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(2);
    ASSERT_TRUE(network.ok()) << network.status();
    EXPECT_FALSE(NamespaceExists(stale + "-h0"));
    EXPECT_FALSE(std::filesystem::exists("/tmp/" + stale));
    made = (*network)->namespaces();
    ASSERT_EQ(made.size(), 3u);  // two hosts and the switch
    for (const std::string& name : made) EXPECT_TRUE(NamespaceExists(name)) << name;
    // A process still running when the network goes keeps nothing alive.
    absl::StatusOr<HostProcess*> p = (*network)->Start(1, {"/bin/sleep", "600"});
    ASSERT_TRUE(p.ok()) << p.status();
    sleeper = (*p)->pid();
  }
  for (const std::string& name : made) EXPECT_FALSE(NamespaceExists(name)) << name;
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat("/proc/", sleeper)));
}

}  // namespace
}  // namespace gw::testing
