// Internal: the names of the parameter server's functions (server.cc, client.cc).
#ifndef GRADWIRE_PARAM_SERVER_SRC_WIRE_H_
#define GRADWIRE_PARAM_SERVER_SRC_WIRE_H_

#include "gradwire/dist_autograd/optimizer_value.h"

namespace gw::param_server {

// (table, shard values, optimizer, consistency, trainers, timeout_ms, staleness)
inline constexpr char kCreateFn[] = "__ps.create";
inline constexpr char kPullFn[] = "__ps.pull";      // (table, clock) -> shard values
inline constexpr char kPushFn[] = "__ps.push";      // (table, clock, trainer, shard gradient)
// ([table], clock, trainer, [shard gradient]) -> [shard values as of clock + 1]
inline constexpr char kPushPullManyFn[] = "__ps.push_pull_many";

using dist_autograd::ConfigFromValue;
using dist_autograd::ConfigToValue;

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_SRC_WIRE_H_
