// Client: a trainer's view of the parameter servers.
//
// Contract
//   - Client(agent, servers, trainer, trainers): `servers` are the worker names of the
//     server role, in shard order; `trainer` is this trainer's index in [0, trainers).
//   - CreateDense(name, initial, optimizer, consistency) splits `initial` (any shape,
//     float32) over the servers with ShardDense and creates the shards (idempotent, so
//     every trainer may call it with the same values).
//   - Pull(name, clock) returns the whole table (initial's shape) as of step `clock`
//     (kSync: after the pushes of clock-1 were applied); Push(name, clock, grad) sends
//     this trainer's gradient for step `clock`; PushPull does both and returns the table
//     as of clock+1, including this push (the server runs requests concurrently, so
//     outside kSync the pull is sent once the push is acknowledged); PushPullMany does it for several tables in one message per server.
//     One message per server each; shard buffers are views of `grad`
//     (no copy) and the pulled shards are assembled into one tensor.
//   - Errors name the server; futures complete on transport or pool threads.
#ifndef GRADWIRE_PARAM_SERVER_CLIENT_H_
#define GRADWIRE_PARAM_SERVER_CLIENT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/server.h"
#include "gradwire/param_server/sharding.h"
#include "gradwire/rpc/agent.h"

namespace gw::param_server {

class Client {
 public:
  Client(rpc::Agent& agent, std::vector<std::string> servers, int trainer, int trainers,
         absl::Duration sync_timeout = absl::Seconds(60));

  // `staleness` is the bound s of kBoundedStaleness (ignored otherwise).
  absl::Status CreateDense(const std::string& name, const Tensor& initial, const optim::OptimizerConfig& optimizer,
                           Consistency consistency, int64_t staleness = 0);
  Future<Tensor> Pull(const std::string& name, int64_t clock);
  Future<bool> Push(const std::string& name, int64_t clock, const Tensor& grad);
  Future<Tensor> PushPull(const std::string& name, int64_t clock, const Tensor& grad);
  // PushPull for several tables at once: one message to each server and one back.
  Future<std::vector<Tensor>> PushPullMany(const std::vector<std::string>& names, int64_t clock,
                                           const std::vector<Tensor>& grads);

  int trainer() const { return trainer_; }

 private:
  struct Table {
    Shape shape;
    std::vector<KeyRange> ranges;
    Consistency consistency = Consistency::kSync;
  };
  absl::StatusOr<Table> Find(const std::string& name) const;
  Future<Tensor> Assemble(const Table& table, std::vector<Future<Tensor>> shards) const;

  rpc::Agent& agent_;
  const std::vector<std::string> servers_;
  const int trainer_;
  const int trainers_;
  const absl::Duration sync_timeout_;
  mutable absl::Mutex mu_;
  std::map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_CLIENT_H_
