// Batch, layer and group normalization: one kernel of our own (templated over the element
// type; float64, group norm, parameter-only gradients) and oneDNN's batch and layer
// normalization primitives for float32.
#include "gradwire/tensor/normalization.h"

#include <bit>
#include <cmath>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "dispatch.h"
#include "dnnl_util.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

// ---------------------------------------------------------------- layouts

// A contiguous input seen as [n, c, s], with one statistic per channel over n and s (batch
// norm: group == 1, !per_sample) or one per (sample, group of `group` channels) over the
// group's channels and s (group norm; layer norm is one group of c = D elements, s == 1).
// The affine weight and bias are indexed by the channel.
struct Layout {
  int64_t n = 1, c = 1, s = 1;
  int64_t group = 1;
  bool per_sample = false;

  int64_t groups() const { return c / group; }
  int64_t num_stats() const { return (per_sample ? n : 1) * groups(); }
  int64_t stat(int64_t ni, int64_t ci) const { return (per_sample ? ni * groups() : 0) + ci / group; }
  // Elements each statistic covers.
  int64_t count() const { return (per_sample ? 1 : n) * group * s; }

  // f(statistic, channel, offset of the channel's s elements) for every (sample, channel).
  template <typename F>
  void ForEachRow(F&& f) const {
    for (int64_t ni = 0; ni < n; ++ni) {
      for (int64_t ci = 0; ci < c; ++ci) f(stat(ni, ci), ci, (ni * c + ci) * s);
    }
  }
};

int64_t Product(const Shape& sizes, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= sizes[i];
  return p;
}

Layout ChannelLayout(std::string_view op, const Tensor& x) {
  internal::CheckDefined(op, x);
  GW_CHECK(x.dim() >= 2, op, "expected input [N, C, *], got ", ShapeToString(x.sizes()));
  const Shape& s = x.sizes();
  return Layout{.n = s[0], .c = s[1], .s = Product(s, 2, s.size())};
}

Layout BatchLayout(std::string_view op, const Tensor& x) { return ChannelLayout(op, x); }

Layout GroupLayout(std::string_view op, const Tensor& x, int64_t num_groups) {
  Layout l = ChannelLayout(op, x);
  GW_CHECK(num_groups > 0 && l.c % num_groups == 0, op, "num_groups=", num_groups,
           " must divide the channels of input ", ShapeToString(x.sizes()));
  l.group = l.c / num_groups;
  l.per_sample = true;
  return l;
}

Layout LayerLayout(std::string_view op, const Tensor& x, int64_t normalized_ndim) {
  internal::CheckDefined(op, x);
  GW_CHECK(normalized_ndim >= 1 && normalized_ndim <= x.dim(), op, "cannot normalize the last ",
           normalized_ndim, " dims of input ", ShapeToString(x.sizes()));
  const Shape& s = x.sizes();
  const size_t lead = s.size() - static_cast<size_t>(normalized_ndim);
  const int64_t d = Product(s, lead, s.size());
  return Layout{.n = Product(s, 0, lead), .c = d, .s = 1, .group = d, .per_sample = true};
}

Shape LayerParamShape(const Tensor& x, int64_t normalized_ndim) {
  return Shape(x.sizes().end() - normalized_ndim, x.sizes().end());
}

// `t` (when defined) must have shape `want` and x's dtype.
void CheckArg(std::string_view op, std::string_view what, const Tensor& t, const Shape& want,
              const Tensor& x) {
  if (!t.defined()) return;
  internal::CheckDefined(op, t);
  GW_CHECK(t.sizes() == want, op, what, " must be ", ShapeToString(want), " for input ",
           ShapeToString(x.sizes()), ", got ", ShapeToString(t.sizes()));
  internal::CheckSameDType(op, x, t);
}

void CheckStats(std::string_view op, const Tensor& mean, const Tensor& var, const Layout& l,
                const Tensor& x) {
  GW_CHECK(mean.defined() && var.defined(), op, "mean and var are required");
  CheckArg(op, "mean", mean, {l.num_stats()}, x);
  CheckArg(op, "var", var, {l.num_stats()}, x);
}

void CheckGrad(std::string_view op, const Tensor& grad, const Tensor& x) {
  internal::CheckDefined(op, grad);
  GW_CHECK(grad.sizes() == x.sizes(), op, "gradient ", ShapeToString(grad.sizes()),
           " does not match input ", ShapeToString(x.sizes()));
  internal::CheckSameDType(op, x, grad);
}

