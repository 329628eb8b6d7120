// Differentiable fused multi-head attention over gw::kernels' attention kernels
// (gradwire/tensor/attention.h): the forward runs there, and one backward node with one
// or two outputs (the attention output and, when asked, the weights) calls its backward.
#include "gradwire/autograd/attention.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/autograd/function.h"
#include "gradwire/autograd/node.h"
#include "gradwire/tensor/attention.h"
#include "gradwire/tensor/kernels.h"

namespace gw {
namespace {

using autograd::SavedTensor;

constexpr const char* kBackward = "MultiHeadAttentionBackward";

// What the backward reads of the forward's state, saved so that in-place changes are
// detected.
struct Saved {
  explicit Saved(const kernels::AttentionState& f)
      : q(f.q), k(f.k), v(f.v), weights(f.weights), dropped(f.dropped), scale(f.scale),
        dropout_p(f.dropout_p) {}

  kernels::AttentionState Get() const {
    return {.output = Tensor(),
            .q = q.Get(kBackward),
            .k = k.Get(kBackward),
            .v = v.Get(kBackward),
            .weights = weights.Get(kBackward),
            .dropped = dropped.Get(kBackward),
            .scale = scale,
            .dropout_p = dropout_p};
  }

  SavedTensor q, k, v, weights, dropped;
  double scale, dropout_p;
};

// The backward of one attention call. Its inputs are the gradients of the output and,
// with need_weights, of the weights; its outputs those of qkv (packed) or of q, k and v.
class AttentionBackward final : public autograd::Node {
 public:
  AttentionBackward(const kernels::AttentionState& forward, bool packed, AttentionGradMask need)
      : saved_(std::make_unique<Saved>(forward)), packed_(packed), need_(need) {}

  std::string name() const override { return kBackward; }
  void ReleaseVariables() override { saved_.reset(); }

  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override {
    GW_CHECK(saved_ != nullptr, kBackward,
             "trying to run backward through the graph a second time (its saved tensors were "
             "freed after the first pass); pass retain_graph=true to the first backward");
    const Tensor& g = grads[0];
    const Tensor gw = grads.size() > 1 ? grads[1] : Tensor();
    const kernels::AttentionState forward = saved_->Get();
    if (packed_) return {kernels::MultiHeadSelfAttentionBackward(forward, g, gw)};
    kernels::AttentionGrads out = kernels::MultiHeadAttentionBackward(forward, g, gw, need_);
    return {std::move(out.q), std::move(out.k), std::move(out.v)};
  }

 private:
  std::unique_ptr<Saved> saved_;  // null once released
  bool packed_;
  AttentionGradMask need_;
};

AttentionArgs KernelArgs(int64_t num_heads, const AttentionOptions& options) {
  return {.num_heads = num_heads,
          .mask = options.mask,
          .dropout_p = options.dropout_p,
          .gen = options.gen,
          .scale = options.scale};
}

// The result of the forward `f`, with the backward recorded for `inputs` (qkv alone when
// packed).
AttentionResult Recorded(kernels::AttentionState f, const std::vector<Tensor>& inputs,
                         bool packed, bool need_weights) {
  AttentionResult result{.output = f.output,
                         .weights = need_weights ? f.dropped : Tensor()};
  if (!autograd::AnyRequiresGrad(inputs)) return result;
  const AttentionGradMask need =
      packed ? AttentionGradMask{}
             : AttentionGradMask{inputs[0].requires_grad(), inputs[1].requires_grad(),
                                 inputs[2].requires_grad()};
  auto node = std::make_shared<AttentionBackward>(f, packed, need);
  for (const Tensor& t : inputs) node->add_next_edge(autograd::GradientEdge(t));
  autograd::SetHistory(result.output, node);
  if (need_weights) {
    // The weights tensor is saved for the backward too; hand out a separate handle.
    result.weights = kernels::View(f.dropped, f.dropped.sizes());
    autograd::SetHistory(result.weights, node);
  }
  return result;
}

}  // namespace

AttentionResult MultiHeadAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   int64_t num_heads, const AttentionOptions& options) {
  return Recorded(kernels::MultiHeadAttentionForward(q, k, v, KernelArgs(num_heads, options)),
                  {q, k, v}, /*packed=*/false, options.need_weights);
}

AttentionResult MultiHeadSelfAttention(const Tensor& qkv, int64_t num_heads,
                                       const AttentionOptions& options) {
  return Recorded(kernels::MultiHeadSelfAttentionForward(qkv, KernelArgs(num_heads, options)),
                  {qkv}, /*packed=*/true, options.need_weights);
}

}  // namespace gw
