// Internal: the parameter server's messages (param_server/include/gradwire/param_server/
// server.h describes what they do). Each is a record (rpc/message.h) that the client and
// the server share.
#ifndef GRADWIRE_PARAM_SERVER_SRC_MESSAGES_H_
#define GRADWIRE_PARAM_SERVER_SRC_MESSAGES_H_

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "gradwire/optim/functional.h"
#include "gradwire/param_server/row_store.h"
#include "gradwire/param_server/server.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/tensor/tensor.h"

namespace gw::param_server::internal {

using rpc::Ack;
using rpc::Field;

// How a table is updated; the same for every shard of it.
struct TableConfig {
  optim::OptimizerConfig optimizer;
  Consistency consistency = Consistency::kSync;
  int64_t trainers = 1;
  int64_t staleness = 0;  // kBoundedStaleness's s
  int64_t sync_timeout_ms = 60000;
  static constexpr auto Fields() {
    return std::make_tuple(Field("optimizer", &TableConfig::optimizer), Field("consistency", &TableConfig::consistency),
                           Field("trainers", &TableConfig::trainers), Field("staleness", &TableConfig::staleness),
                           Field("sync_timeout_ms", &TableConfig::sync_timeout_ms));
  }
};

// Create this server's shard of a dense table (its key range's initial values).
struct CreateDenseMessage {
  static constexpr char kFunction[] = "__ps.create_dense";
  using Reply = Ack;
  std::string table;
  TableConfig config;
  Tensor values;  // float32 [range size]
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &CreateDenseMessage::table), Field("config", &CreateDenseMessage::config),
                           Field("values", &CreateDenseMessage::values));
  }
};

// Create this server's shard of a sparse table.
struct CreateSparseMessage {
  static constexpr char kFunction[] = "__ps.create_sparse";
  using Reply = Ack;
  std::string table;
  TableConfig config;
  int64_t dim = 0;       // floats per row
  int64_t capacity = 0;  // rows on this server, 0: unbounded
  RowInit init;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &CreateSparseMessage::table), Field("config", &CreateSparseMessage::config),
                           Field("dim", &CreateSparseMessage::dim), Field("capacity", &CreateSparseMessage::capacity),
                           Field("init", &CreateSparseMessage::init));
  }
};

// Every request for a table's data names the layout it was split by (`epoch`, bumped by
// every re-sharding): a server whose shard belongs to another refuses it with ABORTED,
// and the client re-reads the layout and sends it again (client.h).

// The shard's values as of step `clock`.
struct PullMessage {
  static constexpr char kFunction[] = "__ps.pull";
  using Reply = Tensor;
  std::string table;
  int64_t clock = 0;
  int64_t epoch = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &PullMessage::table), Field("clock", &PullMessage::clock),
                           Field("epoch", &PullMessage::epoch));
  }
};

// This trainer's gradient of the shard for step `clock`; (trainer, clock) identify it.
struct PushMessage {
  static constexpr char kFunction[] = "__ps.push";
  using Reply = Ack;
  std::string table;
  int64_t clock = 0;
  int64_t trainer = 0;
  Tensor grad;
  int64_t epoch = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &PushMessage::table), Field("clock", &PushMessage::clock),
                           Field("trainer", &PushMessage::trainer), Field("grad", &PushMessage::grad),
                           Field("epoch", &PushMessage::epoch));
  }
};

// Push to several tables, answered with their shards as of clock + 1.
struct PushPullManyMessage {
  static constexpr char kFunction[] = "__ps.push_pull_many";
  using Reply = std::vector<Tensor>;
  std::vector<std::string> tables;
  int64_t clock = 0;
  int64_t trainer = 0;
  std::vector<Tensor> grads;  // one per table
  int64_t epoch = 0;          // every table's (they share a layout)
  static constexpr auto Fields() {
    return std::make_tuple(Field("tables", &PushPullManyMessage::tables), Field("clock", &PushPullManyMessage::clock),
                           Field("trainer", &PushPullManyMessage::trainer), Field("grads", &PushPullManyMessage::grads),
                           Field("epoch", &PushPullManyMessage::epoch));
  }
};

// Rows `ids` (int64 [n]) of a sparse table as of `clock`: float32 [n, dim].
struct PullRowsMessage {
  static constexpr char kFunction[] = "__ps.pull_rows";
  using Reply = Tensor;
  std::string table;
  int64_t clock = 0;
  Tensor ids;
  int64_t epoch = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &PullRowsMessage::table), Field("clock", &PullRowsMessage::clock),
                           Field("ids", &PullRowsMessage::ids), Field("epoch", &PullRowsMessage::epoch));
  }
};