template <typename T>
T* DataOrNull(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// ---------------------------------------------------------------- gradwire's own kernel

template <typename T>
void OwnStats(const Layout& l, const T* x, T* mean, T* var) {
  const int64_t k = l.num_stats();
  const double inv = 1.0 / static_cast<double>(l.count());
  std::vector<double> acc(static_cast<size_t>(k), 0.0), mu(static_cast<size_t>(k));
  l.ForEachRow([&](int64_t st, int64_t, int64_t off) {
    double sum = 0;
    for (int64_t i = 0; i < l.s; ++i) sum += x[off + i];
    acc[st] += sum;
  });
  for (int64_t i = 0; i < k; ++i) {
    mu[i] = acc[i] * inv;
    acc[i] = 0;
  }
  l.ForEachRow([&](int64_t st, int64_t, int64_t off) {
    const double m = mu[st];
    double sq = 0;
    for (int64_t i = 0; i < l.s; ++i) {
      const double d = x[off + i] - m;
      sq += d * d;
    }
    acc[st] += sq;
  });
  for (int64_t i = 0; i < k; ++i) {
    mean[i] = static_cast<T>(mu[i]);
    var[i] = static_cast<T>(acc[i] * inv);
  }
}

// out = (x - mean) * rstd * weight + bias, as x * a + b per row.
template <typename T>
void OwnNormalize(const Layout& l, const T* x, const T* mean, const T* var, const T* weight,
                  const T* bias, double eps, T* out) {
  l.ForEachRow([&](int64_t st, int64_t ci, int64_t off) {
    const double rstd = 1.0 / std::sqrt(static_cast<double>(var[st]) + eps);
    const double a = rstd * (weight ? static_cast<double>(weight[ci]) : 1.0);
    const T ta = static_cast<T>(a);
    const T tb = static_cast<T>((bias ? static_cast<double>(bias[ci]) : 0.0) - mean[st] * a);
    for (int64_t i = 0; i < l.s; ++i) out[off + i] = x[off + i] * ta + tb;
  });
}

// With x_hat = (x - mean) * rstd and w the weight (1 when undefined):
//   dweight[c] = sum g * x_hat, dbias[c] = sum g over the channel's elements;
//   dx = rstd * (g * w - A / m - x_hat * B / m), A = sum g * w, B = sum g * w * x_hat over
//   the m elements of x's statistic, when the statistics are x's own (batch_stats);
//   dx = rstd * w * g when they are fixed.
template <typename T>
void OwnBackward(const Layout& l, const T* g, const T* x, const T* mean, const T* var,
                 const T* weight, double eps, bool batch_stats, NormGradMask mask, T* dx, T* dw,
                 T* db) {
  const int64_t k = l.num_stats();
  std::vector<double> rstd(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) rstd[i] = 1.0 / std::sqrt(static_cast<double>(var[i]) + eps);
  auto w = [&](int64_t ci) { return weight ? static_cast<double>(weight[ci]) : 1.0; };

  const bool sums = mask.weight || mask.bias || (mask.input && batch_stats);
  std::vector<double> sum_gw(sums ? k : 0, 0.0), sum_gwx(sums ? k : 0, 0.0);
  std::vector<double> sum_gx(sums ? l.c : 0, 0.0), sum_g(sums ? l.c : 0, 0.0);
  if (sums) {
    l.ForEachRow([&](int64_t st, int64_t ci, int64_t off) {
      const double m = mean[st];
      double sg = 0, sgx = 0;
      for (int64_t i = 0; i < l.s; ++i) {
        sg += g[off + i];
        sgx += g[off + i] * (x[off + i] - m);
      }
      sgx *= rstd[st];
      sum_g[ci] += sg;
      sum_gx[ci] += sgx;
      sum_gw[st] += w(ci) * sg;
      sum_gwx[st] += w(ci) * sgx;
    });
  }
  for (int64_t ci = 0; ci < l.c; ++ci) {
    if (mask.weight) dw[ci] = static_cast<T>(sum_gx[ci]);
    if (mask.bias) db[ci] = static_cast<T>(sum_g[ci]);
  }
  if (!mask.input) return;
  const double inv_m = 1.0 / static_cast<double>(l.count());
  l.ForEachRow([&](int64_t st, int64_t ci, int64_t off) {
    const double r = rstd[st];
    const T alpha = static_cast<T>(r * w(ci));
    // rstd * x_hat * B / m = (x - mean) * rstd^2 * B / m.
    const T beta = batch_stats ? static_cast<T>(-r * r * sum_gwx[st] * inv_m) : T(0);
    const T gamma = batch_stats ? static_cast<T>(-r * sum_gw[st] * inv_m) : T(0);
    const T m = mean[st];
    for (int64_t i = 0; i < l.s; ++i) {
      dx[off + i] = g[off + i] * alpha + (x[off + i] - m) * beta + gamma;
    }
  });
}

NormResult OwnForward(std::string_view op, const Layout& l, const Tensor& x, const Tensor& weight,
                      const Tensor& bias, double eps) {
  NormResult r{Tensor::Empty(x.sizes(), x.dtype()), Tensor::Empty({l.num_stats()}, x.dtype()),
               Tensor::Empty({l.num_stats()}, x.dtype())};
  internal::DispatchFloating(op, x.dtype(), [&]<typename T>() {
    OwnStats<T>(l, x.data<T>(), r.mean.data<T>(), r.var.data<T>());
    OwnNormalize<T>(l, x.data<T>(), r.mean.data<T>(), r.var.data<T>(), DataOrNull<T>(weight),
                    DataOrNull<T>(bias), eps, r.out.data<T>());
  });
  return r;
}

NormGrads OwnGrads(std::string_view op, const Layout& l, const Tensor& grad, const Tensor& x,
                   const Tensor& mean, const Tensor& var, const Tensor& weight, double eps,
                   bool batch_stats, NormGradMask mask, const Shape& param_shape) {
  NormGrads out;
  if (mask.input) out.input = Tensor::Empty(x.sizes(), x.dtype());
  if (mask.weight) out.weight = Tensor::Empty(param_shape, x.dtype());
  if (mask.bias) out.bias = Tensor::Empty(param_shape, x.dtype());
  internal::DispatchFloating(op, x.dtype(), [&]<typename T>() {
    OwnBackward<T>(l, grad.data<T>(), x.data<T>(), mean.data<T>(), var.data<T>(),
                   DataOrNull<T>(weight), eps, batch_stats, mask, DataOrNull<T>(out.input),
                   DataOrNull<T>(out.weight), DataOrNull<T>(out.bias));
  });
  return out;
}

// ---------------------------------------------------------------- oneDNN (float32)

using dnnl::normalization_flags;
using dnnl::prop_kind;
using Key = std::vector<int64_t>;

// A primitive descriptor and its primitive, built once per key: building a descriptor
// walks oneDNN's implementation list, executing a built primitive does not. Bounded: a
// full cache starts over (shapes in a training loop are few).
template <typename Prim>
struct Built {
  typename Prim::primitive_desc pd;
  Prim prim;
};

template <typename Prim>
class PrimitiveCache {
 public:
  template <typename MakePd>
  std::shared_ptr<const Built<Prim>> Get(const Key& key, MakePd&& make_pd) {
    {
      absl::MutexLock lock(&mu_);
      if (auto it = map_.find(key); it != map_.end()) return it->second;
    }
    typename Prim::primitive_desc pd = make_pd();
    auto built = std::make_shared<const Built<Prim>>(Built<Prim>{pd, Prim(pd)});
    absl::MutexLock lock(&mu_);
    if (map_.size() >= kMaxEntries) map_.clear();
    return map_.try_emplace(key, std::move(built)).first->second;
  }

 private:
  static constexpr size_t kMaxEntries = 512;
  absl::Mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<const Built<Prim>>> map_ ABSL_GUARDED_BY(mu_);
};

Key MakeKey(const Shape& dims, normalization_flags flags, double eps, prop_kind prop) {
  Key key(dims.begin(), dims.end());
  key.push_back(static_cast<int64_t>(flags));
  key.push_back(std::bit_cast<int32_t>(static_cast<float>(eps)));
  key.push_back(static_cast<int64_t>(prop));
  return key;
}

normalization_flags AffineFlags(bool scale, bool shift) {
  normalization_flags f = normalization_flags::none;
  if (scale) f |= normalization_flags::use_scale;
  if (shift) f |= normalization_flags::use_shift;
  return f;
}

// oneDNN's two normalizations differ in their descriptors only: batch norm on x as
// [N, C, S, 1] with statistics [C] (oneDNN 2.6 has a vectorised kernel for plain 2-D and 4-D
// data, not for 3-D), layer norm on x as [R, D] with statistics [R].
struct BatchNormPrims {
  using Fwd = dnnl::batch_normalization_forward;
  using Bwd = dnnl::batch_normalization_backward;
  static Shape Dims(const Layout& l) { return {l.n, l.c, l.s, 1}; }
  static Fwd::desc FwdDesc(prop_kind prop, const Shape& dims, float eps, normalization_flags f) {
    return Fwd::desc(prop, internal::ContiguousDesc(dims), eps, f);
  }
  static Bwd::desc BwdDesc(prop_kind prop, const Shape& dims, float eps, normalization_flags f) {
    const dnnl::memory::desc md = internal::ContiguousDesc(dims);
    return Bwd::desc(prop, md, md, eps, f);
  }
};

struct LayerNormPrims {
  using Fwd = dnnl::layer_normalization_forward;
  using Bwd = dnnl::layer_normalization_backward;
  static Shape Dims(const Layout& l) { return {l.n, l.c}; }
  static Fwd::desc FwdDesc(prop_kind prop, const Shape& dims, float eps, normalization_flags f) {
    return Fwd::desc(prop, internal::ContiguousDesc(dims), internal::ContiguousDesc({dims[0]}),
                     eps, f);
  }
  static Bwd::desc BwdDesc(prop_kind prop, const Shape& dims, float eps, normalization_flags f) {
    const dnnl::memory::desc md = internal::ContiguousDesc(dims);
    return Bwd::desc(prop, md, md, internal::ContiguousDesc({dims[0]}), eps, f);
  }
};

template <typename P>
std::shared_ptr<const Built<typename P::Fwd>> ForwardPrim(const Shape& dims, float eps,
                                                          normalization_flags flags,
                                                          prop_kind prop) {
  static PrimitiveCache<typename P::Fwd> cache;
  return cache.Get(MakeKey(dims, flags, eps, prop), [&] {
    return typename P::Fwd::primitive_desc(P::FwdDesc(prop, dims, eps, flags),
                                           internal::CpuEngine());
  });
}

template <typename P>
std::shared_ptr<const Built<typename P::Bwd>> BackwardPrim(const Shape& dims, float eps,
                                                           normalization_flags flags,
                                                           prop_kind prop) {
  static PrimitiveCache<typename P::Bwd> cache;
  return cache.Get(MakeKey(dims, flags, eps, prop), [&] {
    auto hint = ForwardPrim<P>(dims, eps, flags, prop_kind::forward_training);
    return typename P::Bwd::primitive_desc(P::BwdDesc(prop, dims, eps, flags),
                                           internal::CpuEngine(), hint->pd);
  });
}

dnnl::memory Mem(const dnnl::memory::desc& md, const Tensor& t) {
  return dnnl::memory(md, internal::CpuEngine(), t.raw_data());
}

dnnl::memory Vec(const Tensor& t) {
  return Mem(internal::ContiguousDesc({t.numel()}), t);
}

// Forward on oneDNN. With `stats` given (eval batch norm) they are used, else computed
// into r.mean and r.var. x, weight, bias, stats: contiguous float32.
template <typename P>
NormResult DnnlForward(std::string_view op, const Layout& l, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, double eps,
                       const Tensor* given_mean = nullptr, const Tensor* given_var = nullptr) {
  const bool global = given_mean != nullptr;
  normalization_flags flags = AffineFlags(weight.defined(), bias.defined());
  if (global) flags |= normalization_flags::use_global_stats;
  const prop_kind prop = global ? prop_kind::forward_inference : prop_kind::forward_training;
  const Shape dims = P::Dims(l);
  NormResult r{Tensor::Empty(x.sizes(), DType::kFloat32),
               global ? *given_mean : Tensor::Empty({l.num_stats()}, DType::kFloat32),
               global ? *given_var : Tensor::Empty({l.num_stats()}, DType::kFloat32)};
  internal::RunDnnl(op, [&](dnnl::stream& stream) {
    auto fwd = ForwardPrim<P>(dims, static_cast<float>(eps), flags, prop);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, Mem(fwd->pd.src_desc(), x)},
        {DNNL_ARG_DST, Mem(fwd->pd.dst_desc(), r.out)},
        {DNNL_ARG_MEAN, Vec(r.mean)},
        {DNNL_ARG_VARIANCE, Vec(r.var)}};
    if (weight.defined()) args[DNNL_ARG_SCALE] = Vec(weight);
    if (bias.defined()) args[DNNL_ARG_SHIFT] = Vec(bias);
    fwd->prim.execute(stream, args);
  });
  return r;
}

