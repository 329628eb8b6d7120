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
//     outside kSync the pull is sent once the push is acknowledged); PushPullMany does it for several tables in one
//     message per server. One message per server each; shard buffers are views of `grad` (no copy) and the pulled
//     shards are assembled into one tensor.
//   - CreateSparse(name, dim, options, optimizer, consistency) creates an embedding-style
//     table of rows keyed by 64-bit ids on every server (each holds the ids IdPlacement
//     gives it). PullRows(name, clock, ids) returns rows [n, dim] in the order of `ids`
//     (int64 [n], duplicates allowed, unknown ids created from options.init); PushRows
//     sends gradient rows [n, dim] for `ids` (duplicates are summed on the server). Ids
//     are split by server, one message per server; under kSync and kBoundedStaleness
//     every server gets this trainer's push (maybe empty) so that its step completes,
//     and every server is asked by a pull (maybe for no rows, `ids` may be empty), so
//     that a pull at `clock` returns once step clock-1 is complete on all of them.
//     (SparseEmbedding, sparse_embedding.h, does both inside an autograd graph.)
//   - GPU trainers: gradients, ids and gradient rows may be GPU tensors. They cross to the
//     servers through host memory (the agent stages dense tensors; sparse ids and rows are
//     copied to the host for the split); what comes back is on the CPU (the agent's device
//     maps can put it on a GPU), and CopyInPlace takes it into GPU parameters.
//   - Elastic trainers: the table's creators are trainers 0 .. trainers-1; another
//     (its index unused so far, e.g. a worker that joined the job) calls Join(name) after
//     CreateDense/CreateSparse (which find the table as it is) and gets the clock it takes
//     part from: it pulls that clock, then pushes it and on. Asynchronous and
//     bounded-staleness tables take it at once (a bounded-staleness trainer starts at the
//     furthest trainer's clock, so it holds nobody back); a synchronous table at a step
//     boundary: the first step no push of which was counted on any server yet, from
//     which on every step is the mean over the trainers taking part. Leave(name,
//     last_clock) takes this trainer out after its push at last_clock (-1: it pushed
//     none): later steps and pulls stop waiting for it. Join and Leave are idempotent
//     (a retry changes nothing). Join(names) joins several tables at one clock.
//   - Re-sharding: Reshard(name, new_servers) moves a table onto other servers (added,
//     removed, or both: e.g. a server that joined the job, rpc agent.h) while trainers
//     keep training. Every old shard is frozen at one clock (the steps before it complete,
//     pushes of later clocks are refused with ABORTED), its data, optimizer state and
//     clocks are cut again (dense: the key ranges of ShardDense over the new servers;
//     sparse: consistent hashing, IdPlacement, so adding a server moves about 1/(S+1) of
//     the rows and removing one only its own), the new shards are put in place beside the
//     old, and the new layout (servers and an epoch, bumped each time) is written to the
//     store (the commit), after which the new shards take over and the servers no longer
//     in it let the table go. Every request carries the layout's epoch; one refused
//     because the table is frozen or moved is sent again by the client, split by the
//     layout it then reads from the store (Pull, Push, PushPull, PushPullMany, PullRows,
//     PushRows wait so at most sync_timeout). So no acknowledged push is lost and, under
//     kSync and kBoundedStaleness, none counts twice (a kAsync push refused by one server
//     and applied by another applies again there: at least once, as with reconnection).
//     A failure before the commit thaws the old layout (an error says where it failed);
//     concurrent Reshards of one table are not supported; a coordinator that dies midway
//     leaves the table frozen (its trainers' requests fail after sync_timeout): running
//     Reshard again completes it (a frozen shard may be frozen again, an imported one
//     replaced). The next checkpoint holds the new layout (see Checkpoints). Run it from a worker that is
//     not blocked on the table's steps (not from a synchronous trainer between its own
//     push and pull). CreateDense/CreateSparse of a table that was re-sharded finds it
//     in its current layout.
//   - Checkpoints (checkpoint.h): Checkpoint() cuts a version of every table of every
//     server this client knows (the servers it was given and those of its tables) at one
//     step, and completes once the version is complete on every server (its manifest
//     written), with the version, its step and its files. Its first phase (planning and
//     registering the cut) runs before it returns, so a trainer may call it right before
//     pushing a step. With ClientOptions::checkpoint_every, a push (Push, PushPull,
//     PushPullMany, PushRows) starts one when the period has passed and none is under
//     way; after checkpoint_max_failures failed ones in a row the pushes fail with the
//     last failure (the job stops instead of training on without checkpoints). One
//     client of a job should cut (trainer 0's in the examples); a job's final checkpoint
//     is Checkpoint() after its last step. Resume() says which version the servers
//     restored (version 0: none; FAILED_PRECONDITION naming them when they differ): a
//     trainer continues from its step. Each cut first reads the tables' layouts from the
//     store, so a version after a re-sharding holds the tables where they are (until the
//     next cut, a restart brings back the layout of the version before it). The files of
//     CheckpointInfo are in the order of the servers' names.
//   - The same tables through distributed autograd: ShardRRefs(name) returns a dense
//     table's shards as RRefs owned by the servers (one per server, in server order; the
//     owned tensor shares the shard's storage and requires grad). FetchDense(name,
//     shards) inside a dist_autograd Context fetches them (ToHere) and assembles the
//     table's shape; after ctx.Backward the gradients are on the servers, and a
//     DistributedOptimizer created over the shard RRefs updates the tables in place,
//     where Pull sees them. That path applies updates as DistributedOptimizer does
//     (per-parameter lock, its own optimizer state), outside the table's consistency
//     mode: use one path or the other for a table at a time.
//   - Reconnection (ClientOptions::reconnect_timeout > 0): a call that fails with
//     UNAVAILABLE (the server is dead, restarting, or its connection dropped) is retried
//     by the agent's retry policy (rpc/retry.h: backoff from 50 ms to 1 s on the agent's
//     TimerQueue, no thread sleeps) until the server is back or the timeout passes; a
//     retried pull first sends this trainer's last push of that table to that server
//     again (a restarted server may have lost it), and the server counts each (trainer,
//     clock) once under kSync and kBoundedStaleness (server.h); a kAsync table applies a
//     retried push again (at least once: no acknowledged push is lost). The agent re-reads a
//     restarted server's address from the store. Other errors are not retried.
//   - The agent must outlive the Client, and the Client the futures it returned.
//   - Errors name the server; futures complete on transport or pool threads.
#ifndef GRADWIRE_PARAM_SERVER_CLIENT_H_
#define GRADWIRE_PARAM_SERVER_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/checkpoint.h"
#include "gradwire/param_server/row_store.h"
#include "gradwire/param_server/server.h"
#include "gradwire/param_server/sharding.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/statistics.h"

