// Unit: what a worker counts about its calls (CallMetrics), the metrics endpoint that
// serves it (real HTTP on loopback), the agent's endpoint from the environment, and a
// real Prometheus scraping a running group.
#include "gradwire/rpc/metrics_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "child_process.h"
#include "etcd_server.h"
#include "gradwire/rpc/agent.h"
#include "observe/call_metrics.h"
#include "prometheus_server.h"
#include "samples.h"
#include "scoped_env.h"
#include "test_support.h"

namespace gw::rpc {
namespace {

using testing::AgentGroup;
using testing::HttpGet;
using testing::HttpResponse;
using testing::PrometheusServer;
using testing::SampleValue;
using testing::ScopedEnv;

// A listening socket on 127.0.0.1 (port 0: any); closed by the destructor.
class Listener {
 public:
  explicit Listener(int port = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof(a);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd_, 1) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    port_ = ntohs(a.sin_port);
  }
  ~Listener() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(MetricsExpositionTest, GroupsFamiliesAndNamesTheirTypes) {
  const std::vector<Sample> samples = {
      {"gradwire_a_total", {{"peer", "worker1"}}, 3},
      {"gradwire_lat_seconds_bucket", {{"le", "0.1"}}, 1},
      {"gradwire_depth", {}, 2},
      {"gradwire_a_total", {{"peer", "worker2"}}, 4},
      {"gradwire_lat_seconds_bucket", {{"le", "+Inf"}}, 2},
      {"gradwire_lat_seconds_sum", {}, 0.5},
      {"gradwire_lat_seconds_count", {}, 2},
      {"gradwire_other_count", {}, 7},  // not a histogram's: no _bucket of its base
  };
  EXPECT_EQ(ToExposition(samples),
            "# TYPE gradwire_a_total counter\n"
            "gradwire_a_total{peer=\"worker1\"} 3\n"
            "gradwire_a_total{peer=\"worker2\"} 4\n"
            "# TYPE gradwire_lat_seconds histogram\n"
            "gradwire_lat_seconds_bucket{le=\"0.1\"} 1\n"
            "gradwire_lat_seconds_bucket{le=\"+Inf\"} 2\n"
            "gradwire_lat_seconds_sum 0.5\n"
            "gradwire_lat_seconds_count 2\n"
            "# TYPE gradwire_depth gauge\n"
            "gradwire_depth 2\n"
            "# TYPE gradwire_other_count gauge\n"
            "gradwire_other_count 7\n");
}

TEST(LatencyHistogramTest, CountsEachObservationInItsBucketCumulatively) {
  internal::LatencyHistogram h;
  h.Observe(5e-6);   // <= 10 us
  h.Observe(10e-6);  // on a bound: that bucket (le is "less or equal")
  h.Observe(0.003);  // <= 5 ms
  h.Observe(60);     // above every bound: +Inf only
  std::vector<Sample> out;
  h.AppendTo(out, "x_seconds", {{"function", "f"}});
  ASSERT_EQ(out.size(), internal::LatencyHistogram::kBounds.size() + 3);
  EXPECT_EQ(SampleValue(out, "x_seconds_bucket", {{"le", "1e-05"}}), 2);
  EXPECT_EQ(SampleValue(out, "x_seconds_bucket", {{"le", "0.0025"}}), 2);
  EXPECT_EQ(SampleValue(out, "x_seconds_bucket", {{"le", "0.005"}}), 3);
  EXPECT_EQ(SampleValue(out, "x_seconds_bucket", {{"le", "10"}}), 3);
  EXPECT_EQ(SampleValue(out, "x_seconds_bucket", {{"le", "+Inf"}, {"function", "f"}}), 4);
  EXPECT_EQ(SampleValue(out, "x_seconds_count", {}), 4);
  EXPECT_NEAR(SampleValue(out, "x_seconds_sum", {}), 60.003015, 1e-9);
}

TEST(CallMetricsTest, CountsCallsErrorsBytesAndLatencyOnBothSides) {
  auto group = AgentGroup::Start(2, testing::RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  Agent& a = (*group)[0];
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(a.Sync<Tensor>("worker1", "add", Tensor::Ones({256}), Tensor::Ones({256})).ok());
  }
  EXPECT_FALSE(a.Sync<int64_t>("worker1", "fail", std::string("disk full")).ok());
  EXPECT_FALSE(a.Sync<int64_t>("worker1", "no_such_function").ok());

  const std::vector<Sample> client = a.statistics().Collect();
  const std::map<std::string, std::string> add = {{"function", "add"}, {"peer", "worker1"}};
  EXPECT_EQ(SampleValue(client, "gradwire_rpc_client_calls_total", add), 7);
  EXPECT_EQ(SampleValue(client, "gradwire_rpc_client_errors_total", add), 0);
  EXPECT_EQ(SampleValue(client, "gradwire_rpc_client_latency_seconds_count", add), 7);
  EXPECT_GT(SampleValue(client, "gradwire_rpc_client_latency_seconds_sum", add), 0);
  // Two 1 KiB tensors out, one back, each call.
  const double sent = SampleValue(client, "gradwire_rpc_client_sent_bytes_total", add);
  const double received = SampleValue(client, "gradwire_rpc_client_received_bytes_total", add);
  EXPECT_GE(sent, 7 * 2 * 1024);
  EXPECT_GE(received, 7 * 1024);
  EXPECT_LT(received, sent);
  const std::map<std::string, std::string> fail = {{"function", "fail"}, {"peer", "worker1"}};
  EXPECT_EQ(SampleValue(client, "gradwire_rpc_client_calls_total", fail), 1);
  EXPECT_EQ(SampleValue(client, "gradwire_rpc_client_errors_total", fail), 1);

  // The server counts the same calls, and the same bytes in the other direction.
  absl::StatusOr<std::vector<Sample>> server = a.StatisticsOf("worker1").Get(absl::Seconds(30));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::map<std::string, std::string> add_in = {{"function", "add"}, {"peer", "worker0"}};
  EXPECT_EQ(SampleValue(*server, "gradwire_rpc_server_calls_total", add_in), 7);
  EXPECT_EQ(SampleValue(*server, "gradwire_rpc_server_latency_seconds_count", add_in), 7);
  EXPECT_EQ(SampleValue(*server, "gradwire_rpc_server_received_bytes_total", add_in), sent);
  EXPECT_EQ(SampleValue(*server, "gradwire_rpc_server_sent_bytes_total", add_in), received);
  EXPECT_EQ(SampleValue(*server, "gradwire_rpc_server_errors_total", {{"function", "fail"}}), 1);
  // A function the server does not have is counted under one name, whatever the peer sends.
  EXPECT_EQ(SampleValue(*server, "gradwire_rpc_server_calls_total", {{"function", "(unknown)"}, {"peer", "worker0"}}),
            1);
  EXPECT_EQ(SampleValue(*server, "gradwire_rpc_server_calls_total", {{"function", "no_such_function"}}), -1);
}

TEST(MetricsEndpointTest, ServesTheStatisticsOverHttp) {
  Statistics statistics;
  Statistics::Source source = statistics.Add("test", [](std::vector<Sample>& out) {
    out.push_back({"gradwire_test_calls_total", {{"function", "f\"x"}}, 42});
  });
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(statistics, {});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  EXPECT_GT(port, 0);
  EXPECT_EQ((*endpoint)->url(), absl::StrCat("http://127.0.0.1:", port, "/metrics"));

  absl::StatusOr<HttpResponse> r = HttpGet(port, "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(absl::StrContains(r->head, "Content-Type: text/plain; version=0.0.4")) << r->head;
  EXPECT_EQ(r->body, "# TYPE gradwire_test_calls_total counter\ngradwire_test_calls_total{function=\"f\\\"x\"} 42\n");

  r = HttpGet(port, "/");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(absl::StrContains(r->body, "/metrics"));
  r = HttpGet(port, "/secrets");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);
  r = HttpGet(port, "/metrics", {}, "POST");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);
}

TEST(MetricsEndpointTest, KeepsAConnectionAliveAndDropsOversizedRequests) {
  Statistics statistics;
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(statistics, {});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  auto connect = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>((*endpoint)->port()));
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  };
  auto read_some = [](int fd) {
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  };
  // Two requests on one HTTP/1.1 connection: two answers.
  int fd = connect();
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(::write(fd, get.data(), get.size()), static_cast<ssize_t>(get.size()));
    EXPECT_TRUE(absl::StartsWith(read_some(fd), "HTTP/1.1 200")) << i;
  }
  ::close(fd);
  // Headers past 8 KiB: the connection is closed unanswered.
  fd = connect();
  const std::string huge = absl::StrCat("GET /metrics HTTP/1.1\r\nX-Pad: ", std::string(16 << 10, 'a'), "\r\n\r\n");
  (void)::write(fd, huge.data(), huge.size());
  EXPECT_EQ(read_some(fd), "");
  ::close(fd);
  // Serving goes on.
  absl::StatusOr<HttpResponse> r = HttpGet((*endpoint)->port(), "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
}

