#include "striped_rows.h"

#include <algorithm>
#include <cstring>

#include "gradwire/param_server/sharding.h"

namespace gw::param_server::internal {

StripedRows::StripedRows(int64_t dim, int state_size, int64_t capacity, RowInit init) : dim_(dim) {
  // The capacity is shared exactly: the first capacity % kStripes stripes hold one more.
  for (int k = 0; k < kStripes; ++k) {
    const int64_t share = capacity == 0 ? 0 : capacity / kStripes + (k < capacity % kStripes ? 1 : 0);
    // A stripe whose share is 0 (capacity < kStripes) still holds one row: RowStore's 0
    // means unbounded.
    stripes_.push_back(std::make_unique<Stripe>(dim, state_size, capacity == 0 ? 0 : std::max<int64_t>(share, 1), init));
  }
}

// The top bits of the id's hash: independent of IdPlacement's bucket (low bits) and of RowStore's index.
int StripedRows::StripeOf(uint64_t id) { return static_cast<int>(MixId(id) >> 61); }
static_assert(StripedRows::kStripes == 8, "StripeOf takes 3 bits");

void StripedRows::Visit(const std::function<void(uint64_t, const RowStore::Row&)>& fn) const {
  for (const auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    stripe->rows.ForEach(fn);
  }
}

SparseShardStats StripedRows::stats() const {
  SparseShardStats total;
  for (const auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    total.rows += stripe->rows.size();
    total.evictions += stripe->rows.evictions();
    total.bytes += static_cast<int64_t>(stripe->rows.bytes());
    total.raw_bytes += static_cast<int64_t>(stripe->rows.raw_bytes());
  }
  return total;
}

void RowSum::Add(const Tensor& ids, const Tensor& grad, int64_t dim) {
  const int64_t n = ids.numel();
  const int64_t* id = ids.data<int64_t>();
  const float* g = grad.data<float>();
  offset_.reserve(offset_.size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = static_cast<uint64_t>(id[i]);
    auto [it, fresh] = offset_.try_emplace(key, static_cast<int64_t>(ids_.size()));
    if (fresh) {
      ids_.push_back(key);
      values_.insert(values_.end(), g + i * dim, g + (i + 1) * dim);
    } else {
      float* dst = values_.data() + it->second * dim;
      for (int64_t j = 0; j < dim; ++j) dst[j] += g[i * dim + j];
    }
  }
}

void RowSum::Clear() {
  offset_.clear();
  ids_.clear();
  values_.clear();
}

Tensor ReadRows(StripedRows& rows, const Tensor& ids) {
  const int64_t n = ids.numel(), dim = rows.dim();
  Tensor out = Tensor::Empty({n, dim});
  float* dst = out.data<float>();
  rows.ForEach(reinterpret_cast<const uint64_t*>(ids.data<int64_t>()), n, [&](int64_t i, const RowStore::Row& row) {
    std::memcpy(dst + i * dim, row.values, static_cast<size_t>(dim) * sizeof(float));
  });
  return out;
}

void ApplyRowSum(StripedRows& rows, const optim::OptimizerConfig& optimizer, RowSum& sum, float scale) {
  const int64_t dim = rows.dim();
  rows.ForEach(sum.ids_.data(), static_cast<int64_t>(sum.ids_.size()), [&](int64_t i, const RowStore::Row& row) {
    float* g = sum.values_.data() + i * dim;
    if (scale != 1.0f) {
      for (int64_t j = 0; j < dim; ++j) g[j] *= scale;
    }
    optim::UpdateRow(optimizer, dim, row.values, g, row.state, *row.step);
  });
  sum.Clear();
}

// Rows of duplicate ids are summed first (a few per push of random ids); the others are
// applied straight from the received gradient without a copy.
void ApplyRows(StripedRows& rows, const optim::OptimizerConfig& optimizer, const Tensor& ids, const Tensor& grad) {
  const int64_t n = ids.numel(), dim = rows.dim();
  const uint64_t* id = reinterpret_cast<const uint64_t*>(ids.data<int64_t>());
  const float* g = grad.data<float>();
  absl::flat_hash_map<uint64_t, int64_t> first;  // id -> position among the unique ids
  first.reserve(static_cast<size_t>(n));
  std::vector<uint64_t> unique;
  std::vector<const float*> grads;
  unique.reserve(static_cast<size_t>(n));
  grads.reserve(static_cast<size_t>(n));
  absl::flat_hash_map<int64_t, std::vector<float>> sums;  // unique position -> summed row
  for (int64_t i = 0; i < n; ++i) {
    auto [it, fresh] = first.try_emplace(id[i], static_cast<int64_t>(unique.size()));
    if (fresh) {
      unique.push_back(id[i]);
      grads.push_back(g + i * dim);
      continue;
    }
    const size_t k = static_cast<size_t>(it->second);
    auto [sum, new_sum] = sums.try_emplace(it->second);
    if (new_sum) sum->second.assign(grads[k], grads[k] + dim);
    for (int64_t j = 0; j < dim; ++j) sum->second[static_cast<size_t>(j)] += g[i * dim + j];
    grads[k] = sum->second.data();  // node-stable: flat_hash_map moves the vector, not its buffer
  }
  rows.ForEach(unique.data(), static_cast<int64_t>(unique.size()), [&](int64_t i, const RowStore::Row& row) {
    optim::UpdateRow(optimizer, dim, row.values, grads[static_cast<size_t>(i)], row.state, *row.step);
  });
}

}  // namespace gw::param_server::internal