namespace gw::param_server {
namespace internal {
class Checkpointer;
}  // namespace internal

struct ClientOptions {
  absl::Duration sync_timeout = absl::Seconds(60);  // how long a server waits for a step (and a checkpoint for its files)
  absl::Duration reconnect_timeout = absl::ZeroDuration();  // 0: UNAVAILABLE fails at once
  absl::Duration checkpoint_every = absl::ZeroDuration();  // pushes cut a checkpoint each period (0: never)
  int checkpoint_max_failures = 3;  // failed checkpoints in a row that fail the pushes (0: never)
};

// Layout of a sparse table (CreateSparse).
struct SparseOptions {
  RowInit init;          // rows start from this (seeded, per id)
  int64_t capacity = 0;  // rows per server, least recently used evicted beyond it (0: unbounded)
};

class Client {
 public:
  Client(rpc::Agent& agent, std::vector<std::string> servers, int trainer, int trainers,
         ClientOptions options);
  Client(rpc::Agent& agent, std::vector<std::string> servers, int trainer, int trainers,
         absl::Duration sync_timeout = absl::Seconds(60))
      : Client(agent, std::move(servers), trainer, trainers, ClientOptions{.sync_timeout = sync_timeout}) {}

  // `staleness` is the bound s of kBoundedStaleness (ignored otherwise).
  absl::Status CreateDense(const std::string& name, const Tensor& initial, const optim::OptimizerConfig& optimizer,
                           Consistency consistency, int64_t staleness = 0);
  Future<Tensor> Pull(const std::string& name, int64_t clock);
  Future<bool> Push(const std::string& name, int64_t clock, const Tensor& grad);
  Future<Tensor> PushPull(const std::string& name, int64_t clock, const Tensor& grad);
  // PushPull for several tables at once: one message to each server and one back.
  Future<std::vector<Tensor>> PushPullMany(const std::vector<std::string>& names, int64_t clock,
                                           const std::vector<Tensor>& grads);

  absl::Status CreateSparse(const std::string& name, int64_t dim, const SparseOptions& options,
                            const optim::OptimizerConfig& optimizer, Consistency consistency, int64_t staleness = 0);
  Future<Tensor> PullRows(const std::string& name, int64_t clock, const Tensor& ids);
  Future<bool> PushRows(const std::string& name, int64_t clock, const Tensor& ids, const Tensor& grad);
  // The row width of a sparse table this client created.
  absl::StatusOr<int64_t> RowDim(const std::string& name) const;

  absl::StatusOr<int64_t> Join(const std::string& name);
  absl::Status Leave(const std::string& name, int64_t last_clock);

  absl::Status Reshard(const std::string& name, const std::vector<std::string>& new_servers);
  // The servers that hold table `name` now (the store's layout; the servers this client
  // was given while it was never re-sharded).
  absl::StatusOr<std::vector<std::string>> ServersOf(const std::string& name) const;
  // Join for several tables at one clock (a trainer that pushes them together).
  absl::StatusOr<int64_t> Join(const std::vector<std::string>& names);

  Future<CheckpointInfo> Checkpoint();
  // The most recent checkpoint this client started (a periodic one too): wait on it before
  // reading the directory. NOT_FOUND when it started none.
  Future<CheckpointInfo> LastCheckpoint() const;
  absl::StatusOr<ResumePoint> Resume();

