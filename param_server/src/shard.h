// Internal: one table's shard on a server (server.cc), and its checkpoint form
// (checkpoint.cc).
//
// A shard is dense (a contiguous key range of a flat float32 table, one optimizer state
// for the range) or sparse (rows by id in a RowStore, state per row). The consistency
// fields are the same for both; every field is guarded by `mu` once the shard is shared.
#ifndef GRADWIRE_PARAM_SERVER_SRC_SHARD_H_
#define GRADWIRE_PARAM_SERVER_SRC_SHARD_H_

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/nn/module.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/row_store.h"
#include "gradwire/param_server/server.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/value.h"

namespace gw::param_server::internal {

// Gradient rows summed by id (duplicates within a push, or a synchronous step's pushes).
struct RowSum {
  absl::flat_hash_map<uint64_t, int64_t> offset;  // id -> row index into `values`
  std::vector<uint64_t> ids;                      // in first-seen order
  std::vector<float> values;
  // REQUIRES: ids int64 [n], grad float32 contiguous [n, dim].
  void Add(const Tensor& ids_tensor, const Tensor& grad, int64_t dim);
  bool empty() const { return ids.empty(); }
  void Clear();
};

struct Waiter {
  int64_t clock = 0;
  Promise<rpc::Value> answer;
  std::function<rpc::Value()> read;  // runs under the shard's lock when the pull is served
};

struct Shard {
  // Configuration (fixed at creation).
  bool sparse = false;
  optim::OptimizerConfig optimizer;
  Consistency consistency = Consistency::kSync;
  int trainers = 1;
  int64_t staleness = 0;
  absl::Duration sync_timeout = absl::Seconds(60);
  int64_t dim = 0;    // sparse: row width
  RowInit init;       // sparse
  int64_t capacity = 0;  // sparse: 0 = unbounded

  absl::Mutex mu;
  Tensor values;            // dense: 1-D float32, the shard's key range
  optim::ParamState state;  // dense
  std::unique_ptr<RowStore> rows;  // sparse

  // kBoundedStaleness (and retried pushes): the next clock each trainer pushes.
  std::vector<int64_t> clocks;
  // kSync: steps applied; a pull for clock c is served once applied >= c.
  int64_t applied = 0;
  Tensor sum;      // dense kSync: pushes of step `applied` so far
  RowSum row_sum;  // sparse kSync
  std::set<int> pushed;
  // Restored from a checkpoint and not yet resumed: a synchronous push may move the step
  // forward to where the trainers are (steps after the checkpoint were lost with the server).
  bool restored = false;
  absl::Time step_deadline = absl::InfiniteFuture();
  std::vector<Waiter> waiting;  // pulls that wait for a clock
};

// Checkpoint form of a shard: named tensors "<table>|<field>". Snapshot copies the
// shard's data (REQUIRES: s.mu held); Restore rebuilds every table of a checkpoint.
void Snapshot(const std::string& table, const Shard& s, nn::NamedTensors& out);
absl::StatusOr<std::vector<std::pair<std::string, std::unique_ptr<Shard>>>> Restore(const nn::NamedTensors& in);

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_SHARD_H_
