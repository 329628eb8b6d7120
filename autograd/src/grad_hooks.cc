#include "gradwire/autograd/grad_hooks.h"

#include "gradwire/autograd/engine.h"

#include <algorithm>

#include "gradwire/autograd/grad_mode.h"

namespace gw::autograd {

uint64_t LeafHooks::Add(PostAccumulateHook hook) {
  const uint64_t id = next_id_++;
  hooks_.emplace_back(id, std::move(hook));
  return id;
}

void LeafHooks::Remove(uint64_t id) {
  std::erase_if(hooks_, [id](const auto& h) { return h.first == id; });
}

void LeafHooks::Run(const Tensor& leaf, Tensor& grad) const {
  const auto hooks = hooks_;  // a hook may remove itself (or others) while running
  for (const auto& [id, hook] : hooks) hook(leaf, grad);
}

HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    Remove();
    hooks_ = std::move(other.hooks_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void HookHandle::Remove() {
  if (id_ == 0) return;
  if (auto hooks = hooks_.lock()) hooks->Remove(id_);
  id_ = 0;
  hooks_.reset();
}

HookHandle AddPostAccumulateHook(const Tensor& leaf, PostAccumulateHook hook) {
  GW_CHECK(leaf.defined() && leaf.requires_grad() && leaf.autograd_meta().grad_fn == nullptr,
           "AddPostAccumulateHook", "hooks go on leaf tensors that require grad (parameters)");
  std::shared_ptr<LeafHooks>& hooks = leaf.autograd_meta().hooks;
  if (hooks == nullptr) hooks = std::make_shared<LeafHooks>();
  const uint64_t id = hooks->Add(std::move(hook));
  return HookHandle(hooks, id);
}

namespace {
// While hooks run on this thread: whether, and the pass's sink (null: a local pass).
thread_local int t_hook_depth = 0;
thread_local GradSink* t_hook_sink = nullptr;
}  // namespace

void RunPostAccumulateHooks(const Tensor& leaf, const Tensor* held, GradSink* sink) {
  if (!leaf.requires_grad()) return;
  const std::shared_ptr<LeafHooks> hooks = leaf.autograd_meta().hooks;  // a hook may remove itself
  if (hooks == nullptr || hooks->empty()) return;
  Tensor grad = held != nullptr ? *held : leaf.grad();  // a handle: in-place changes reach the holder
  if (!grad.defined()) return;
  NoGradGuard no_grad;
  GradSink* const outer_sink = t_hook_sink;
  ++t_hook_depth;
  t_hook_sink = sink;
  struct Restore {
    GradSink* sink;
    ~Restore() {
      t_hook_sink = sink;
      --t_hook_depth;
    }
  } restore{outer_sink};
  hooks->Run(leaf, grad);
}

bool AccumulateInPassSink(const Tensor& leaf, Tensor grad) {
  if (t_hook_depth == 0 || t_hook_sink == nullptr) return false;
  t_hook_sink->Accumulate(leaf, std::move(grad));
  return true;
}

}  // namespace gw::autograd
