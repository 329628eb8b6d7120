// Internal: the rows of a sparse shard (StripedRows) and the row arithmetic of pulls and
// pushes (ReadRows, RowSum, ApplyRowSum, ApplyRows).
//
// Contract
//   - StripedRows splits the rows by id hash into kStripes RowStores with a lock each, so
//     requests on one table run in parallel (a pull and a push of different trainers meet
//     only when they reach the same stripe at the same time). A capacity is shared exactly
//     (at least one row per stripe): LRU order is kept per stripe, so eviction is
//     least-recently-used within the stripe a new id falls in. Thread-safe.
//   - ForEach(ids, n, fn) calls fn(i, row) for every ids[i] (rows created on first touch),
//     one stripe at a time under its lock, each id once, in no particular order.
//   - RowSum sums gradient rows by id (duplicates within a push, or a synchronous step's
//     pushes). Not thread-safe (the shard's mutex guards the step's sum).
//   - ReadRows copies rows out as one [n, dim] tensor; ApplyRows applies one push
//     (duplicate ids summed first, the others straight from the gradient); ApplyRowSum
//     applies summed rows scaled by `scale` and clears the sum. Both update each row with
//     optim::UpdateRow under its stripe's lock.
#ifndef GRADWIRE_PARAM_SERVER_SRC_STRIPED_ROWS_H_
#define GRADWIRE_PARAM_SERVER_SRC_STRIPED_ROWS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/row_store.h"
#include "gradwire/param_server/server.h"
#include "gradwire/tensor/tensor.h"

namespace gw::param_server::internal {

class StripedRows {
 public:
  static constexpr int kStripes = 8;
  static constexpr int64_t kMaxCapacity = RowStore::kMaxRows * kStripes;
  StripedRows(int64_t dim, int state_size, int64_t capacity, RowInit init);

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
      Stripe& s = *stripes_[stripe];
      absl::MutexLock lock(&s.mu);
      s.rows.ForEachRow(sub.data(), static_cast<int64_t>(sub.size()),
                        [&](int64_t j, const RowStore::Row& row) { fn(pos[static_cast<size_t>(j)], row); });
    }
  }
  // Every row (for checkpoints), stripe by stripe under its lock.
  void Visit(const std::function<void(uint64_t id, const RowStore::Row& row)>& fn) const;
  SparseShardStats stats() const;
  int64_t dim() const { return dim_; }

 private:
  struct Stripe {
    Stripe(int64_t dim, int state_size, int64_t capacity, RowInit init) : rows(dim, state_size, capacity, init) {}
    mutable absl::Mutex mu;
    RowStore rows ABSL_GUARDED_BY(mu);
  };
  static int StripeOf(uint64_t id);
  const int64_t dim_;
  std::vector<std::unique_ptr<Stripe>> stripes_;
  std::atomic<uint64_t> next_start_{0};
};

class RowSum {
 public:
  // REQUIRES: ids int64 [n], grad float32 contiguous [n, dim].
  void Add(const Tensor& ids, const Tensor& grad, int64_t dim);
  bool empty() const { return ids_.empty(); }
  void Clear();
  const std::vector<uint64_t>& ids() const { return ids_; }
  const std::vector<float>& values() const { return values_; }

 private:
  friend void ApplyRowSum(StripedRows&, const optim::OptimizerConfig&, RowSum&, float);
  absl::flat_hash_map<uint64_t, int64_t> offset_;  // id -> row index into values_
  std::vector<uint64_t> ids_;                      // in first-seen order
  std::vector<float> values_;
};

// Rows `ids` (contiguous int64 [n]) as one [n, dim] tensor, created on first touch.
Tensor ReadRows(StripedRows& rows, const Tensor& ids);
// One push: gradient rows (contiguous float32 [n, dim]) for ids (contiguous int64 [n]).
void ApplyRows(StripedRows& rows, const optim::OptimizerConfig& optimizer, const Tensor& ids, const Tensor& grad);
void ApplyRowSum(StripedRows& rows, const optim::OptimizerConfig& optimizer, RowSum& sum, float scale);

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_STRIPED_ROWS_H_