  absl::StatusOr<std::vector<rpc::RRef<Tensor>>> ShardRRefs(const std::string& name);
  absl::StatusOr<Tensor> FetchDense(const std::string& name, const std::vector<rpc::RRef<Tensor>>& shards);

  int trainer() const { return trainer_; }
  ~Client();

 private:
  struct Table {
    Shape shape;
    Consistency consistency = Consistency::kSync;
    bool sparse = false;
    int64_t dim = 0;  // sparse
    // The layout: the servers holding it (in shard order), its epoch (0 until re-sharded),
    // and where keys go.
    std::vector<std::string> servers;
    int64_t epoch = 0;
    std::vector<KeyRange> ranges;                  // dense
    std::shared_ptr<const IdPlacement> placement;  // sparse
  };
  struct Layout {
    std::vector<std::string> servers;
    int64_t epoch = 0;
  };
  // Positions of `ids` by server: ids[i] goes to server s as its k-th id.
  struct Split {
    std::vector<std::vector<int64_t>> positions;  // per server
    std::vector<Tensor> ids;                      // per server, int64 [k]
  };
  static Split SplitIds(const Table& table, const Tensor& ids);
  static void Place(Table& table, std::vector<std::string> servers, int64_t epoch);
  static absl::Status NotKnown(const std::string& name);
  // "<run_id>/ps/layout/<table>": "<epoch> <server>,<server>,..." once re-sharded.
  std::string LayoutKey(const std::string& name) const;
  absl::StatusOr<Layout> ReadLayout(const std::string& name) const;
  // The table, in the layout the store has now.
  absl::StatusOr<Table> Refreshed(const std::string& name);
  // op(table) sent again, split by the store's layout, while it fails with ABORTED.
  template <typename T>
  Future<T> OnLayout(const std::string& name, std::function<Future<T>(const Table&)> op);
  Future<Tensor> PullOn(const Table& table, const std::string& name, int64_t clock) const;
  Future<bool> PushOn(const Table& table, const std::string& name, int64_t clock, const Tensor& flat) const;
  Future<std::vector<Tensor>> PushPullManyOn(const std::vector<Table>& tables, const std::vector<std::string>& names,
                                             int64_t clock, const std::vector<Tensor>& flat) const;
  Future<Tensor> PullRowsOn(const Table& table, const std::string& name, int64_t clock, const Tensor& ids) const;
  Future<bool> PushRowsOn(const Table& table, const std::string& name, int64_t clock, const Tensor& ids,
                          const Tensor& grad) const;
  // agent_.Async<T>(server, ...) made by `call`, retried while the server is
  // unavailable (ClientOptions::reconnect_timeout).
  // (attempt n = 0, 1, ... is passed to `call`.)
  template <typename T>
  Future<T> Call(std::function<Future<T>(int attempt)> call) const;
  template <typename T>
  Future<T> Call(std::function<Future<T>()> call) const;
  struct LastPushes;
  std::function<Future<rpc::Ack>()> Remember(Consistency consistency, const std::string& name,
                                             const std::string& server, std::function<Future<rpc::Ack>()> push) const;
  std::function<Future<Tensor>(int attempt)> WithPushResent(Consistency consistency, const std::string& name,
                                                            const std::string& server,
                                                            std::function<Future<Tensor>()> pull) const;
  absl::StatusOr<Table> FindSparse(const std::string& name) const;
  absl::StatusOr<Table> Find(const std::string& name) const;
  // Find, and the gradient must have the table's shape.
  absl::StatusOr<Table> FindForGradient(const std::string& name, const Tensor& grad) const;
  Future<Tensor> Assemble(const Table& table, std::vector<Future<Tensor>> shards) const;
  // Every server this client knows: those it was given and those of its tables.
  std::vector<std::string> AllServers() const;
  // Before a push: a periodic checkpoint when one is due, or the error that stops pushes.
  absl::Status BeforePush();
  // `pushed`, completed once progress_ counts it (when the servers acknowledged it).
  template <typename T>
  Future<T> CountPush(int64_t clock, Future<T> pushed) const;

  rpc::Agent& agent_;
  const std::vector<std::string> servers_;
  const int trainer_;
  const int trainers_;
  const absl::Duration sync_timeout_;
  const absl::Duration reconnect_timeout_;
  const std::shared_ptr<LastPushes> last_pushes_;
  const absl::Duration checkpoint_every_;
  const std::shared_ptr<internal::Checkpointer> checkpointer_;
  mutable absl::Mutex mu_;
  std::map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
  absl::Time next_checkpoint_ ABSL_GUARDED_BY(mu_);
  // The pushes the servers acknowledged, the last one's clock and time: the agent's
  // statistics (a metrics endpoint's gradwire_ps_client_*), so that a trainer that stopped
  // making progress shows (time() - gradwire_ps_client_last_push_time_seconds).
  struct Progress;
  const std::shared_ptr<Progress> progress_;
  rpc::Statistics::Source statistics_;  // reads progress_: the last member, dropped first
};

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_CLIENT_H_