// Backward on oneDNN; the caller guarantees mask.input (parameter-only gradients go to the
// own kernel, which needs no dx pass). Gradients of parameters come from prop backward.
template <typename P>
NormGrads DnnlBackward(std::string_view op, const Layout& l, const Tensor& grad, const Tensor& x,
                       const Tensor& mean, const Tensor& var, const Tensor& weight, double eps,
                       bool batch_stats, NormGradMask mask, const Shape& param_shape) {
  const bool params = (mask.weight && weight.defined()) || mask.bias;
  normalization_flags flags = AffineFlags(weight.defined(), mask.bias);
  if (!batch_stats) flags |= normalization_flags::use_global_stats;
  const prop_kind prop = params ? prop_kind::backward : prop_kind::backward_data;
  NormGrads out;
  out.input = Tensor::Empty(x.sizes(), DType::kFloat32);
  Tensor dw = weight.defined() && params ? Tensor::Empty(param_shape, DType::kFloat32) : Tensor();
  Tensor db = mask.bias ? Tensor::Empty(param_shape, DType::kFloat32) : Tensor();
  internal::RunDnnl(op, [&](dnnl::stream& stream) {
    auto bwd = BackwardPrim<P>(P::Dims(l), static_cast<float>(eps), flags, prop);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, Mem(bwd->pd.src_desc(), x)},
        {DNNL_ARG_DIFF_DST, Mem(bwd->pd.diff_dst_desc(), grad)},
        {DNNL_ARG_DIFF_SRC, Mem(bwd->pd.diff_src_desc(), out.input)},
        {DNNL_ARG_MEAN, Vec(mean)},
        {DNNL_ARG_VARIANCE, Vec(var)}};
    if (weight.defined()) args[DNNL_ARG_SCALE] = Vec(weight);
    if (dw.defined()) args[DNNL_ARG_DIFF_SCALE] = Vec(dw);
    if (db.defined()) {
      args[DNNL_ARG_DIFF_SHIFT] = Vec(db);
      // The backward never reads the shift, but oneDNN asks for it with use_shift.
      args[DNNL_ARG_SHIFT] = Vec(Tensor::Zeros(param_shape, DType::kFloat32));
    }
    bwd->prim.execute(stream, args);
  });
  if (mask.weight) out.weight = weight.defined() ? dw : Tensor();
  if (mask.bias) out.bias = db;
  return out;
}