TEST(MetricsEndpointTest, AsksForTheJobsMetricsTokenWhenGivenOne) {
  Statistics statistics;
  MetricsEndpointOptions options;
  options.bearer_token = MetricsToken("the job's secret");
  EXPECT_EQ(options.bearer_token.size(), 64u);
  EXPECT_NE(options.bearer_token, MetricsToken("another secret"));
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(statistics, options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  absl::StatusOr<HttpResponse> r = HttpGet(port, "/metrics");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 401);
  EXPECT_TRUE(absl::StrContains(r->body, "gradwire secret --metrics-token")) << r->body;
  r = HttpGet(port, "/metrics", {"Authorization: Bearer " + MetricsToken("another secret")});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 401);
  r = HttpGet(port, "/metrics", {"Authorization: Bearer " + options.bearer_token});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
}

TEST(MetricsEndpointTest, APortInUseFailsNamingIt) {
  Listener taken;
  ASSERT_TRUE(taken.ok());
  Statistics statistics;
  MetricsEndpointOptions options;
  options.port = taken.port();
  options.owner = "worker3";
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(statistics, options);
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(endpoint.status().message());
  EXPECT_TRUE(absl::StrContains(
      message, absl::StrCat("worker3: the metrics endpoint cannot listen on 127.0.0.1:", taken.port())))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "in use")) << message;
  EXPECT_TRUE(absl::StrContains(message, "--metrics-port")) << message;

  options.port = 70000;
  endpoint = MetricsEndpoint::Start(statistics, options);
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument);
  options.port = 0;
  options.host = "192.0.2.1";  // TEST-NET: not this host's
  endpoint = MetricsEndpoint::Start(statistics, options);
  ASSERT_FALSE(endpoint.ok());
  EXPECT_TRUE(absl::StrContains(endpoint.status().message(), "192.0.2.1:0")) << endpoint.status();
}

