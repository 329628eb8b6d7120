// Internal: one table's shard on a server (server.cc), and its checkpoint form
// (checkpoint.cc).
//
// A shard is dense (a contiguous key range of a flat float32 table, one optimizer state
// for the range) or sparse (rows by id in StripedRows, state per row). Its configuration
// is fixed at creation and read without a lock. Everything else is guarded by `mu`, but
// the rows of a sparse shard, which have their own stripe locks: asynchronous sparse
// pulls and pushes take only those.
#ifndef GRADWIRE_PARAM_SERVER_SRC_SHARD_H_
#define GRADWIRE_PARAM_SERVER_SRC_SHARD_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "consistency_clock.h"
#include "gradwire/nn/module.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/row_store.h"
#include "gradwire/param_server/server.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/rpc/value.h"
#include "striped_rows.h"

namespace gw::param_server::internal {

// Bounds on what a peer or a checkpoint file may ask for.
inline constexpr int64_t kMaxTrainers = 1 << 16;
inline constexpr int64_t kMaxRowWidth = 1 << 20;  // floats per row (values; state adds at most 3x)

struct ShardConfig {
  bool sparse = false;
  int64_t size = 0;  // dense: keys in the shard's range
  optim::OptimizerConfig optimizer;
  Consistency consistency = Consistency::kSync;
  int trainers = 1;
  int64_t staleness = 0;
  absl::Duration sync_timeout = absl::Seconds(60);
  int64_t dim = 0;       // sparse: row width
  RowInit init;          // sparse
  int64_t capacity = 0;  // sparse: 0 = unbounded
  int64_t epoch = 0;     // the table's layout (Client::Reshard) this shard belongs to
};

// A pull that waits for its clock to become readable.
struct Waiter {
  int64_t clock = 0;
  Promise<Tensor> answer;
  std::function<Tensor()> read;  // runs under the shard's mutex when the pull is served
};

class Shard {
 public:
  explicit Shard(ShardConfig c)
      : config(std::move(c)),
        rows(config.sparse ? std::make_unique<StripedRows>(config.dim, optim::RowStateSize(config.optimizer),
                                                           config.capacity, config.init)
                           : nullptr),
        clock(config.consistency, config.trainers, config.staleness) {}

  const ShardConfig config;
  // Sparse: the rows, with their own stripe locks (the pointer never changes).
  const std::unique_ptr<StripedRows> rows;

  absl::Mutex mu;
  ConsistencyClock clock ABSL_GUARDED_BY(mu);
  Tensor values ABSL_GUARDED_BY(mu);            // dense: 1-D float32, the shard's key range
  optim::ParamState state ABSL_GUARDED_BY(mu);  // dense
  // Dense: the shard as an RRef owned here (created on first request): a view of
  // `values` that requires grad, for distributed autograd and DistributedOptimizer.
  std::optional<rpc::RRef<Tensor>> rref ABSL_GUARDED_BY(mu);
  // Dense kSync: the gradients pushed for the open step so far, as received (summed once,
  // when the step completes; a restored partial sum is one entry).
  std::vector<Tensor> pending ABSL_GUARDED_BY(mu);
  RowSum row_sum ABSL_GUARDED_BY(mu);  // sparse kSync: the open step's rows
  absl::Time step_deadline ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  std::vector<Waiter> waiting ABSL_GUARDED_BY(mu);  // pulls that wait for a clock

  // Re-sharding (server.cc, Client::Reshard): pushes from clock `frozen_at` on are
  // refused (kNotFrozen: none; kRetired: the shard was replaced, everything is refused),
  // and the answers to Freeze wait in `quiescent` until every step before it is complete
  // here. Sparse asynchronous pushes take no `mu`: they hold `gate` shared, and a freeze
  // takes it exclusively to set gate_closed, so none is half-applied when it is frozen.
  static constexpr int64_t kNotFrozen = INT64_MAX;
  static constexpr int64_t kRetired = INT64_MIN;
  int64_t frozen_at ABSL_GUARDED_BY(mu) = kNotFrozen;
  std::vector<Promise<int64_t>> quiescent ABSL_GUARDED_BY(mu);
  // Checkpoints (server.cc): a synchronous shard is copied for cut `cut_version` when it
  // reaches the start of step `cut_step` (0: no cut waits for it).
  int64_t cut_version ABSL_GUARDED_BY(mu) = 0;
  int64_t cut_step ABSL_GUARDED_BY(mu) = 0;
  absl::Mutex gate;
  bool gate_closed ABSL_GUARDED_BY(gate) = false;
};

// Checkpoint form of a shard: named tensors "<table>|<field>". Snapshot copies the
// shard's data, with the open synchronous step's pushes (`open_step`: what a re-sharding
// moves) or as of that step's start (a checkpoint's cut: the values and state at the
// step, which the trainers push again); Restore rebuilds every table of a checkpoint
// (each shard's clock marked restored).
void Snapshot(const std::string& table, Shard& s, nn::NamedTensors& out, bool open_step = true)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
absl::StatusOr<std::vector<std::pair<std::string, std::unique_ptr<Shard>>>> Restore(const nn::NamedTensors& in);

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_SHARD_H_
