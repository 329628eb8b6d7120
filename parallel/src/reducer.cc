#include "reducer.h"

#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/node.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"

namespace gw::parallel {

DdpReducer::DdpReducer(const nn::NamedTensors& params, std::shared_ptr<collectives::ProcessGroup> group,
                       const DdpOptions& options)
    : group_(std::move(group)), options_(options) {
  // Gradients become ready roughly in reverse registration order: buckets follow it, one
  // dtype per bucket, a new bucket once the open one of that dtype would pass the cap.
  std::map<DType, size_t> open;  // dtype -> its open bucket
  std::vector<size_t> bytes;     // per bucket
  std::vector<DType> dtypes;     // per bucket
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const auto& [name, tensor] = *it;
    if (!tensor.requires_grad()) continue;
    auto o = open.find(tensor.dtype());
    if (o == open.end() || (bytes[o->second] > 0 && bytes[o->second] + tensor.nbytes() > options_.bucket_bytes)) {
      buckets_.emplace_back();
      bytes.push_back(0);
      dtypes.push_back(tensor.dtype());
      o = open.insert_or_assign(tensor.dtype(), buckets_.size() - 1).first;
    }
    const size_t b = o->second;
    buckets_[b].params.push_back(params_.size());
    bytes[b] += tensor.nbytes();
    params_.push_back(Param{.name = name, .tensor = tensor, .bucket = b, .slot = Tensor(), .hook = {}});
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    int64_t numel = 0;
    for (size_t i : bucket.params) numel += params_[i].tensor.numel();
    bucket.flat = Tensor::Zeros({numel}, dtypes[b]);
    int64_t offset = 0;
    for (size_t i : bucket.params) {
      Param& p = params_[i];
      p.slot = kernels::View(kernels::Narrow(bucket.flat, 0, offset, p.tensor.numel()), p.tensor.sizes());
      offset += p.tensor.numel();
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].hook = autograd::AddPostAccumulateHook(
        params_[i].tensor, [this, i](const Tensor&, Tensor& grad) { OnGradient(i, grad); });
  }
  ready_.assign(params_.size(), false);
  grads_.resize(params_.size());
}

std::vector<std::vector<std::string>> DdpReducer::BucketNames() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(params_[i].name);
  }
  return out;
}

std::vector<size_t> DdpReducer::UnusedBy(const std::vector<Tensor>& outputs) const {
  absl::flat_hash_set<const TensorImpl*> reached;
  absl::flat_hash_set<const autograd::Node*> seen;
  std::vector<const autograd::Node*> stack;
  for (const Tensor& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    autograd::Edge e = autograd::GradientEdge(out);
    if (e.valid() && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  while (!stack.empty()) {
    const autograd::Node* n = stack.back();
    stack.pop_back();
    if (const auto* acc = dynamic_cast<const autograd::AccumulateGrad*>(n)) {
      reached.insert(acc->variable().unsafe_impl());
    }
    for (const autograd::Edge& e : n->next_edges()) {
      if (e.valid() && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  std::vector<size_t> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!reached.contains(params_[i].tensor.unsafe_impl())) unused.push_back(i);
  }
  return unused;
}

void DdpReducer::Prepare(const std::vector<Tensor>& outputs) {
  if (armed_ && hooks_fired_ > 0) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) missing.push_back(params_[i].name);
    }
    armed_ = false;
    hooks_fired_ = 0;
    for (Bucket& b : buckets_) {
      if (b.work) (void)b.work->Get();  // launched buckets are the collective's until done
      b.work.reset();
    }
    throw Error(absl::StrCat(
        "DistributedDataParallel: the previous iteration's gradients were not averaged: its backward pass "
        "gave no gradient to ",
        missing.size(), " parameter(s) (", absl::StrJoin(missing, ", "),
        "), so their buckets were never reduced. If the model does not use every parameter in every forward, "
        "create it with DdpOptions::find_unused_parameters = true"));
  }
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  ready_.assign(params_.size(), false);
  for (Tensor& g : grads_) g = Tensor();
  remaining_ = params_.size();
  next_launch_ = 0;
  hooks_fired_ = 0;
  forward_unsynced_ = !sync_;
  armed_ = sync_;
  if (!armed_) return;
  if (options_.find_unused_parameters) {
    // Marked now, launched with the first bucket of the backward pass (a forward that no
    // backward follows starts no collective).
    for (size_t i : UnusedBy(outputs)) MarkReady(i, Tensor(), /*launch=*/false);
    if (remaining_ == 0) Finalize();  // no parameter takes part at all
  }
}

