#include "gradwire/autograd/node.h"

#include <atomic>

#include "absl/synchronization/mutex.h"

#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"

namespace gw::autograd {
namespace {
std::atomic<uint64_t> next_sequence_nr{0};
thread_local bool grad_enabled = true;
}  // namespace

bool GradMode::IsEnabled() { return grad_enabled; }
void GradMode::SetEnabled(bool enabled) { grad_enabled = enabled; }

Node::Node() : sequence_nr_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

uint32_t Node::AddInputMeta(const Tensor& t) {
  input_meta_.push_back({t.sizes(), t.dtype()});
  return static_cast<uint32_t>(input_meta_.size() - 1);
}

Edge GradientEdge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  // Parameters are shared by concurrent forward passes: create their accumulator once.
  static absl::Mutex accumulator_mu(absl::kConstInit);
  absl::MutexLock lock(&accumulator_mu);
  AutogradMeta& meta = t.autograd_meta();
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

SavedTensor::SavedTensor(const Tensor& t)
    : data_(t.defined() ? t.detach() : Tensor()),
      version_(t.defined() ? t.storage()->version() : 0) {}

const Tensor& SavedTensor::Get(const char* node_name) const {
  GW_CHECK(!data_.defined() || data_.storage()->version() == version_, node_name,
           "a tensor of shape ", ShapeToString(data_.sizes()),
           " saved for backward was modified in place after it was saved; clone it before "
           "modifying it, or modify it under NoGradGuard only after backward");
  return data_;
}

AccumulateGrad::AccumulateGrad(Tensor variable) : variable_(std::move(variable)) {
  AddInputMeta(variable_);
}

void AccumulateGrad::Accumulate(Tensor* slot, Tensor grad) {
  if (!grad.defined()) return;
  if (!slot->defined()) {
    // Adopt the buffer when nobody else can see it; otherwise copy so that later in-place
    // accumulation never writes into someone else's tensor.
    const bool unshared = grad.impl_ptr().use_count() == 1 &&
                          grad.storage().use_count() == 1 && grad.is_contiguous() &&
                          grad.storage()->nbytes() == grad.nbytes();
    *slot = unshared ? std::move(grad) : kernels::Clone(grad);
  } else {
    kernels::AddInPlace(*slot, grad);
  }
}

std::vector<Tensor> AccumulateGrad::Apply(std::vector<Tensor>&& grads) {
  Tensor current = variable_.grad();
  variable_.set_grad(Tensor());  // drop our extra reference so the slot can be adopted
  Accumulate(&current, std::move(grads[0]));
  variable_.set_grad(current);
  return {};
}

}  // namespace gw::autograd
