// gw::kernels multi-head scaled dot-product attention, fused, forward and backward (raw
// math, no autograd; gradwire/autograd/attention.h is the differentiable form and
// gradwire/nn/attention.h the module): the scores, the mask, the softmax, the dropout of
// the weights and their product with the values, as torch.nn.functional's
// multi_head_attention_forward computes them between its in- and out-projections.
//
// Contract
//   - Heads sit side by side in the last dim: q [N, L, H*D], k [N, S, H*D], v [N, S, H*Dv]
//     (N batch, L target and S source length, H = num_heads). For each batch n and head h,
//       weights = softmax(scale * q_h k_h^T + mask)     (scale = 1/sqrt(D) by default)
//       out_h   = dropout(weights) v_h
//     and output [N, L, H*Dv] holds the heads side by side again. Nothing is copied to
//     split or merge heads: any strides work (an operand whose head matrices are neither
//     row- nor column-major is copied once, keeping its order of N and L).
//   - The output is laid out in q's order of N and L (E innermost): for q a transposed
//     view of a sequence-first [L, N, E] tensor, it is the transposed view of a contiguous
//     [L, N, E] one. Gradients follow their input's order the same way.
//   - mask: undefined, float (added to the scores; -inf masks out) or bool (true masks out),
//     broadcastable to [N, H, L, S]. A row with every score masked gives NaN weights.
//   - Dropout (dropout_p > 0, which needs `gen`) zeroes weights with probability p and
//     scales the rest by 1/(1-p), drawing one seed from `gen` per call for the
//     counter-based stream kernels::DropoutMask uses.
//   - *Forward returns the output and what *Backward reads: head views [N, H, L|S, D|Dv]
//     of the operands it read, the softmax output `weights` and the dropped-out weights
//     `dropped` (contiguous [N, H, L, S]; the same tensor as `weights` without dropout).
//   - *Backward takes that state and the gradients of the output and of `dropped` (either
//     may be undefined, meaning zero) and computes only the gradients `need` asks for
//     (undefined otherwise, and all undefined when both incoming gradients are).
//     MultiHeadSelfAttention* take the packed projection qkv [N, L, 3*H*D] (q, k and v side
//     by side, as one fused in-projection makes them) and return its gradient as one tensor
//     shaped like it, so the in-projection's backward is one GEMM too.
//   - float32 runs its GEMMs on oneDNN's sgemm and the softmax (forward and backward) on
//     oneDNN's softmax primitives (cached per shape); float64 on gradwire's own loops.
//   - Errors: gw::Error naming "MultiHeadAttention" and the shapes (ranks, mismatched dims,
//     a mask that does not broadcast, a width not divisible by num_heads, mixed dtypes,
//     dropout without a Generator).
//   - Thread safety: concurrent calls are safe (the Generator, when given, is not shared).
#ifndef GRADWIRE_TENSOR_ATTENTION_H_
#define GRADWIRE_TENSOR_ATTENTION_H_

#include <cstdint>
#include <optional>

#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/tensor.h"

namespace gw {

// Argument types live in namespace gw (not gw::kernels), as convolution.h's do.
struct AttentionArgs {
  int64_t num_heads = 1;
  Tensor mask = {};          // float (added) or bool (true = masked out); see above
  double dropout_p = 0;      // on the attention weights; REQUIRES gen when > 0
  Generator* gen = nullptr;  // not owned
  std::optional<double> scale = std::nullopt;  // default 1 / sqrt(head_dim)
};

// Which gradients a backward computes (MultiHeadSelfAttentionBackward: all of qkv's).
struct AttentionGradMask {
  bool q = true, k = true, v = true;
};

namespace kernels {

// The forward's result and what the backward reads.
struct AttentionState {
  Tensor output;    // [N, L, H*Dv]
  Tensor q, k, v;   // head views [N, H, L, D], [N, H, S, D], [N, H, S, Dv] of what was read
  Tensor weights;   // softmax output [N, H, L, S]
  Tensor dropped;   // dropout(weights) [N, H, L, S]; `weights` itself without dropout
  double scale = 1;
  double dropout_p = 0;
};

struct AttentionGrads {
  Tensor q, k, v;  // shaped like the inputs; undefined where not asked for
};

AttentionState MultiHeadAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionArgs& args);
AttentionGrads MultiHeadAttentionBackward(const AttentionState& forward,
                                          const Tensor& grad_output, const Tensor& grad_dropped,
                                          AttentionGradMask need = {});

// Self-attention on the packed projection qkv [N, L, 3*H*D].
AttentionState MultiHeadSelfAttentionForward(const Tensor& qkv, const AttentionArgs& args);
Tensor MultiHeadSelfAttentionBackward(const AttentionState& forward, const Tensor& grad_output,
                                      const Tensor& grad_dropped);

}  // namespace kernels
}  // namespace gw

#endif  // GRADWIRE_TENSOR_ATTENTION_H_
