#include "gradwire/models/vit.h"

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/kernels.h"

namespace gw::models {

SmallViT::SmallViT(Generator& gen, const VitOptions& options) : Module("SmallViT"), options_(options) {
  const ImageShape& in = options.input;
  GW_CHECK(options.patch > 0 && in.height % options.patch == 0 && in.width % options.patch == 0, "SmallViT",
           "a ", in.height, "x", in.width, " image does not split into ", options.patch, "x", options.patch,
           " patches");
  const int64_t tokens = (in.height / options.patch) * (in.width / options.patch);
  pos_ = RegisterParameter(
      "pos", kernels::MulScalar(Tensor::Randn({1, tokens, options.dim}, gen, options.dtype), 0.02));
  patch_ = RegisterModule("patch", std::make_shared<nn::Linear>(options.patch * options.patch * in.channels,
                                                                options.dim, gen, true, options.dtype));
  encoder_ = RegisterModule(
      "encoder", std::make_shared<nn::TransformerEncoder>(
                     options.dim, options.heads, options.depth, gen,
                     nn::TransformerEncoderLayerOptions{.dim_feedforward = options.mlp_dim,
                                                        .dropout = options.dropout,
                                                        .activation = "gelu",
                                                        .batch_first = true,
                                                        .norm_first = true,
                                                        .dtype = options.dtype}));
  norm_ = RegisterModule("norm", std::make_shared<nn::LayerNorm>(
                                     Shape{options.dim}, nn::LayerNormOptions{.dtype = options.dtype}));
  head_ = RegisterModule("head", std::make_shared<nn::Linear>(options.dim, options.num_classes, gen, true,
                                                              options.dtype));
}

Tensor SmallViT::Forward(const Tensor& images) {
  const ImageShape& in = options_.input;
  const int64_t p = options_.patch, rows = in.height / p, cols = in.width / p;
  const Tensor x = AsImages(images, "SmallViT", in);
  const int64_t n = x.size(0);
  // [N, C, rows*p, cols*p] -> [N, rows, cols, C, p, p] -> [N, tokens, C*p*p]
  const Tensor tiles = Permute(Reshape(x, {n, in.channels, rows, p, cols, p}), {0, 2, 4, 1, 3, 5});
  const Tensor patches = Reshape(tiles, {n, rows * cols, in.channels * p * p});
  const Tensor h = encoder_->Forward(patch_->Forward(patches) + pos_);
  return head_->Forward(Mean(norm_->Forward(h), {1}));
}

std::string SmallViT::ExtraRepr() const {
  return absl::StrCat("patch=", options_.patch, ", dim=", options_.dim, ", depth=", options_.depth,
                      ", heads=", options_.heads, ", mlp_dim=", options_.mlp_dim, ", dropout=", options_.dropout);
}

}  // namespace gw::models
