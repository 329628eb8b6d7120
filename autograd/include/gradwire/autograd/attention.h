// Differentiable multi-head scaled dot-product attention, fused: the scores, the mask, the
// softmax, the dropout of the weights and their product with the values run as one op
// with one backward (what torch.nn.functional.multi_head_attention_forward computes
// between its in- and out-projections).
//
// Contract
//   - Heads sit side by side in the last dim: q [N, L, H*D], k [N, S, H*D], v [N, S, H*Dv]
//     (N batch, L target and S source length, H = num_heads). For each batch n and head h,
//       weights = softmax(scale * q_h k_h^T + mask)     (scale = 1/sqrt(D) by default)
//       out_h   = dropout(weights) v_h
//     and out [N, L, H*Dv] holds the heads side by side again, ready for the output
//     projection. Nothing is copied to split or merge heads: any strides work (operands
//     whose matrices are neither row- nor column-major are copied once).
//   - The output is laid out in q's order of N and L: for q a transposed view of a
//     sequence-first [L, N, E] tensor, out is the transposed view of a contiguous [L, N, E]
//     one, so transposing it back costs nothing.
//   - mask: undefined, float (added to the scores; -inf masks out) or bool (true masks out),
//     broadcastable to [N, H, L, S] (e.g. [L, S], [N, 1, 1, S], [N, H, L, S]). It gets no
//     gradient. A row with every score masked gives NaN weights, as in PyTorch.
//   - Dropout (dropout_p > 0, which needs `gen`) zeroes weights with probability p and
//     scales the rest by 1/(1-p); the returned weights are the dropped-out ones, as
//     PyTorch 1.13's MultiheadAttention returns them. Pass dropout_p = 0 in eval mode.
//   - need_weights also returns the weights [N, H, L, S] (contiguous, differentiable: a
//     loss on them back-propagates too).
//   - MultiHeadSelfAttention takes the packed projection qkv [N, L, 3*H*D] (q, k and v side
//     by side, as one fused in-projection GEMM makes them) and writes its gradient into one
//     tensor shaped like qkv, so the in-projection's backward is one GEMM too.
//   - The math is gw::kernels' (gradwire/tensor/attention.h): float32 runs its GEMMs on
//     oneDNN's sgemm and the softmax (forward and backward) on oneDNN's softmax primitives;
//     float64 (and the reference) on gradwire's own loops. The backward computes only the
//     gradients some input needs.
//   - Errors: gw::Error naming the op and the shapes (mismatched dims, a mask that does not
//     broadcast, a dimension not divisible by num_heads, mixed dtypes).
//   - Thread safety: concurrent calls are safe (the Generator, when given, is not shared).
#ifndef GRADWIRE_AUTOGRAD_ATTENTION_H_
#define GRADWIRE_AUTOGRAD_ATTENTION_H_

#include <cstdint>
#include <optional>

#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/tensor.h"

namespace gw {

struct AttentionOptions {
  Tensor mask = {};             // float (added) or bool (true = masked out); see above
  double dropout_p = 0;         // on the attention weights; REQUIRES gen when > 0
  Generator* gen = nullptr;     // not owned
  bool need_weights = false;    // also return the weights [N, H, L, S]
  std::optional<double> scale = std::nullopt;  // default 1 / sqrt(head_dim)
};

struct AttentionResult {
  Tensor output;   // [N, L, H*Dv]
  Tensor weights;  // [N, H, L, S] when need_weights, else undefined
};

AttentionResult MultiHeadAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   int64_t num_heads, const AttentionOptions& options = {});

// Self-attention on the packed projection qkv [N, L, 3*H*D] (q, k, v side by side).
AttentionResult MultiHeadSelfAttention(const Tensor& qkv, int64_t num_heads,
                                       const AttentionOptions& options = {});

}  // namespace gw

#endif  // GRADWIRE_AUTOGRAD_ATTENTION_H_