void DdpReducer::OnGradient(size_t index, Tensor& grad) {
  if (!sync_) return;  // NoSync: the gradient just accumulates in place
  if (!armed_) {
    if (forward_unsynced_) return;  // forward under NoSync, backward after it: not averaged either
    throw Error(absl::StrCat(
        "DistributedDataParallel: parameter ", params_[index].name,
        " got a gradient, but no forward pass through DistributedDataParallel armed this iteration (or its "
        "gradients were already averaged): run the forward through DistributedDataParallel::Forward or "
        "PrepareForBackward before each backward"));
  }
  if (ready_[index]) {
    throw Error(absl::StrCat("DistributedDataParallel: parameter ", params_[index].name,
                             " got a gradient twice in one iteration; run one backward pass per forward "
                             "(accumulate over several under NoSync)"));
  }
  ++hooks_fired_;
  MarkReady(index, grad, /*launch=*/true);
}

void DdpReducer::MarkReady(size_t index, Tensor grad, bool launch) {
  Param& p = params_[index];
  ready_[index] = true;
  if (grad.defined()) {
    if (grad.storage() != p.slot.storage()) kernels::CopyInPlace(p.slot, grad);  // not the bucket view already
  } else if (Tensor local = p.tensor.grad(); local.defined()) {
    kernels::CopyInPlace(p.slot, local);  // unused now, but accumulated under NoSync before
  } else {
    kernels::Fill(p.slot, 0);
  }
  grads_[index] = std::move(grad);
  --buckets_[p.bucket].pending;
  --remaining_;
  if (!launch) return;
  if (options_.overlap) LaunchInOrder();
  if (remaining_ == 0) Finalize();
}

void DdpReducer::LaunchInOrder() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    b.work = group_->AllReduce(b.flat, collectives::ReduceOp::kAvg);
  }
}

void DdpReducer::Finalize() {
  LaunchInOrder();
  armed_ = false;
  hooks_fired_ = 0;
  absl::Status failed;
  size_t failed_bucket = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // Bounded by the group's own timeout; every bucket is waited for, so that none is
    // still owned by its collective when the next iteration writes it.
    absl::Status s = buckets_[b].work->Get().status();
    if (!s.ok() && failed.ok()) {
      failed = s;
      failed_bucket = b;
    }
  }
  if (!failed.ok()) {
    throw Error(absl::StrCat("DistributedDataParallel: averaging the gradients of bucket ", failed_bucket, " (",
                             buckets_[failed_bucket].params.size(), " parameters, first ",
                             params_[buckets_[failed_bucket].params[0]].name, ") failed: ", failed.ToString()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (grads_[i].defined()) {
      if (grads_[i].storage() == p.slot.storage()) {
        // .grad() is the bucket view already (from an earlier iteration): averaged in place.
      } else if (grads_[i].is_same(p.tensor.grad())) {
        p.tensor.set_grad(p.slot);  // .grad() becomes the view of the averaged bucket (no copy)
      } else {
        kernels::CopyInPlace(grads_[i], p.slot);  // e.g. a distributed-autograd context's gradient
      }
    } else if (autograd::AccumulateInPassSink(p.tensor, kernels::Clone(p.slot))) {
      // Unused here in a distributed-autograd pass: its average goes where that pass
      // keeps gradients (the context), not to .grad().
    } else if (Tensor local = p.tensor.grad(); local.defined()) {
      kernels::CopyInPlace(local, p.slot);
    } else {
      p.tensor.set_grad(kernels::Clone(p.slot));
    }
    grads_[i] = Tensor();
  }
}

}  // namespace gw::parallel
