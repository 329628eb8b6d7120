// Internal: how `gradwire debug` and `gradwire top` see a running job from outside it:
// through the metrics endpoints of its workers (rpc/metrics_endpoint.h), found in the
// job's rendezvous store or given as ports.
//
// Contract
//   - FindEndpoints(where) lists the job's workers and their endpoints ("host:port"):
//     with where.store (the rendezvous: "HOST:PORT" of rank 0's store, or
//     "etcd://HOST:PORT/JOB") it reads the keys the workers publish (<run_id>/worker/<r>,
//     <run_id>/metrics/<r>), authenticated by the job secret (Security::FromEnv); with
//     where.metrics_port, workers 0..n-1 at metrics_host:port+k, named worker<k>.
//     A worker without an endpoint is listed with an empty one (it did not serve metrics).
//     UNAVAILABLE naming the store when it cannot be reached; NOT_FOUND when it holds no
//     worker of the run.
//   - ReadAll(endpoints, path, token, timeout) reads every endpoint's `path` at once (a
//     thread each), all within `timeout`: a frozen worker costs the timeout, not more.
//   - ParseMetrics(text) reads Prometheus' text format as a metrics endpoint writes it
//     (comments skipped; a line it cannot read is skipped too).
#ifndef GRADWIRE_WORKER_SRC_JOB_VIEW_H_
#define GRADWIRE_WORKER_SRC_JOB_VIEW_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/statistics.h"

namespace gw::worker {

struct JobAddress {
  std::string store;  // "HOST:PORT" or "etcd://HOST:PORT/JOB"; empty: use metrics_port
  std::string run_id = "gradwire";
  int metrics_port = 0;
  int workers = 0;
  std::string metrics_host = "127.0.0.1";
};

struct WorkerEndpoint {
  std::string worker = {};
  int rank = -1;
  std::string address = {};  // host:port of its metrics endpoint; empty: none
};

absl::StatusOr<std::vector<WorkerEndpoint>> FindEndpoints(const JobAddress& where, absl::Duration timeout);

std::vector<absl::StatusOr<std::string>> ReadAll(const std::vector<WorkerEndpoint>& endpoints, const std::string& path,
                                                 const std::string& token, absl::Duration timeout);

std::vector<rpc::Sample> ParseMetrics(const std::string& text);

}  // namespace gw::worker

#endif  // GRADWIRE_WORKER_SRC_JOB_VIEW_H_
