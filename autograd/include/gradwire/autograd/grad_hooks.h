// Post-accumulate gradient hooks: code that runs as soon as a leaf's gradient of a
// backward pass is complete (PyTorch's register_post_accumulate_grad_hook). It is the
// seam DistributedDataParallel uses to start a bucket's allreduce while the rest of the
// backward pass still runs.
//
// Contract
//   - AddPostAccumulateHook(leaf, fn) registers fn on a leaf tensor that requires grad
//     (gw::Error otherwise). In every later pass that reaches the leaf, fn(leaf, grad) runs
//     once, right after the leaf's gradient of that pass was accumulated: `grad` is the
//     accumulated gradient itself (leaf.grad() for a local pass; the pass's stored
//     gradient for a pass with a GradSink that keeps one, e.g. a distributed-autograd
//     context). fn may change grad's values in place (never its shape) and keep the
//     handle to do so later; it may block (the pass waits for it).
//   - Hooks run in registration order, on the thread running the pass, with gradient
//     recording off. An exception thrown by a hook ends the pass like a backward
//     function's error. Passes that only compute gradients (autograd::Grad) run no hooks.
//   - The returned HookHandle removes the hook when it is destroyed or Remove()d; it may
//     outlive the leaf. Adding and removing hooks while a pass runs over the same leaf
//     needs external synchronisation (as any change of a tensor's autograd state).
//   - AccumulateInPassSink(leaf, grad), called from inside a hook, adds grad to `leaf`'s
//     gradient in the running pass's GradSink (e.g. the distributed-autograd context's
//     store; runs no hooks) and returns true; it returns false, doing nothing, outside a
//     hook or when the pass has no sink (a local pass: the caller writes .grad()
//     itself). For gradients of leaves the pass never reached (DistributedDataParallel's
//     unused parameters).
#ifndef GRADWIRE_AUTOGRAD_GRAD_HOOKS_H_
#define GRADWIRE_AUTOGRAD_GRAD_HOOKS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gw::autograd {

using PostAccumulateHook = std::function<void(const Tensor& leaf, Tensor& grad)>;

// The hooks of one leaf (AutogradMeta::hooks).
class LeafHooks {
 public:
  uint64_t Add(PostAccumulateHook hook);
  void Remove(uint64_t id);
  void Run(const Tensor& leaf, Tensor& grad) const;
  bool empty() const { return hooks_.empty(); }

 private:
  uint64_t next_id_ = 1;
  std::vector<std::pair<uint64_t, PostAccumulateHook>> hooks_;
};

class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<LeafHooks> hooks, uint64_t id) : hooks_(std::move(hooks)), id_(id) {}
  ~HookHandle() { Remove(); }
  HookHandle(HookHandle&& other) noexcept : hooks_(std::move(other.hooks_)), id_(std::exchange(other.id_, 0)) {}
  HookHandle& operator=(HookHandle&& other) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;

  void Remove();

 private:
  std::weak_ptr<LeafHooks> hooks_;
  uint64_t id_ = 0;
};

[[nodiscard]] HookHandle AddPostAccumulateHook(const Tensor& leaf, PostAccumulateHook hook);

class GradSink;  // engine.h

// Runs the leaf's hooks, if it has any (the engine calls this), on `held` (a sink's
// gradient; an undefined one runs no hook) or, when null, on leaf.grad(). `sink` is the
// pass's (for AccumulateInPassSink), null for a local pass.
void RunPostAccumulateHooks(const Tensor& leaf, const Tensor* held = nullptr, GradSink* sink = nullptr);

bool AccumulateInPassSink(const Tensor& leaf, Tensor grad);

}  // namespace gw::autograd

#endif  // GRADWIRE_AUTOGRAD_GRAD_HOOKS_H_
