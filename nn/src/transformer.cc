#include "gradwire/nn/transformer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gradwire/autograd/functions.h"

namespace gw::nn {
namespace {

// "Type(\n  (name): child\n  ...\n)", children indented as PyTorch prints them.
std::string WithChildren(const Module& m) {
  std::string out = m.type_name() + "(\n";
  for (const auto& [name, child] : m.children()) {
    absl::StrAppend(&out, "  (", name, "): ",
                    absl::StrReplaceAll(child->ToString(), {{"\n", "\n  "}}), "\n");
  }
  return out + ")";
}

// The container of the encoder's layers (torch.nn.ModuleList): children named 0, 1, ...
class ModuleList final : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void Push(std::shared_ptr<Module> m) {
    RegisterModule(std::to_string(children().size()), std::move(m));
  }
  std::string ToString() const override { return WithChildren(*this); }
};

}  // namespace

// ---------------------------------------------------------------- encoder layer

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, Generator& gen,
                                                 const TransformerEncoderLayerOptions& options)
    : Module("TransformerEncoderLayer"),
      d_model_(d_model),
      nhead_(nhead),
      options_(options),
      gelu_(options.activation == "gelu") {
  GW_CHECK(options.activation == "relu" || options.activation == "gelu", type_name(),
           "activation should be relu/gelu, not ", options.activation);
  GW_CHECK(d_model > 0 && nhead > 0 && d_model % nhead == 0, type_name(), "d_model=", d_model,
           " must be a positive multiple of nhead=", nhead);
  const DType dtype = options.dtype;
  self_attn_ = RegisterModule(
      "self_attn", std::make_shared<MultiheadAttention>(
                       d_model, nhead, gen,
                       MultiheadAttentionOptions{.dropout = options.dropout,
                                                 .batch_first = options.batch_first,
                                                 .dtype = dtype}));
  linear1_ = RegisterModule(
      "linear1", std::make_shared<Linear>(d_model, options.dim_feedforward, gen, true, dtype));
  dropout_ = RegisterModule("dropout", std::make_shared<Dropout>(options.dropout, gen));
  linear2_ = RegisterModule(
      "linear2", std::make_shared<Linear>(options.dim_feedforward, d_model, gen, true, dtype));
  const LayerNormOptions norm{.eps = options.layer_norm_eps, .dtype = dtype};
  norm1_ = RegisterModule("norm1", std::make_shared<LayerNorm>(Shape{d_model}, norm));
  norm2_ = RegisterModule("norm2", std::make_shared<LayerNorm>(Shape{d_model}, norm));
  dropout1_ = RegisterModule("dropout1", std::make_shared<Dropout>(options.dropout, gen));
  dropout2_ = RegisterModule("dropout2", std::make_shared<Dropout>(options.dropout, gen));
}

std::shared_ptr<TransformerEncoderLayer> TransformerEncoderLayer::Clone(Generator& gen) const {
  auto copy = std::make_shared<TransformerEncoderLayer>(d_model_, nhead_, gen, options_);
  const absl::Status status = copy->LoadStateDict(StateDict());
  GW_CHECK(status.ok(), type_name(), "Clone: ", status.ToString());
  copy->Train(is_training());
  return copy;
}

Tensor TransformerEncoderLayer::Forward(const Tensor& src) { return Forward(src, Tensor()); }

Tensor TransformerEncoderLayer::Forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask) {
  GW_CHECK(src.defined() && (src.dim() == 2 || src.dim() == 3) && src.size(-1) == d_model_,
           absl::StrCat(type_name(), "(d_model=", d_model_, ", nhead=", nhead_, ")"),
           "expected src ", options_.batch_first ? "[N, S, " : "[S, N, ", d_model_, "] or [S, ",
           d_model_, "], got ", src.defined() ? ShapeToString(src.sizes()) : "undefined");
  Tensor x = src;
  if (options_.norm_first) {
    x = x + SelfAttentionBlock(norm1_->Forward(x), src_mask, src_key_padding_mask);
    return x + FeedForwardBlock(norm2_->Forward(x));
  }
  x = norm1_->Forward(x + SelfAttentionBlock(x, src_mask, src_key_padding_mask));
  return norm2_->Forward(x + FeedForwardBlock(x));
}

Tensor TransformerEncoderLayer::SelfAttentionBlock(const Tensor& x, const Tensor& mask,
                                                   const Tensor& padding) {
  const Tensor attended =
      self_attn_->Forward(x, x, x, {.key_padding_mask = padding, .attn_mask = mask,
                                    .need_weights = false}).first;
  return dropout1_->Forward(attended);
}

Tensor TransformerEncoderLayer::FeedForwardBlock(const Tensor& x) {
  const Tensor hidden = linear1_->Forward(x);
  const Tensor activated = gelu_ ? gw::Gelu(hidden) : gw::Relu(hidden);
  return dropout2_->Forward(linear2_->Forward(dropout_->Forward(activated)));
}

std::string TransformerEncoderLayer::ToString() const { return WithChildren(*this); }

// ---------------------------------------------------------------- encoder

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& layer, int64_t num_layers,
                                       Generator& gen, std::shared_ptr<Module> norm)
    : Module("TransformerEncoder"), norm_(std::move(norm)) {
  GW_CHECK(num_layers > 0, type_name(), "num_layers must be positive, got ", num_layers);
  auto list = RegisterModule("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < num_layers; ++i) {
    layers_.push_back(layer.Clone(gen));
    list->Push(layers_.back());
  }
  if (norm_) RegisterModule("norm", norm_);
}

TransformerEncoder::TransformerEncoder(int64_t d_model, int64_t nhead, int64_t num_layers,
                                       Generator& gen,
                                       const TransformerEncoderLayerOptions& options,
                                       std::shared_ptr<Module> norm)
    : TransformerEncoder(TransformerEncoderLayer(d_model, nhead, gen, options), num_layers, gen,
                         std::move(norm)) {}

Tensor TransformerEncoder::Forward(const Tensor& src) { return Forward(src, Tensor()); }

Tensor TransformerEncoder::Forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask) {
  Tensor x = src;
  for (const auto& layer : layers_) x = layer->Forward(x, mask, src_key_padding_mask);
  return norm_ ? norm_->Forward(x) : x;
}

std::string TransformerEncoder::ToString() const { return WithChildren(*this); }

}  // namespace gw::nn
