#include "gradwire/nn/attention.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/attention.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

namespace k = kernels;

std::string Shown(const Tensor& t) { return t.defined() ? ShapeToString(t.sizes()) : "undefined"; }

// Causal: key s is masked for query l when s > l (bool [l, s]).
Tensor CausalMask(int64_t l, int64_t s) {
  return k::Gt(k::Reshape(Tensor::Arange(0, static_cast<double>(s)), {1, s}),
               k::Reshape(Tensor::Arange(0, static_cast<double>(l)), {l, 1}));
}

// A bool mask as the float one it means (-inf where true); a float one as it is.
Tensor Additive(const Tensor& mask, DType dtype) {
  if (mask.dtype() != DType::kBool) return mask;
  return k::MaskedFill(Tensor::Zeros(mask.sizes(), dtype), mask,
                       -std::numeric_limits<double>::infinity());
}

}  // namespace

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, Generator& gen,
                                       const MultiheadAttentionOptions& options)
    : Module("MultiheadAttention"),
      embed_dim_(embed_dim),
      num_heads_(num_heads),
      options_(options),
      gen_(gen.Fork()) {
  GW_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0, "MultiheadAttention",
           "embed_dim=", embed_dim, " must be a positive multiple of num_heads=", num_heads);
  GW_CHECK(options.dropout >= 0 && options.dropout < 1, "MultiheadAttention",
           "dropout must be in [0, 1), got ", options.dropout);
  const double bound = std::sqrt(6.0 / static_cast<double>(embed_dim + 3 * embed_dim));
  in_proj_weight_ = RegisterParameter(
      "in_proj_weight",
      Tensor::Uniform({3 * embed_dim, embed_dim}, -bound, bound, gen, options.dtype));
  if (options.bias) {
    in_proj_bias_ = RegisterParameter("in_proj_bias", Tensor::Zeros({3 * embed_dim}, options.dtype));
  }
  out_proj_ = RegisterModule(
      "out_proj", std::make_shared<Linear>(embed_dim, embed_dim, gen, options.bias, options.dtype));
  if (options.bias) k::Fill(out_proj_->bias(), 0);
}

std::string MultiheadAttention::ExtraRepr() const {
  return absl::StrCat("embed_dim=", embed_dim_, ", num_heads=", num_heads_,
                      ", dropout=", options_.dropout, ", bias=", in_proj_bias_.defined() ? "true" : "false",
                      ", batch_first=", options_.batch_first ? "true" : "false");
}

Tensor MultiheadAttention::Forward(const Tensor& input) {
  return Forward(input, input, input, {.need_weights = false}).first;
}