// oneDNN runs float32 with at least one element; the rest goes to the own kernel.
bool UseDnnl(const Tensor& x) { return x.dtype() == DType::kFloat32 && x.numel() > 0; }

Tensor Dense(const Tensor& t) { return t.defined() ? Contiguous(t) : t; }

}  // namespace

// ---------------------------------------------------------------- batch norm

NormResult BatchNormForward(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                            double eps) {
  constexpr std::string_view op = "BatchNorm";
  const Layout l = BatchLayout(op, x_in);
  CheckArg(op, "weight", weight_in, {l.c}, x_in);
  CheckArg(op, "bias", bias_in, {l.c}, x_in);
  const Tensor x = Contiguous(x_in), weight = Dense(weight_in), bias = Dense(bias_in);
  if (UseDnnl(x)) return DnnlForward<BatchNormPrims>(op, l, x, weight, bias, eps);
  return OwnForward(op, l, x, weight, bias, eps);
}

Tensor BatchNormInference(const Tensor& x_in, const Tensor& mean_in, const Tensor& var_in,
                          const Tensor& weight_in, const Tensor& bias_in, double eps) {
  constexpr std::string_view op = "BatchNorm";
  const Layout l = BatchLayout(op, x_in);
  CheckStats(op, mean_in, var_in, l, x_in);
  CheckArg(op, "weight", weight_in, {l.c}, x_in);
  CheckArg(op, "bias", bias_in, {l.c}, x_in);
  const Tensor x = Contiguous(x_in), mean = Dense(mean_in), var = Dense(var_in);
  const Tensor weight = Dense(weight_in), bias = Dense(bias_in);
  if (UseDnnl(x)) return DnnlForward<BatchNormPrims>(op, l, x, weight, bias, eps, &mean, &var).out;
  Tensor out = Tensor::Empty(x.sizes(), x.dtype());
  internal::DispatchFloating(op, x.dtype(), [&]<typename T>() {
    OwnNormalize<T>(l, x.data<T>(), mean.data<T>(), var.data<T>(), DataOrNull<T>(weight),
                    DataOrNull<T>(bias), eps, out.data<T>());
  });
  return out;
}

