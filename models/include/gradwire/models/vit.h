// SmallViT: a vision transformer for small images (Fashion-MNIST's 28x28), the attention
// model of the zoo.
//
// Contract
//   - The image is cut into patch x patch tiles (4x4: 49 tokens of 16 pixels, row by row),
//     patch Linear(patch*patch*channels, dim) embeds each, plus `pos`, a learned position
//     embedding [1, tokens, dim] (initialised N(0, 0.02^2)); then `encoder`, a
//     TransformerEncoder of `depth` pre-norm layers (heads, feed-forward mlp_dim, GELU,
//     dropout, batch_first); then `norm` LayerNorm(dim), the mean over tokens, and head
//     Linear(dim, num_classes): logits [N, num_classes].
//   - State-dict keys are those of the same model in PyTorch (bench/pytorch/zoo.py): pos,
//     patch.*, encoder.layers.<i>.self_attn.in_proj_weight, ..., norm.*, head.*. Layers
//     are initialised as PyTorch's TransformerEncoder does: copies of one layer.
//   - Input [N, C, H, W] or flattened [N, C*H*W] (models/images.h); H and W must be
//     multiples of the patch size (checked when the model is built).
#ifndef GRADWIRE_MODELS_VIT_H_
#define GRADWIRE_MODELS_VIT_H_

#include <memory>

#include "gradwire/models/images.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/module.h"
#include "gradwire/nn/normalization.h"
#include "gradwire/nn/transformer.h"

namespace gw::models {

struct VitOptions {
  ImageShape input{};
  int64_t patch = 4;
  int64_t dim = 128;
  int64_t depth = 4;
  int64_t heads = 4;
  int64_t mlp_dim = 256;
  double dropout = 0.1;
  int64_t num_classes = 10;
  DType dtype = DType::kFloat32;
};

class SmallViT final : public nn::Module {
 public:
  explicit SmallViT(Generator& gen, const VitOptions& options = {});
  Tensor Forward(const Tensor& images) override;

 protected:
  std::string ExtraRepr() const override;

 private:
  VitOptions options_;
  Tensor pos_;
  std::shared_ptr<nn::Linear> patch_, head_;
  std::shared_ptr<nn::TransformerEncoder> encoder_;
  std::shared_ptr<nn::LayerNorm> norm_;
};

}  // namespace gw::models

#endif  // GRADWIRE_MODELS_VIT_H_
