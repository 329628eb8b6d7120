// Unit: host_address.h — host:port parsing, loopback and wildcard hosts, and the local
// address that reaches a host (here only loopback: the tests of multi_host_test.cc look
// across simulated hosts).
#include "transport/host_address.h"

#include <gtest/gtest.h>

namespace gw::rpc::internal {
namespace {

TEST(HostAddressTest, SplitsAndJoinsHostPortBracketingIpv6) {
  absl::StatusOr<HostPort> v4 = SplitHostPort("10.0.0.1:29500");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "10.0.0.1");
  EXPECT_EQ(v4->port, 29500);
  absl::StatusOr<HostPort> v6 = SplitHostPort("[fd00::2]:80");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "fd00::2");
  EXPECT_EQ(JoinHostPort(v6->host, v6->port), "[fd00::2]:80");
  EXPECT_EQ(JoinHostPort("[::1]", 7), "[::1]:7");
  EXPECT_EQ(JoinHostPort("node-3", 7), "node-3:7");
  for (const char* bad : {"10.0.0.1", ":80", "host:port", "host:70000"}) {
    absl::StatusOr<HostPort> r = SplitHostPort(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status();
  }
}

TEST(HostAddressTest, KnowsLoopbackAndWildcardHosts) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "LocalHost", "::1", "[::1]", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"10.0.0.1", "0.0.0.0", "::", "fd00::1", "node-3", "128.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "::", "[::]"}) EXPECT_TRUE(IsWildcardHost(h)) << h;
  for (const char* h : {"127.0.0.1", "10.0.0.1", "localhost", "::1", ""}) EXPECT_FALSE(IsWildcardHost(h)) << h;
}

TEST(HostAddressTest, TheAddressThatReachesLoopbackIsLoopback) {
  absl::StatusOr<std::string> local = LocalAddressToward("127.0.0.1");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
  local = LocalAddressToward("localhost");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(IsLoopbackHost(*local)) << *local;
}

}  // namespace
}  // namespace gw::rpc::internal
