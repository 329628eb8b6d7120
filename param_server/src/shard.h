// Internal: one table's shard on a server (server.cc), and its checkpoint form
// (checkpoint.cc).
//
// A shard is dense (a contiguous key range of a flat float32 table, one optimizer state
// for the range) or sparse (rows by id in a RowStore, state per row). The consistency
// fields are the same for both and guarded by `mu` once the shard is shared; the rows of
// a sparse shard have their own stripe locks (StripedRows), and asynchronous sparse
// pulls and pushes take only those.
#ifndef GRADWIRE_PARAM_SERVER_SRC_SHARD_H_
#define GRADWIRE_PARAM_SERVER_SRC_SHARD_H_

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
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
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/value.h"

namespace gw::param_server::internal {

// Bounds on what a peer or a checkpoint file may ask for.
inline constexpr int64_t kMaxTrainers = 1 << 16;
inline constexpr int64_t kMaxRowWidth = 1 << 20;  // floats per row (values; state adds at most 3x)

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

// A sparse shard's rows, split by id hash into kStripes RowStores with a lock each, so
// that requests on one table run in parallel (a pull and a push of different trainers
// meet only when they reach the same stripe at the same time). A capacity is shared
// exactly (at least one row per stripe): LRU order is kept per stripe, so eviction is
// least-recently-used within the stripe the new id falls in.
class StripedRows {
 public:
  static constexpr int kStripes = 8;
  static constexpr int64_t kMaxCapacity = RowStore::kMaxRows * kStripes;
  StripedRows(int64_t dim, int state_size, int64_t capacity, RowInit init);

  // Calls fn(i, row) for every ids[i] (rows created on first touch), one stripe at a
  // time under its lock. Each id's call is made once, in no particular order.
  template <typename F>
  void ForEach(const uint64_t* ids, int64_t n, F&& fn) {
    std::array<std::vector<int64_t>, kStripes> positions;
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(StripeOf(ids[i]))].push_back(i);
    std::vector<uint64_t> sub;
    // Start at a different stripe each time so that concurrent requests spread out.
    const int first = static_cast<int>(next_start_.fetch_add(1, std::memory_order_relaxed) % kStripes);
    for (int k = 0; k < kStripes; ++k) {
      const size_t stripe = static_cast<size_t>((first + k) % kStripes);
      const std::vector<int64_t>& pos = positions[stripe];
      if (pos.empty()) continue;
      sub.resize(pos.size());
      for (size_t j = 0; j < pos.size(); ++j) sub[j] = ids[pos[j]];
      absl::MutexLock lock(&stripes_[stripe]->mu);
      stripes_[stripe]->rows.ForEachRow(sub.data(), static_cast<int64_t>(sub.size()),
                                        [&](int64_t j, const RowStore::Row& row) { fn(pos[static_cast<size_t>(j)], row); });
    }
  }
  // Every row (for checkpoints), stripe by stripe under its lock.
  void Visit(const std::function<void(uint64_t id, const RowStore::Row& row)>& fn) const;
  SparseShardStats stats() const;
  int state_size() const { return stripes_[0]->rows.state_size(); }

 private:
  struct Stripe {
    Stripe(int64_t dim, int state_size, int64_t capacity, RowInit init) : rows(dim, state_size, capacity, init) {}
    mutable absl::Mutex mu;
    RowStore rows ABSL_GUARDED_BY(mu);
  };
  static int StripeOf(uint64_t id);
  std::vector<std::unique_ptr<Stripe>> stripes_;
  std::atomic<uint64_t> next_start_{0};
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
  // dense: the shard as an RRef owned here (created on first request): a view of
  // `values` that requires grad, for distributed autograd and DistributedOptimizer.
  std::optional<rpc::RRef<Tensor>> rref;
  optim::ParamState state;  // dense
  std::unique_ptr<StripedRows> rows;  // sparse

  // kBoundedStaleness: the next clock each trainer pushes (older ones are retries).
  std::vector<int64_t> clocks;
  // kSync: steps applied; a pull for clock c is served once applied >= c.
  int64_t applied = 0;
  // dense kSync: the gradients pushed for step `applied` so far, as received (summed
  // once, when the step completes; a restored partial sum is one entry).
  std::vector<Tensor> pending;
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
