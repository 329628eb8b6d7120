// ParameterServer: the server role, hosting shards of named dense and sparse tables.
//
// Contract
//   - ParameterServer::Install(agent, options) in Agent::Start's setup serves the
//     server's messages on that agent; the Client (client.h) sends them. They are the
//     records of param_server/src/messages.h: CreateDenseMessage and CreateSparseMessage
//     (a TableConfig each), PullMessage, PushMessage, PushPullManyMessage,
//     PullRowsMessage, PushRowsMessage, ShardRRefMessage, ReadMessage
//     (dense shards copied as they are now, with their update counts, for reader.h),
//     JoinTableMessage and LeaveTableMessage (elastic trainers), and FreezeMessage,
//     ExportMessage, ImportMessage, EndFreezeMessage (re-sharding, client.h), and the
//     checkpoint messages below.
//   - A dense table shard holds a contiguous key range of a flat float32 table; a sparse
//     table shard holds the rows (row_store.h) whose ids hash to this server, created on
//     first touch (pull or push) from a seeded initializer, optionally bounded by an LRU
//     capacity. Each shard has a functional optimizer of optim/ with its state kept here
//     (sparse: per row, and only the pushed rows are updated: optim::UpdateRow; the rows
//     of one push are summed by id first) and a consistency mode:
//       kSync     a step's pushes from all the trainers taking part in it are summed
//                 and averaged, then applied once; a pull for clock c waits until step c-1 was applied. If
//                 the step is not complete within `sync_timeout` the waiting pulls fail
//                 with DEADLINE_EXCEEDED naming the trainers that did not push. Pulls are
//                 answered without a copy (the values change only once every trainer
//                 pushed again): a reader that is not one of the trainers must use an
//                 asynchronous table or accept that.
//       kAsync    every push is applied when it arrives; pulls never wait.
//       kBoundedStaleness(s)  pushes apply on arrival; a trainer's clock is one past
//                 the clock of its last push; a pull for clock c waits until every
//                 trainer has reached c - s (then fails after `sync_timeout` naming the
//                 slow ones).
//     A trainer whose worker is declared dead (rpc's failure detection: it died, froze or
//     was cut off) fails the pulls waiting for its push at once, and those that would
//     wait for it later, with UNAVAILABLE naming it ("synchronous step 3 of table 'w' on
//     worker1 cannot complete: trainer 1 (worker2) was declared dead before its push"),
//     instead of at sync_timeout; once it pushes again (restarted) it counts as alive.
//     A push is identified by (trainer, clock): under kSync and kBoundedStaleness a push
//     for a clock the server has already passed is acknowledged without being applied
//     again, so a client may retry a push whose answer was lost (exactly once). kAsync
//     pushes carry no such identity: a retried one applies again (at least once). The
//     server runs one trainer's requests concurrently: under kBoundedStaleness a trainer
//     waits for a push's answer before its next push of that table.
//   - Trainers: a table starts with trainers 0 .. trainers-1; others join it
//     (JoinTableMessage: a synchronous table at a step boundary, the others at once) and
//     leave it after their last push (LeaveTableMessage: later steps and pulls stop
//     waiting for them); consistency_clock.h has the rules.
//   - Re-sharding: a shard belongs to one layout of its table (an epoch; 0 until the table
//     is re-sharded). Data requests name the layout they were split by; another layout's
//     is refused with ABORTED (the client re-reads the layout and sends it again). A
//     frozen shard (FreezeMessage) refuses the pushes from its freeze clock on and answers
//     the freeze once every step before it is complete; ExportMessage then gives its
//     checkpoint form; ImportMessage stages this server's shard of the next layout, which
//     takes over at EndFreezeMessage (commit) or at the first request of that layout; a
//     server not in the new layout drops the table (later requests: ABORTED, "moved").
//     An aborted re-sharding thaws the frozen shard. Checkpoints keep a shard's layout.
//   - Bounds: at most 65,536 trainers, rows of at most 2^20 floats, capacity at most
//     8 x (2^27 - 1) rows per shard; a table created again must ask for the same
//     consistency, trainers and staleness (ALREADY_EXISTS otherwise).
//   - Creating a table that exists with the same shape is a no-op (every trainer may
//     create it); a different shape is an error.
//   - Checkpoints (options.checkpoint_dir non-empty; checkpoint.h says what a user sees):
//     a client cuts a version of every table (CutPlanMessage, CutMessage,
//     CutWrittenMessage, CutCommitMessage, CutAbandonMessage): a synchronous shard is
//     copied under its lock as of the start of the cut's step (its values and optimizer
//     state once the step before was applied; the pushes of the cut's step that arrived
//     are not copied: after a restore the trainers push that step again), at once when
//     it is at that step, else the moment it gets there; the others when the cut is
//     registered; the copy is written in the background by the server's writer
//     thread to "<dir>/v<version>/<worker name>.gwps" and, once the client sends the
//     manifest, the version is complete and the versions beyond options.checkpoint_keep
//     are removed. Install restores the newest usable version (checkpoint.h), unless
//     options.fresh or the server joined a running job (it takes its share by
//     re-sharding); RestoredMessage answers which. A restored synchronous table lets the
//     trainers' next push move it to their step when they are ahead (a single server
//     that restarted: the steps in between are lost for its shards, said on stderr
//     once), and refuses pushes of steps it has long passed (consistency_clock.h).
//     Failures to write are counted (checkpoint_stats, and the agent's statistics:
//     gradwire_ps_checkpoint_versions_written_total, _failures_total, _failures_in_a_row,
//     _last_version, _last_step, _last_bytes, _last_copy_seconds, _last_write_seconds,
//     _restored_version) and written to stderr (the first of a series, then at most a
//     line a minute); the client fails the cut.
//   - Thread-safe; pulls and pushes of different tables never wait for each other.
#ifndef GRADWIRE_PARAM_SERVER_SERVER_H_
#define GRADWIRE_PARAM_SERVER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gradwire/param_server/checkpoint.h"
#include "gradwire/rpc/agent.h"

namespace gw::param_server {

enum class Consistency { kSync = 0, kAsync = 1, kBoundedStaleness = 2 };

struct ServerOptions {
  std::string checkpoint_dir;  // empty: no checkpoints (shared by the job's servers)
  int checkpoint_keep = 3;     // complete versions kept (at least 1)
  bool fresh = false;          // start empty even if checkpoint_dir holds versions (kept; new ones number after them)
  bool allow_non_finite = false;  // write and restore NaN / infinite values instead of refusing the version
};

// A sparse table's shard, for tests and metrics.
struct SparseShardStats {
  int64_t rows = 0;
  int64_t evictions = 0;
  int64_t bytes = 0;      // RowStore::bytes()
  int64_t raw_bytes = 0;  // RowStore::raw_bytes()
};

class ParameterServer {
 public:
  static absl::StatusOr<std::shared_ptr<ParameterServer>> Install(rpc::Agent& agent, ServerOptions options = {});
  ~ParameterServer();

  // Tables and shards hosted here (for tests and metrics).
  size_t num_shards() const;
  absl::StatusOr<SparseShardStats> sparse_stats(const std::string& table) const;
  // What Install restored (version 0: nothing), and the checkpoints written since.
  const RestoredCheckpoint& restored() const;
  CheckpointStats checkpoint_stats() const;

  class Impl;

 private:
  explicit ParameterServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace gw::param_server

#endif  // GRADWIRE_PARAM_SERVER_SERVER_H_
