// ParameterServer: the server role, hosting shards of named dense tables.
//
// Contract
//   - ParameterServer::Install(agent) in Agent::Start's setup registers the server's
//     functions ("__ps.*") on that agent; the Client (client.h) calls them.
//   - A table shard holds a contiguous key range of a flat float32 table, a functional
//     optimizer of optim/ with its per-shard state, and a consistency mode:
//       kSync     a step's pushes from all `trainers` are summed and averaged, then
//                 applied once; a pull for clock c waits until step c-1 was applied. If
//                 the step is not complete within `sync_timeout` the waiting pulls and
//                 pushes fail with DEADLINE_EXCEEDED naming the trainers that did not push.
//       kAsync    every push is applied when it arrives; pulls never wait.
//       kBoundedStaleness(s)  pushes apply on arrival; a trainer's clock is the number
//                 of pushes it made; a pull for clock c waits until every trainer has
//                 reached c - s (then fails after `sync_timeout` naming the slow ones).
//   - Creating a table that exists with the same shape is a no-op (every trainer may
//     create it); a different shape is an error.
//   - Thread-safe; pulls and pushes of different tables never wait for each other.
#ifndef GRADWIRE_PARAM_SERVER_SERVER_H_
#define GRADWIRE_PARAM_SERVER_SERVER_H_

#include <memory>

#include "absl/status/status.h"
#include "gradwire/rpc/agent.h"

namespace gw::param_server {

enum class Consistency { kSync = 0, kAsync = 1, kBoundedStaleness = 2 };

class ParameterServer {
 public:
  static absl::StatusOr<std::shared_ptr<ParameterServer>> Install(rpc::Agent& agent);
  ~ParameterServer();

  // Tables and shards hosted here (for tests and metrics).
  size_t num_shards() const;

  class Impl;

 private:
  explicit ParameterServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_SERVER_H_
