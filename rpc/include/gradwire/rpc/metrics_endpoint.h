// MetricsEndpoint: a worker's Statistics (statistics.h) served over HTTP in Prometheus'
// text format, for Prometheus to scrape and for `curl host:port/metrics`.
//
// Contract
//   - Start(statistics, options) listens on options.host:options.port (port 0: one the
//     OS picks; port() says which) and serves, on its own thread (Boost.Beast):
//       GET /metrics   statistics.Collect() as ToExposition writes it
//                      (Content-Type: text/plain; version=0.0.4);
//       GET /waits     what this worker waits for (waits.h) as WaitsToJson writes it,
//                      when Start was given its Waits;
//       GET /          a line saying where the metrics are;
//     404 for another path, 405 for another method, 401 without the bearer token when
//     one is asked. Connections are kept alive as HTTP/1.1 asks; a request must arrive
//     within 10 s of the last and fit in 8 KiB; at most 64 connections are open at once
//     (more are closed at once).
//   - An address in use, or one that is not this host's, fails Start with
//     FAILED_PRECONDITION naming host:port and saying what to do; nothing is left open.
//   - Security (the threat model, README): the endpoint binds loopback (127.0.0.1) by
//     default, so only this host's processes reach it. Bound to another address, it asks
//     every request for "Authorization: Bearer <MetricsToken(secret)>" when the job has a
//     secret: a token derived from the job secret that grants reading metrics and
//     nothing else (it cannot authenticate a worker). It serves plain HTTP: bound beyond
//     loopback without TLS, its metrics and token cross the network readable.
//   - The destructor stops serving, closes every connection and joins the thread. The
//     Statistics must outlive the endpoint.
//   - ToExposition(samples): Prometheus' text exposition format 0.0.4: samples grouped by
//     family, each family once, with a "# TYPE" line: counter for names ending in _total,
//     histogram for families of _bucket/_sum/_count samples, gauge otherwise.
//   - Agent::Start serves one for its worker when GRADWIRE_METRICS_PORT (this worker's
//     port) or GRADWIRE_METRICS_PORT_BASE (port = base + rank, as `gradwire launch
//     --metrics-port` sets it) is in the environment, on GRADWIRE_METRICS_HOST (default
//     127.0.0.1); a port it cannot take fails Start.
#ifndef GRADWIRE_RPC_METRICS_ENDPOINT_H_
#define GRADWIRE_RPC_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/statistics.h"
#include "gradwire/rpc/waits.h"

namespace gw::rpc {

struct MetricsEndpointOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // Asked of every request as "Authorization: Bearer <token>"; empty: none asked.
  std::string bearer_token;
  // Names the endpoint in errors and on its thread ("worker1"), and its rank in /waits.
  std::string owner = "gradwire";
  int rank = -1;
};

class MetricsEndpoint {
 public:
  // `waits` (optional) must outlive the endpoint, as `statistics`.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const Statistics& statistics,
                                                                MetricsEndpointOptions options,
                                                                const Waits* waits = nullptr);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const;
  // "http://host:port/metrics"
  std::string url() const;

 private:
  struct Impl;
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The bearer token of a job's metrics endpoints: hex of HMAC-SHA256(secret, a fixed label).
std::string MetricsToken(const std::string& secret);

std::string ToExposition(const std::vector<Sample>& samples);

// What a worker's endpoint serves at `path` ("/metrics", "/waits"): GET
// http://<address>/<path> (address "host:port"), with the bearer token when not empty,
// within `timeout`. The body of a 200 answer; otherwise UNAVAILABLE (nothing answered in
// time), UNAUTHENTICATED (401) or UNKNOWN (another status), each naming the URL.
absl::StatusOr<std::string> ReadEndpoint(const std::string& address, const std::string& path,
                                         const std::string& bearer_token, absl::Duration timeout);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_METRICS_ENDPOINT_H_
