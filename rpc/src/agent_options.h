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
#ifndef GRADWIRE_RPC_SRC_AGENT_OPTIONS_H_
#define GRADWIRE_RPC_SRC_AGENT_OPTIONS_H_

#include "absl/status/status.h"
#include "gradwire/rpc/worker.h"

namespace gw::rpc::internal {

absl::Status ResolveOptions(AgentOptions& options);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_AGENT_OPTIONS_H_
