#include "gradwire/param_server/sparse_embedding.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"

namespace gw::param_server {

// What a step's lookup left for Step(): the ids it pulled, and the push of their
// gradient once the hook made it.
struct SparseEmbedding::Pending {
  absl::Mutex mu;
  bool looked_up = false;  // a recording lookup happened this step
  Tensor ids;              // its distinct ids
  std::optional<Future<bool>> push ABSL_GUARDED_BY(mu);
  int extra_passes ABSL_GUARDED_BY(mu) = 0;  // backward passes over the lookup after the first
};

SparseEmbedding::SparseEmbedding(Client& client, std::string table, int64_t first_clock)
    : client_(client), table_(std::move(table)), clock_(first_clock), pending_(std::make_shared<Pending>()) {}

SparseEmbedding::~SparseEmbedding() = default;

absl::StatusOr<std::pair<Tensor, Tensor>> SparseEmbedding::Pull(const Tensor& ids) {
  if (ids.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding '", table_, "': ids must be int64, got ", DTypeName(ids.dtype())));
  }
  const bool recording = autograd::GradMode::IsEnabled();
  if (recording && pending_->looked_up) {
    return absl::FailedPreconditionError(absl::StrCat(
        "embedding '", table_, "': a second lookup in step ", clock_,
        " (the servers take one push per trainer and step): look up all of a step's ids at once, then call Step()"));
  }
  Tensor flat = kernels::Contiguous(ids);
  absl::flat_hash_map<int64_t, int64_t> position;
  std::vector<int64_t> distinct, local;
  local.reserve(static_cast<size_t>(flat.numel()));
  for (int64_t i = 0; i < flat.numel(); ++i) {
    auto [it, fresh] = position.try_emplace(flat.data<int64_t>()[i], static_cast<int64_t>(distinct.size()));
    if (fresh) distinct.push_back(it->first);
    local.push_back(it->second);
  }
  Tensor distinct_ids = Tensor::FromVector(distinct, {static_cast<int64_t>(distinct.size())});
  absl::StatusOr<Tensor> rows;
  {
    // The pull is not part of the graph (the rows become a leaf here): outside any
    // distributed-autograd context, so the servers never join it.
    autograd::NoGradGuard outside_contexts;
    rows = client_.PullRows(table_, clock_, distinct_ids).Get();
  }
  if (!rows.ok()) return rows.status();
  rows_pulled_ = distinct_ids.numel();
  if (!recording) return std::pair{*std::move(rows), Tensor::FromVector(local, ids.sizes())};

  pending_->looked_up = true;
  pending_->ids = distinct_ids;
  Tensor weight = *std::move(rows);
  weight.set_requires_grad(true);
  hook_ = autograd::AddPostAccumulateHook(
      weight, [pending = pending_, client = &client_, table = table_, clock = clock_](const Tensor&, Tensor& grad) {
        absl::MutexLock lock(&pending->mu);
        if (pending->push.has_value()) {  // a second pass over the same lookup: Step() says so
          ++pending->extra_passes;
          return;
        }
        // A copy: the push may be sent again after a reconnection, and the pass's
        // gradient may still change (accumulated by a later pass).
        pending->push = client->PushRows(table, clock, pending->ids, kernels::Clone(grad));
      });
  return std::pair{weight, Tensor::FromVector(local, ids.sizes())};
}

absl::StatusOr<Tensor> SparseEmbedding::Lookup(const Tensor& ids) {
  auto pulled = Pull(ids);
  if (!pulled.ok()) return pulled.status();
  auto& [rows, local] = *pulled;
  Shape out_shape = ids.sizes();
  out_shape.push_back(rows.size(1));
  return gw::Reshape(gw::IndexSelect(rows, 0, kernels::Reshape(local, {-1})), out_shape);
}

absl::StatusOr<Tensor> SparseEmbedding::LookupBag(const Tensor& ids, const Tensor& offsets, nn::BagMode mode) {
  auto pulled = Pull(ids);
  if (!pulled.ok()) return pulled.status();
  return nn::EmbeddingBagLookup(pulled->first, pulled->second, offsets, mode);
}

absl::Status SparseEmbedding::Step() {
  hook_.Remove();
  std::optional<Future<bool>> push;
  int extra_passes = 0;
  const bool looked_up = pending_->looked_up;
  {
    absl::MutexLock lock(&pending_->mu);
    push = std::move(pending_->push);
    extra_passes = pending_->extra_passes;
  }
  pending_ = std::make_shared<Pending>();
  const int64_t clock = clock_++;
  if (!push.has_value()) {
    // No gradient reached the rows this step: an empty push, so that the servers'
    // synchronous step does not wait for this trainer. Without a lookup this step, a
    // pull of no rows first waits for the previous step (the servers refuse a push
    // ahead of the step they are in).
    const Tensor none = Tensor::Empty({0}, DType::kInt64);
    if (!looked_up) {
      autograd::NoGradGuard outside_contexts;
      if (absl::Status s = client_.PullRows(table_, clock, none).Get().status(); !s.ok()) return s;
    }
    absl::StatusOr<int64_t> dim = client_.RowDim(table_);
    if (!dim.ok()) return dim.status();
    push = client_.PushRows(table_, clock, none, Tensor::Zeros({0, *dim}));
  }
  absl::Status pushed = push->Get().status();
  if (pushed.ok() && extra_passes > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "embedding '", table_, "': step ", clock, " ran ", extra_passes + 1,
        " backward passes over its lookup; only the first one's gradient was pushed (one backward per lookup)"));
  }
  return pushed;
}

}  // namespace gw::param_server