TEST(AgentMetricsTest, EachWorkerServesItsOwnAtTheBasePlusItsRank) {
  absl::StatusOr<int> pair = testing::FreeLoopbackPortPair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  const int base = *pair;
  ScopedEnv env("GRADWIRE_METRICS_PORT_BASE", std::to_string(base).c_str());
  auto group = AgentGroup::Start(2, testing::RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE((*group)[1].Sync<Tensor>("worker0", "add", Tensor::Ones({2}), Tensor::Ones({2})).ok());
  absl::StatusOr<HttpResponse> r0 = HttpGet(base, "/metrics"), r1 = HttpGet(base + 1, "/metrics");
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_TRUE(absl::StrContains(r0->body, "gradwire_rpc_server_calls_total{function=\"add\",peer=\"worker1\"} 1"))
      << r0->body;
  EXPECT_TRUE(absl::StrContains(r1->body, "gradwire_rpc_client_calls_total{function=\"add\",peer=\"worker0\"} 1"))
      << r1->body;
  EXPECT_TRUE(absl::StrContains(r0->body, "# TYPE gradwire_rpc_client_latency_seconds histogram") ||
              absl::StrContains(r0->body, "# TYPE gradwire_rpc_server_latency_seconds histogram"));
  EXPECT_TRUE(absl::StrContains(r0->body, "gradwire_rpc_workers 2")) << r0->body;
}

TEST(AgentMetricsTest, AMetricsPortInUseStopsStartNamingIt) {
  Listener taken;
  ASSERT_TRUE(taken.ok());
  ScopedEnv env("GRADWIRE_METRICS_PORT", std::to_string(taken.port()).c_str());
  AgentOptions options;
  options.rendezvous = absl::StrCat("127.0.0.1:", *testing::FreeLoopbackPort());
  absl::StatusOr<std::shared_ptr<Agent>> agent = Agent::Start(options);
  ASSERT_FALSE(agent.ok());
  EXPECT_TRUE(
      absl::StrContains(agent.status().message(),
                        absl::StrCat("worker0: the metrics endpoint cannot listen on 127.0.0.1:", taken.port())))
      << agent.status();

  ScopedEnv bad("GRADWIRE_METRICS_PORT", "http");
  agent = Agent::Start(options);
  ASSERT_FALSE(agent.ok());
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(agent.status().message(), "GRADWIRE_METRICS_PORT=http is not a TCP port"))
      << agent.status();
}

