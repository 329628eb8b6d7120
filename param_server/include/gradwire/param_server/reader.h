// Reader: dense tables as the parameter servers hold them now, for a process that reads
// them without training: a model server following a running job (serve/follower.h), a
// monitor, an evaluation job.
//
// Contract
//   - Reader(agent, servers): `servers` are the worker names of the server role in shard
//     order, as the trainers' Client has them. A Reader creates no table, never pushes
//     and takes no trainer index, so it can never hold up a synchronous step.
//   - Read(tables, shapes) sends one ReadMessage to every server (in parallel): each
//     copies its shard of every table under the shard's lock, so a value is never read
//     while an update writes it. The shards are joined in server order (sharding.h) and
//     shaped as `shapes` (one per table); a table whose size is not its shape's:
//     INVALID_ARGUMENT naming both. A server that does not hold a table (not created yet,
//     or sparse): its NOT_FOUND / INVALID_ARGUMENT naming it. Other errors of a server
//     (dead, UNAVAILABLE) come back as they are; nothing is retried.
//   - Steps(tables) is Read without the values: one small message per server, for
//     deciding whether a Read is worth it.
//   - A TablesSnapshot's steps count updates applied (ParamState::step: one per
//     synchronous step, one per push of an asynchronous or bounded-staleness table).
//     steps[i] is the fewest any shard of table i has applied; `oldest` and `newest` span
//     every shard read. Shards are read at slightly different moments, so while trainers
//     run a synchronous job's shards can be a step apart: consistent() says whether every
//     shard was at the same step (a reader that needs one step reads again).
//   - LoadCheckpoint(path, tables, shapes) reads the same from a checkpoint (checkpoint.h):
//     `path` is one version's directory, or a checkpoint directory (its newest complete
//     version). The files are those of the version's manifest, in its shard order, each
//     checked against the manifest's size and CRC32C and its entries' checksums; a table
//     the manifest does not have is NOT_FOUND, a missing, damaged or foreign file (another
//     version's, another server's) an error naming it. steps are the shards' update
//     counts as saved.
//   - The agent must outlive the Reader and its futures. Thread-safe; futures complete
//     on transport or pool threads.
#ifndef GRADWIRE_PARAM_SERVER_READER_H_
#define GRADWIRE_PARAM_SERVER_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/future.h"
#include "gradwire/tensor/tensor.h"

namespace gw::param_server {

struct TablesSnapshot {
  std::vector<Tensor> values;   // per table, in the asked shape (empty for Steps)
  std::vector<int64_t> steps;   // per table: the fewest updates any of its shards applied
  int64_t oldest = 0;           // over every shard read
  int64_t newest = 0;
  bool consistent() const { return oldest == newest; }
};

class Reader {
 public:
  Reader(rpc::Agent& agent, std::vector<std::string> servers, absl::Duration timeout = absl::Seconds(30));

  Future<TablesSnapshot> Read(const std::vector<std::string>& tables, const std::vector<Shape>& shapes) const;
  Future<TablesSnapshot> Steps(const std::vector<std::string>& tables) const;

  static absl::StatusOr<TablesSnapshot> LoadCheckpoint(const std::string& path, const std::vector<std::string>& tables,
                                                       const std::vector<Shape>& shapes);

  const std::vector<std::string>& servers() const { return servers_; }

 private:
  Future<TablesSnapshot> Ask(const std::vector<std::string>& tables, const std::vector<Shape>* shapes) const;

  rpc::Agent& agent_;
  const std::vector<std::string> servers_;
  const absl::Duration timeout_;
};

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_READER_H_