// Gradient rows for `ids` (duplicates summed).
struct PushRowsMessage {
  static constexpr char kFunction[] = "__ps.push_rows";
  using Reply = Ack;
  std::string table;
  int64_t clock = 0;
  int64_t trainer = 0;
  Tensor ids;   // int64 [n]
  Tensor grad;  // float32 [n, dim]
  int64_t epoch = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &PushRowsMessage::table), Field("clock", &PushRowsMessage::clock),
                           Field("trainer", &PushRowsMessage::trainer), Field("ids", &PushRowsMessage::ids),
                           Field("grad", &PushRowsMessage::grad), Field("epoch", &PushRowsMessage::epoch));
  }
};

// A trainer joins a table (elastic trainers, ConsistencyClock::Join): answered with the
// clock it takes part from; `from` < 0 only asks where it would join now.
struct JoinTableMessage {
  static constexpr char kFunction[] = "__ps.join";
  using Reply = int64_t;
  std::string table;
  int64_t trainer = 0;
  int64_t from = -1;
  int64_t epoch = 0;  // the layout it was sent by (as data requests: ABORTED if another, or frozen)
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &JoinTableMessage::table), Field("trainer", &JoinTableMessage::trainer),
                           Field("from", &JoinTableMessage::from), Field("epoch", &JoinTableMessage::epoch));
  }
};

// A trainer leaves a table after its push at `last` (ConsistencyClock::Leave).
struct LeaveTableMessage {
  static constexpr char kFunction[] = "__ps.leave";
  using Reply = Ack;
  std::string table;
  int64_t trainer = 0;
  int64_t last = -1;
  int64_t epoch = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &LeaveTableMessage::table), Field("trainer", &LeaveTableMessage::trainer),
                           Field("last", &LeaveTableMessage::last), Field("epoch", &LeaveTableMessage::epoch));
  }
};

// Re-sharding (Client::Reshard), on the servers of the table's layout `epoch`: freeze the
// shard from clock `point` on (pushes of later clocks are refused with ABORTED) and answer,
// once every step before it is complete here, with the clock it froze at (the point, or
// later when this shard is already past it: the client asks all again with that).
// point < 0 only asks where it would freeze now.
struct FreezeMessage {
  static constexpr char kFunction[] = "__ps.freeze";
  using Reply = int64_t;
  std::string table;
  int64_t epoch = 0;
  int64_t point = -1;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &FreezeMessage::table), Field("epoch", &FreezeMessage::epoch),
                           Field("point", &FreezeMessage::point));
  }
};

// A shard in its checkpoint form (shard.h): named tensors.
struct ShardForm {
  std::vector<std::string> names;
  std::vector<Tensor> tensors;
  static constexpr auto Fields() {
    return std::make_tuple(Field("names", &ShardForm::names), Field("tensors", &ShardForm::tensors));
  }
};

// The frozen shard of layout `epoch`, once quiescent.
struct ExportMessage {
  static constexpr char kFunction[] = "__ps.export";
  using Reply = ShardForm;
  std::string table;
  int64_t epoch = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &ExportMessage::table), Field("epoch", &ExportMessage::epoch));
  }
};

// This server's shard of the table in its next layout (the form's epoch), kept aside until
// a request of that layout or EndFreeze puts it in place.
struct ImportMessage {
  static constexpr char kFunction[] = "__ps.import";
  using Reply = Ack;
  std::string table;
  ShardForm form;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &ImportMessage::table), Field("form", &ImportMessage::form));
  }
};

// The end of a re-sharding: commit (the layout `epoch` is in the store: the imported shard
// takes over, or a server not in it lets the table go) or abort (the frozen shard serves
// again, an imported one is dropped).
struct EndFreezeMessage {
  static constexpr char kFunction[] = "__ps.end_freeze";
  using Reply = Ack;
  std::string table;
  int64_t epoch = 0;
  int64_t commit = 1;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &EndFreezeMessage::table), Field("epoch", &EndFreezeMessage::epoch),
                           Field("commit", &EndFreezeMessage::commit));
  }
};

// Checkpoints (server.h, "Checkpoints"): a client cuts every table of every server at
// one step, in phases: CutPlan (where each shard could be cut), Cut (register the cut),
// CutWritten (each server's file, once written), CutCommit (the manifest) or CutAbandon.

// A server's shards and where each could be cut now.
struct CutPlan {
  std::vector<std::string> tables;
  std::vector<int64_t> consistency;  // per table
  std::vector<int64_t> proposals;    // per table: kSync, its step (steps applied); else 0
  int64_t latest_version = 0;        // the newest version in the server's directory (0: none)
  std::string job;                   // the job of the version it restored ("" if none)
  static constexpr auto Fields() {
    return std::make_tuple(Field("tables", &CutPlan::tables), Field("consistency", &CutPlan::consistency),
                           Field("proposals", &CutPlan::proposals), Field("latest_version", &CutPlan::latest_version),
                           Field("job", &CutPlan::job));
  }
};