// A real Prometheus scrapes both workers of a running group; the series it stores hold
// the calls the test made.
TEST(PrometheusTest, ScrapesARunningGroupAndHoldsItsCalls) {
  if (!PrometheusServer::Available()) GTEST_SKIP() << PrometheusServer::kMissing;
  absl::StatusOr<int> pair = testing::FreeLoopbackPortPair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  const int base = *pair;
  ScopedEnv env("GRADWIRE_METRICS_PORT_BASE", std::to_string(base).c_str());
  auto group = AgentGroup::Start(2, testing::RegisterTestFunctions);
  ASSERT_NE(group, nullptr);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*group)[0].Sync<Tensor>("worker1", "add", Tensor::Ones({4}), Tensor::Ones({4})).ok());
  }
  EXPECT_FALSE((*group)[0].Sync<int64_t>("worker1", "fail", std::string("disk full")).ok());

  absl::StatusOr<std::unique_ptr<PrometheusServer>> prometheus = PrometheusServer::Start({base, base + 1});
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();
  PrometheusServer& p = **prometheus;
  absl::StatusOr<double> up = p.AwaitValue("count(up == 1)", 2);
  ASSERT_TRUE(up.ok() && *up == 2) << (up.ok() ? absl::StrCat(*up) : up.status().ToString()) << "\n" << p.Targets();

  const std::string worker0 = absl::StrCat("instance=\"127.0.0.1:", base, "\"");
  const std::string worker1 = absl::StrCat("instance=\"127.0.0.1:", base + 1, "\"");
  auto expect = [&](const std::string& expr, double value) {
    absl::StatusOr<double> v = p.AwaitValue(expr, value);
    EXPECT_TRUE(v.ok() && *v == value) << expr << " = " << (v.ok() ? absl::StrCat(*v) : v.status().ToString());
  };
  expect(absl::StrCat("gradwire_rpc_client_calls_total{", worker0, ",function=\"add\",peer=\"worker1\"}"), 5);
  expect(absl::StrCat("gradwire_rpc_server_calls_total{", worker1, ",function=\"add\",peer=\"worker0\"}"), 5);
  expect(absl::StrCat("gradwire_rpc_client_errors_total{", worker0, ",function=\"fail\"}"), 1);
  expect(absl::StrCat("gradwire_rpc_server_latency_seconds_count{", worker1, ",function=\"add\"}"), 5);
  // Prometheus reads the buckets as a histogram: a quantile of them is a latency.
  absl::StatusOr<double> p50 = p.Query(absl::StrCat(
      "histogram_quantile(0.5, gradwire_rpc_client_latency_seconds_bucket{", worker0, ",function=\"add\"})"));
  ASSERT_TRUE(p50.ok()) << p50.status();
  EXPECT_GT(*p50, 0);
  EXPECT_LT(*p50, 10);
  expect(absl::StrCat("gradwire_rpc_workers{", worker1, "}"), 2);
}

}  // namespace
}  // namespace gw::rpc