NormGrads BatchNormBackward(const Tensor& grad_in, const Tensor& x_in, const Tensor& mean_in,
                            const Tensor& var_in, const Tensor& weight_in, double eps,
                            bool batch_stats, NormGradMask mask) {
  constexpr std::string_view op = "BatchNormBackward";
  const Layout l = BatchLayout(op, x_in);
  CheckGrad(op, grad_in, x_in);
  CheckStats(op, mean_in, var_in, l, x_in);
  CheckArg(op, "weight", weight_in, {l.c}, x_in);
  const Tensor grad = Contiguous(grad_in), x = Contiguous(x_in), mean = Dense(mean_in),
               var = Dense(var_in), weight = Dense(weight_in);
  if (UseDnnl(x) && mask.input) {
    return DnnlBackward<BatchNormPrims>(op, l, grad, x, mean, var, weight, eps, batch_stats,
                                        mask, {l.c});
  }
  return OwnGrads(op, l, grad, x, mean, var, weight, eps, batch_stats, mask, {l.c});
}

// ---------------------------------------------------------------- layer norm

NormResult LayerNormForward(const Tensor& x_in, int64_t normalized_ndim, const Tensor& weight_in,
                            const Tensor& bias_in, double eps) {
  constexpr std::string_view op = "LayerNorm";
  const Layout l = LayerLayout(op, x_in, normalized_ndim);
  const Shape param_shape = LayerParamShape(x_in, normalized_ndim);
  CheckArg(op, "weight", weight_in, param_shape, x_in);
  CheckArg(op, "bias", bias_in, param_shape, x_in);
  const Tensor x = Contiguous(x_in), weight = Dense(weight_in), bias = Dense(bias_in);
  if (UseDnnl(x)) return DnnlForward<LayerNormPrims>(op, l, x, weight, bias, eps);
  return OwnForward(op, l, x, weight, bias, eps);
}