struct CutPlanMessage {
  static constexpr char kFunction[] = "__ps.cut_plan";
  using Reply = CutPlan;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// Register version `version` of job `job`: each synchronous shard is copied as of the start
// of step `step` (at once if it is at that step, else when it gets there), the others now.
// ABORTED when a synchronous shard is past that step (the client plans again).
struct CutMessage {
  static constexpr char kFunction[] = "__ps.cut";
  using Reply = Ack;
  int64_t version = 0;
  std::string job;
  int64_t step = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("version", &CutMessage::version), Field("job", &CutMessage::job),
                           Field("step", &CutMessage::step));
  }
};

// One shard of a server's file (ManifestShard).
struct CutShard {
  std::string table;
  bool sparse = false;
  int64_t consistency = 0;
  int64_t epoch = 0;
  int64_t size = 0;
  int64_t clock = 0;
  int64_t updates = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("table", &CutShard::table), Field("sparse", &CutShard::sparse),
                           Field("consistency", &CutShard::consistency), Field("epoch", &CutShard::epoch),
                           Field("size", &CutShard::size), Field("clock", &CutShard::clock),
                           Field("updates", &CutShard::updates));
  }
};

// A server's file of a version, once written.
struct CutFile {
  std::string name;
  int64_t bytes = 0;
  int64_t crc32c = 0;
  std::vector<CutShard> shards;
  std::string directory;  // which directory it is in: "<host>:<device>:<inode>" (shared or not)
  static constexpr auto Fields() {
    return std::make_tuple(Field("name", &CutFile::name), Field("bytes", &CutFile::bytes),
                           Field("crc32c", &CutFile::crc32c), Field("shards", &CutFile::shards),
                           Field("directory", &CutFile::directory));
  }
};

struct CutWrittenMessage {
  static constexpr char kFunction[] = "__ps.cut_written";
  using Reply = CutFile;
  int64_t version = 0;
  static constexpr auto Fields() { return std::make_tuple(Field("version", &CutWrittenMessage::version)); }
};

// The version's manifest (manifest.h, encoded): the server writes it beside its file,
// which completes the version there, and drops the versions it no longer keeps.
struct CutCommitMessage {
  static constexpr char kFunction[] = "__ps.cut_commit";
  using Reply = Ack;
  int64_t version = 0;
  std::string manifest;
  static constexpr auto Fields() {
    return std::make_tuple(Field("version", &CutCommitMessage::version), Field("manifest", &CutCommitMessage::manifest));
  }
};

struct CutAbandonMessage {
  static constexpr char kFunction[] = "__ps.cut_abandon";
  using Reply = Ack;
  int64_t version = 0;
  static constexpr auto Fields() { return std::make_tuple(Field("version", &CutAbandonMessage::version)); }
};

// The version this server restored at its start (version 0: none).
struct RestoredInfo {
  int64_t version = 0;
  int64_t step = 0;
  std::string job;
  static constexpr auto Fields() {
    return std::make_tuple(Field("version", &RestoredInfo::version), Field("step", &RestoredInfo::step),
                           Field("job", &RestoredInfo::job));
  }
};

struct RestoredMessage {
  static constexpr char kFunction[] = "__ps.restored";
  using Reply = RestoredInfo;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// A dense shard as an RRef owned by the server (for distributed autograd).
struct ShardRRefMessage {
  static constexpr char kFunction[] = "__ps.shard_rref";
  using Reply = rpc::RRef<Tensor>;
  std::string table;
  static constexpr auto Fields() { return std::make_tuple(Field("table", &ShardRRefMessage::table)); }
};

// Dense shards as they are now, for a reader that does not train (reader.h): each
// table's shard copied under its lock (when `values`) and the updates it has applied.
struct TablesRead {
  std::vector<Tensor> values;  // per table (none when not asked for values)
  std::vector<int64_t> steps;  // per table: ParamState::step of the shard
  static constexpr auto Fields() {
    return std::make_tuple(Field("values", &TablesRead::values), Field("steps", &TablesRead::steps));
  }
};

struct ReadMessage {
  static constexpr char kFunction[] = "__ps.read";
  using Reply = TablesRead;
  std::vector<std::string> tables;
  bool values = true;
  static constexpr auto Fields() {
    return std::make_tuple(Field("tables", &ReadMessage::tables), Field("values", &ReadMessage::values));
  }
};

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_MESSAGES_H_
