// TransformerEncoderLayer and TransformerEncoder, as torch.nn's (PyTorch 1.13): arguments,
// defaults, initialisation, state-dict keys and results.
//
// Contract
//   - TransformerEncoderLayer(d_model, nhead, {dim_feedforward = 2048, dropout = 0.1,
//     activation "relu" | "gelu", layer_norm_eps = 1e-5, batch_first, norm_first}) holds
//     self_attn (MultiheadAttention), linear1 [ff, d], dropout, linear2 [d, ff], norm1,
//     norm2 (LayerNorm), dropout1, dropout2, registered in PyTorch's order, so its
//     state-dict keys are PyTorch's: self_attn.in_proj_weight, self_attn.in_proj_bias,
//     self_attn.out_proj.weight, self_attn.out_proj.bias, linear1.weight, linear1.bias,
//     linear2.weight, linear2.bias, norm1.weight, norm1.bias, norm2.weight, norm2.bias.
//   - Forward(src, src_mask, src_key_padding_mask): src [S, N, d] ([N, S, d] with
//     batch_first, [S, d] unbatched); the masks as MultiheadAttention's attn_mask and
//     key_padding_mask. Post-norm (default): x = norm1(x + sa(x)); x = norm2(x + ff(x)).
//     Pre-norm (norm_first): x = x + sa(norm1(x)); x = x + ff(norm2(x)). sa is dropout1 of
//     the self-attention, ff is dropout2(linear2(dropout(activation(linear1(x))))).
//   - TransformerEncoder(layer, num_layers, gen, norm) stacks num_layers copies of `layer`
//     under layers.0, layers.1, ... and applies `norm` (optional, key prefix norm.) last.
//     As PyTorch (which deep-copies the layer), every copy starts with `layer`'s weights
//     and mode; training then moves them apart. Each copy's dropout draws from its own
//     Generator forked from `gen`, so no two layers drop the same units. `layer` itself is
//     not used afterwards. The constructor from options makes that layer first.
//   - Results match PyTorch's (its "slow path"; PyTorch's eval-mode fast path, which gives
//     zeros at padded positions of nested tensors, is not imitated).
//   - Errors: gw::Error naming the module and the shapes, e.g.
//     "TransformerEncoderLayer(d_model=8, nhead=2): expected src [S, N, 8] or [S, 8], got
//     [4, 6]"; an activation other than relu/gelu and d_model not divisible by nhead too.
//   - Thread safety: as MultiheadAttention and Dropout: concurrent Forward calls are safe
//     in eval mode (or with dropout 0).
#ifndef GRADWIRE_NN_TRANSFORMER_H_
#define GRADWIRE_NN_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/nn/attention.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/module.h"
#include "gradwire/nn/normalization.h"

namespace gw::nn {

struct TransformerEncoderLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu" (exact)
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  DType dtype = DType::kFloat32;
};

class TransformerEncoderLayer final : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, Generator& gen,
                          const TransformerEncoderLayerOptions& options = {});

  Tensor Forward(const Tensor& src) override;
  // Masks may be undefined.
  Tensor Forward(const Tensor& src, const Tensor& src_mask,
                 const Tensor& src_key_padding_mask = {});

  // A copy with the same options, weights and mode, whose dropout draws from generators
  // forked from `gen` (what PyTorch's copy.deepcopy of a layer gives).
  std::shared_ptr<TransformerEncoderLayer> Clone(Generator& gen) const;

  int64_t d_model() const { return d_model_; }
  int64_t nhead() const { return nhead_; }
  const TransformerEncoderLayerOptions& options() const { return options_; }
  MultiheadAttention& self_attn() const { return *self_attn_; }
  Linear& linear1() const { return *linear1_; }
  Linear& linear2() const { return *linear2_; }
  LayerNorm& norm1() const { return *norm1_; }
  LayerNorm& norm2() const { return *norm2_; }

  std::string ToString() const override;

 private:
  Tensor SelfAttentionBlock(const Tensor& x, const Tensor& mask, const Tensor& padding);
  Tensor FeedForwardBlock(const Tensor& x);

  int64_t d_model_, nhead_;
  TransformerEncoderLayerOptions options_;
  std::shared_ptr<MultiheadAttention> self_attn_;
  std::shared_ptr<Linear> linear1_, linear2_;
  std::shared_ptr<Dropout> dropout_, dropout1_, dropout2_;
  std::shared_ptr<LayerNorm> norm1_, norm2_;
  bool gelu_;  // else relu
};

class TransformerEncoder final : public Module {
 public:
  // num_layers copies of `layer` (see above); `norm` (may be null) runs after the last.
  TransformerEncoder(const TransformerEncoderLayer& layer, int64_t num_layers, Generator& gen,
                     std::shared_ptr<Module> norm = nullptr);
  // The same with TransformerEncoderLayer(d_model, nhead, gen, options) as the layer.
  TransformerEncoder(int64_t d_model, int64_t nhead, int64_t num_layers, Generator& gen,
                     const TransformerEncoderLayerOptions& options = {},
                     std::shared_ptr<Module> norm = nullptr);

  Tensor Forward(const Tensor& src) override;
  Tensor Forward(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = {});

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  TransformerEncoderLayer& layer(int64_t i) const { return *layers_.at(static_cast<size_t>(i)); }
  // The final norm, or null.
  Module* norm() const { return norm_.get(); }

  std::string ToString() const override;

 private:
  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers_;
  std::shared_ptr<Module> norm_;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_TRANSFORMER_H_