NormGrads LayerNormBackward(const Tensor& grad_in, const Tensor& x_in, const Tensor& mean_in,
                            const Tensor& var_in, const Tensor& weight_in,
                            int64_t normalized_ndim, double eps, NormGradMask mask) {
  constexpr std::string_view op = "LayerNormBackward";
  const Layout l = LayerLayout(op, x_in, normalized_ndim);
  const Shape param_shape = LayerParamShape(x_in, normalized_ndim);
  CheckGrad(op, grad_in, x_in);
  CheckStats(op, mean_in, var_in, l, x_in);
  CheckArg(op, "weight", weight_in, param_shape, x_in);
  const Tensor grad = Contiguous(grad_in), x = Contiguous(x_in), mean = Dense(mean_in),
               var = Dense(var_in), weight = Dense(weight_in);
  if (UseDnnl(x) && mask.input) {
    return DnnlBackward<LayerNormPrims>(op, l, grad, x, mean, var, weight, eps,
                                        /*batch_stats=*/true, mask, param_shape);
  }
  return OwnGrads(op, l, grad, x, mean, var, weight, eps, /*batch_stats=*/true, mask, param_shape);
}

// ---------------------------------------------------------------- group norm

NormResult GroupNormForward(const Tensor& x_in, int64_t num_groups, const Tensor& weight_in,
                            const Tensor& bias_in, double eps) {
  constexpr std::string_view op = "GroupNorm";
  const Layout l = GroupLayout(op, x_in, num_groups);
  CheckArg(op, "weight", weight_in, {l.c}, x_in);
  CheckArg(op, "bias", bias_in, {l.c}, x_in);
  return OwnForward(op, l, Contiguous(x_in), Dense(weight_in), Dense(bias_in), eps);
}

NormGrads GroupNormBackward(const Tensor& grad, const Tensor& x, const Tensor& mean,
                            const Tensor& var, const Tensor& weight, int64_t num_groups,
                            double eps, NormGradMask mask) {
  constexpr std::string_view op = "GroupNormBackward";
  const Layout l = GroupLayout(op, x, num_groups);
  CheckGrad(op, grad, x);
  CheckStats(op, mean, var, l, x);
  CheckArg(op, "weight", weight, {l.c}, x);
  return OwnGrads(op, l, Contiguous(grad), Contiguous(x), Dense(mean), Dense(var), Dense(weight),
                  eps, /*batch_stats=*/true, mask, {l.c});
}

}  // namespace gw::kernels
