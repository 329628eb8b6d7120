// Internal: the options an agent starts with, resolved and checked before any unit
// exists (AgentOptions::FromEnv, which reads them from a launcher's variables, is in
// agent_options.cc too).
//
// Contract
//   - ResolveOptions(options): a worker that joins gets rank -1 (the group gives it one);
//     max_world_size 0 becomes world_size; the secret and TLS files not given come from
//     the environment (Security::FromEnv). INVALID_ARGUMENT for a rank outside
//     [0, world_size), a max_world_size below world_size or above GlobalId::kMaxRanks, a
//     peer_timeout under twice a positive heartbeat_interval, or bad TLS files;
//     FAILED_PRECONDITION, saying how to give one, for a group that may have more than
//     one worker and authenticates with no secret. Each message names the worker.
//     GRADWIRE_TRACE sets trace_dir, GRADWIRE_STALL_REPORT (seconds) stall_report_after.
//   - MetricsFromEnv(options): the metrics endpoint this worker serves
//     (metrics_endpoint.h), once its rank is known: GRADWIRE_METRICS_PORT, else
//     GRADWIRE_METRICS_PORT_BASE (port = base + rank), else options.metrics_port; nullopt
//     when that is -1; host GRADWIRE_METRICS_HOST, else options.metrics_host (127.0.0.1
//     when empty); off loopback, in a job that authenticates,
//     the job's metrics token is asked. INVALID_ARGUMENT, naming the variable, for a value
//     that is not a port.
#ifndef GRADWIRE_RPC_SRC_AGENT_OPTIONS_H_
#define GRADWIRE_RPC_SRC_AGENT_OPTIONS_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradwire/rpc/metrics_endpoint.h"
#include "gradwire/rpc/worker.h"

namespace gw::rpc::internal {

absl::Status ResolveOptions(AgentOptions& options);
absl::StatusOr<std::optional<MetricsEndpointOptions>> MetricsFromEnv(const AgentOptions& options);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_AGENT_OPTIONS_H_
