// MultiheadAttention, as torch.nn.MultiheadAttention (PyTorch 1.13): arguments, default
// initialisation, state-dict keys and results.
//
// Contract
//   - MultiheadAttention(embed_dim E, num_heads H): parameters in_proj_weight [3E, E]
//     (xavier_uniform), in_proj_bias [3E] (zeros), out_proj.weight [E, E] (Linear's init)
//     and out_proj.bias [E] (zeros); without `bias` neither bias exists. State-dict keys:
//     in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias.
//   - Forward(query, key, value, args) returns (output, weights). Batched inputs are
//     query [L, N, E], key and value [S, N, E] ([N, L, E] and [N, S, E] with batch_first);
//     unbatched ones [L, E] and [S, E]. The output has query's shape. The weights (when
//     args.need_weights) are [N, L, S] averaged over heads, or [N, H, L, S] without
//     average_attn_weights ([L, S] / [H, L, S] unbatched); they are the dropped-out
//     weights in training, as PyTorch 1.13 returns them, and are differentiable.
//   - Masks (no gradient): key_padding_mask [N, S] ([S] unbatched), attn_mask [L, S] or
//     [N*H, L, S] ([H, L, S] unbatched); bool masks mask out where true, float ones are
//     added to the scores (a float key_padding_mask is added too, where PyTorch would
//     refuse it next to a float attn_mask). is_causal masks key s for query l when s > l
//     (do not pass attn_mask with it). A query whose keys are all masked gets NaN, as in
//     PyTorch.
//   - Self-attention (query, key and value the same tensor) projects with one GEMM on
//     in_proj_weight and splits heads without copies (gradwire/autograd/attention.h);
//     otherwise q, k and v are projected separately. Dropout (on the attention weights)
//     applies in training mode only.
//   - Errors: gw::Error naming the module and the shapes, e.g. "MultiheadAttention(
//     embed_dim=8, num_heads=2): expected query [L, N, 8] or [L, 8], got [3, 2, 6]".
//   - Thread safety: concurrent Forward calls are safe except in training mode with
//     dropout > 0 (the module's own Generator, forked at construction, draws the masks).
#ifndef GRADWIRE_NN_ATTENTION_H_
#define GRADWIRE_NN_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "gradwire/nn/layers.h"
#include "gradwire/nn/module.h"

namespace gw::nn {

struct MultiheadAttentionOptions {
  double dropout = 0;  // on the attention weights, in training
  bool bias = true;
  bool batch_first = false;
  DType dtype = DType::kFloat32;
};

// Forward's optional arguments, as PyTorch's keyword arguments.
struct AttentionArgs {
  Tensor key_padding_mask = {};  // [N, S]: bool (true = ignore that key) or float (added)
  Tensor attn_mask = {};         // [L, S] or [N * num_heads, L, S]: bool or float (added)
  bool need_weights = true;
  bool average_attn_weights = true;
  bool is_causal = false;  // mask key s for query l when s > l
};

class MultiheadAttention final : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, Generator& gen,
                     const MultiheadAttentionOptions& options = {});

  // (output, weights); weights is undefined unless args.need_weights.
  std::pair<Tensor, Tensor> Forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const AttentionArgs& args = {});
  // Self-attention of `input`, without weights (for Sequential).
  Tensor Forward(const Tensor& input) override;

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  bool batch_first() const { return options_.batch_first; }
  const Tensor& in_proj_weight() const { return in_proj_weight_; }
  const Tensor& in_proj_bias() const { return in_proj_bias_; }
  Linear& out_proj() const { return *out_proj_; }

 protected:
  std::string ExtraRepr() const override;

 private:
  // The masks of `args` as one mask for gw::MultiHeadAttention (see attention.h there).
  Tensor Mask(const AttentionArgs& args, bool batched, int64_t n, int64_t l, int64_t s) const;

  int64_t embed_dim_, num_heads_;
  MultiheadAttentionOptions options_;
  Tensor in_proj_weight_, in_proj_bias_;
  std::shared_ptr<Linear> out_proj_;
  Generator gen_;
};

// PyTorch's nn.Transformer.generate_square_subsequent_mask: a float [size, size] mask, -inf
// above the diagonal (key s > query l) and 0 elsewhere.
Tensor GenerateSquareSubsequentMask(int64_t size, DType dtype = DType::kFloat32);

}  // namespace gw::nn

#endif  // GRADWIRE_NN_ATTENTION_H_
