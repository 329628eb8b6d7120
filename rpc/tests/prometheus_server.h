// PrometheusServer: a real Prometheus for tests (Debian's /usr/bin/prometheus, package
// prometheus, which scripts/setup-deps installs) that scrapes gradwire workers' metrics
// endpoints, and answers PromQL through its HTTP API.
//
// Contract
//   - Available() tells whether /usr/bin/prometheus exists; tests skip without it.
//   - Start(targets, bearer_token) writes a configuration that scrapes
//     127.0.0.1:<port>/metrics of each target every 250 ms (with "Authorization: Bearer
//     <token>" when one is given), starts Prometheus on a free loopback port with its own
//     data directory, and returns once /-/ready answers 200 (within 30 s); otherwise an
//     error with the tail of its log.
//   - Query(expr) is the value of a PromQL expression that yields one sample
//     (/api/v1/query): NOT_FOUND while it yields none, FAILED_PRECONDITION when it
//     yields several, and Prometheus' own error for a bad expression.
//   - AwaitValue(expr, value, timeout) re-queries every 100 ms until the value is
//     `value`; it returns the last answer (a value or an error) when that never happens.
//   - Targets() is /api/v1/targets' body: the scrapes' health and last errors, for
//     failure messages.
//   - The destructor kills Prometheus, reaps it and removes the directory. It dies with
//     the thread that started it. Not thread-safe.
#ifndef GRADWIRE_RPC_TESTS_PROMETHEUS_SERVER_H_
#define GRADWIRE_RPC_TESTS_PROMETHEUS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "child_process.h"

namespace gw::rpc::testing {

class PrometheusServer {
 public:
  static constexpr char kBinary[] = "/usr/bin/prometheus";
  static constexpr char kMissing[] =
      "/usr/bin/prometheus is missing: install Debian's prometheus (scripts/setup-deps does) to run this test";

  static bool Available();
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(const std::vector<int>& target_ports,
                                                                 const std::string& bearer_token = "");
  ~PrometheusServer();

  absl::StatusOr<double> Query(const std::string& expr) const;
  absl::StatusOr<double> AwaitValue(const std::string& expr, double value,
                                    absl::Duration timeout = absl::Seconds(30)) const;
  std::string Targets() const;

 private:
  PrometheusServer() = default;
  std::string dir_;
  int port_ = 0;
  ChildProcess process_;
};

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_PROMETHEUS_SERVER_H_