std::pair<Tensor, Tensor> MultiheadAttention::Forward(const Tensor& query, const Tensor& key,
                                                      const Tensor& value,
                                                      const AttentionArgs& args) {
  const std::string name =
      absl::StrCat("MultiheadAttention(embed_dim=", embed_dim_, ", num_heads=", num_heads_, ")");
  const int64_t e = embed_dim_;
  const std::string seq = options_.batch_first ? "[N, L, " : "[L, N, ";
  GW_CHECK(query.defined() && (query.dim() == 2 || query.dim() == 3) && query.size(-1) == e, name,
           "expected query ", seq, e, "] or [L, ", e, "], got ", Shown(query));
  const bool batched = query.dim() == 3;
  for (const Tensor* t : {&key, &value}) {
    GW_CHECK(t->defined() && t->dim() == query.dim() && t->size(-1) == e, name, "expected ",
             t == &key ? "key" : "value", " ", batched ? (options_.batch_first ? "[N, S, " : "[S, N, ") : "[S, ",
             e, "] for query ", ShapeToString(query.sizes()), ", got ", Shown(*t));
  }
  GW_CHECK(key.sizes() == value.sizes(), name, "key ", ShapeToString(key.sizes()),
           " and value ", ShapeToString(value.sizes()), " must have the same shape");
  const int batch_dim = options_.batch_first ? 0 : 1;
  GW_CHECK(!batched || query.size(batch_dim) == key.size(batch_dim), name, "query ",
           ShapeToString(query.sizes()), " and key ", ShapeToString(key.sizes()),
           " have different batch sizes");
  for (const Tensor* t : {&query, &key, &value}) {
    GW_CHECK(t->dtype() == options_.dtype, name, "expected ", DTypeName(options_.dtype),
             " inputs, got ", DTypeName(t->dtype()), " ", ShapeToString(t->sizes()));
  }

  // Views [N, L, E] of the projections (no copies) and back.
  auto to_batch_first = [&](const Tensor& t) {
    return !batched ? gw::Unsqueeze(t, 0) : options_.batch_first ? t : gw::Transpose(t, 0, 1);
  };
  auto from_batch_first = [&](const Tensor& t) {
    return !batched ? gw::Squeeze(t, 0) : options_.batch_first ? t : gw::Transpose(t, 0, 1);
  };
  const Tensor q_view = to_batch_first(query);
  const int64_t n = q_view.size(0), l = q_view.size(1), s = to_batch_first(key).size(1);
  const AttentionOptions options{.mask = Mask(args, batched, n, l, s),
                                 .dropout_p = is_training() ? options_.dropout : 0.0,
                                 .gen = &gen_,
                                 .need_weights = args.need_weights};
  AttentionResult r;
  if (query.is_same(key) && key.is_same(value)) {  // one GEMM projects q, k and v
    r = MultiHeadSelfAttention(to_batch_first(gw::Linear(query, in_proj_weight_, in_proj_bias_)),
                               num_heads_, options);
  } else {
    auto project = [&](const Tensor& x, int64_t i) {
      const Tensor w = gw::Narrow(in_proj_weight_, 0, i * e, e);
      const Tensor b = in_proj_bias_.defined() ? gw::Narrow(in_proj_bias_, 0, i * e, e) : Tensor();
      return to_batch_first(gw::Linear(x, w, b));
    };
    r = MultiHeadAttention(project(query, 0), project(key, 1), project(value, 2), num_heads_,
                           options);
  }
  const Tensor out = out_proj_->Forward(from_batch_first(r.output));
  Tensor weights = r.weights;
  if (weights.defined()) {
    if (args.average_attn_weights) weights = gw::Mean(weights, {1});
    if (!batched) weights = gw::Squeeze(weights, 0);
  }
  return {out, weights};
}

Tensor MultiheadAttention::Mask(const AttentionArgs& args, bool batched, int64_t n, int64_t l,
                                int64_t s) const {
  const std::string name =
      absl::StrCat("MultiheadAttention(embed_dim=", embed_dim_, ", num_heads=", num_heads_, ")");
  auto check_dtype = [&](const Tensor& m, const char* what) {
    GW_CHECK(m.dtype() == DType::kBool || m.dtype() == options_.dtype, name, what,
             " must be bool or ", DTypeName(options_.dtype), ", got ", DTypeName(m.dtype()));
  };
  Tensor attn = args.attn_mask;
  if (args.is_causal) {
    GW_CHECK(!attn.defined(), name, "pass either attn_mask or is_causal, not both");
    attn = CausalMask(l, s);
  }
  if (attn.defined()) {
    check_dtype(attn, "attn_mask");
    const int64_t nh = (batched ? n : 1) * num_heads_;
    const bool ok = (attn.dim() == 2 && attn.sizes() == Shape{l, s}) ||
                    (attn.dim() == 3 && attn.sizes() == Shape{nh, l, s});
    GW_CHECK(ok, name, "expected attn_mask [L, S] = [", l, ", ", s, "] or [", batched ? "N * " : "",
             "num_heads, L, S] = [", nh, ", ", l, ", ", s, "], got ", ShapeToString(attn.sizes()));
    if (attn.dim() == 3) attn = k::Reshape(attn, {n, num_heads_, l, s});
  }
  Tensor padding = args.key_padding_mask;
  if (padding.defined()) {
    check_dtype(padding, "key_padding_mask");
    const Shape want = batched ? Shape{n, s} : Shape{s};
    GW_CHECK(padding.sizes() == want, name, "expected key_padding_mask ",
             batched ? "[N, S] = " : "[S] = ", ShapeToString(want), ", got ",
             ShapeToString(padding.sizes()));
    padding = k::Reshape(padding, {n, 1, 1, s});
  }
  if (!attn.defined() || !padding.defined()) return attn.defined() ? attn : padding;
  return k::Add(Additive(attn, options_.dtype), Additive(padding, options_.dtype));
}

Tensor GenerateSquareSubsequentMask(int64_t size, DType dtype) {
  GW_CHECK(size >= 0, "GenerateSquareSubsequentMask", "size must be non-negative, got ", size);
  return Additive(CausalMask(size, size), dtype);
}

}  // namespace gw::nn
