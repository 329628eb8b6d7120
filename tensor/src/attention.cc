// Fused multi-head attention kernels (attention.h): per (batch, head) GEMMs on strided views
// of the projections (no copies to split or merge heads), one softmax over all rows, the
// counter-based dropout of the weights, and the backward of all of it.
#include "gradwire/tensor/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "dispatch.h"
#include "dnnl_util.h"
#include "dropout.h"
#include "gemm.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

constexpr const char* kOp = "MultiHeadAttention";
constexpr const char* kBackward = "MultiHeadAttentionBackward";

// ---------------------------------------------------------------- matrices and GEMM

// A matrix inside a tensor's storage: element (i, j) at data[i * rs + j * cs].
template <typename T>
struct Mat {
  T* data;
  int64_t rs, cs;
  Mat<T> t() const { return {data, cs, rs}; }
};

// The matrices (i, j) of a 4-D tensor [I, J, rows, cols] (none of an undefined one);
// T may be const.
template <typename T>
class Mats {
 public:
  explicit Mats(const Tensor& t) {
    if (!t.defined()) return;
    base_ = t.data<std::remove_const_t<T>>();
    s0_ = t.strides()[0];
    s1_ = t.strides()[1];
    rs_ = t.strides()[2];
    cs_ = t.strides()[3];
  }
  Mat<T> operator()(int64_t i, int64_t j) const { return {base_ + i * s0_ + j * s1_, rs_, cs_}; }

 private:
  T* base_ = nullptr;
  int64_t s0_ = 0, s1_ = 0, rs_ = 0, cs_ = 0;
};

// Whether BLAS can read a rows x cols matrix with these strides (gemm.h's LayoutOf).
bool BlasReadable(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return internal::LayoutOf(rows, cols, rs, cs).has_value();
}

// c[m, n] = alpha * a[m, k] b[k, n] + beta * c on gemm.h's GEMM (oneDNN's sgemm for
// float, the blocked loop for double). REQUIRES: a and b BlasReadable; c has a unit
// column stride.
template <typename T>
void MatGemm(const Mat<const T>& a, const Mat<const T>& b, int64_t m, int64_t n, int64_t kk,
             double alpha, double beta, const Mat<T>& c) {
  if (m == 0 || n == 0) return;
  internal::RowMajorGemm<T>(internal::Operand(a.data, *internal::LayoutOf(m, kk, a.rs, a.cs)),
                            internal::Operand(b.data, *internal::LayoutOf(kk, n, b.rs, b.cs)),
                            m, n, kk, alpha, beta, c.data,
                            m == 1 ? std::max<int64_t>(n, 1) : c.rs);
}

// ---------------------------------------------------------------- softmax over rows

// In place over the rows of a contiguous [rows, n] tensor.
void SoftmaxRows(const Tensor& p) {
  if (p.numel() == 0) return;
  if (p.dtype() == DType::kFloat32) {
    static internal::PrimitiveCache<dnnl::softmax_forward> cache;
    const dnnl::memory::desc md = internal::PlainDesc(p);
    const dnnl::softmax_forward prim = *cache.Get({p.size(0), p.size(1)}, [&] {
      return dnnl::softmax_forward(
          {{dnnl::prop_kind::forward_training, md, 1}, internal::UserScratchpad(), internal::CpuEngine()});
    });
    internal::RunDnnl(kOp, [&](dnnl::stream& stream) {
      dnnl::memory mem = internal::Dnnl(p);
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, mem}, {DNNL_ARG_DST, mem}};
      std::vector<Tensor> keep;
      internal::AddScratchpad(prim, args, keep);
      prim.execute(stream, args);
    });
    return;
  }
  double* x = p.data<double>();
  const int64_t rows = p.size(0), n = p.size(1);
  for (int64_t r = 0; r < rows; ++r, x += n) {
    double max = x[0];
    for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - max));
    for (int64_t i = 0; i < n; ++i) x[i] /= sum;
  }
}

// dp := p * (dp - sum(dp * p)) row by row (softmax's backward, p its output), in place;
// both contiguous [rows, n].
void SoftmaxBackwardRows(const Tensor& p, const Tensor& dp) {
  if (p.numel() == 0) return;
  if (p.dtype() == DType::kFloat32) {
    static internal::PrimitiveCache<dnnl::softmax_backward> cache;
    const dnnl::memory::desc md = internal::PlainDesc(p);
    const dnnl::softmax_backward prim = *cache.Get({p.size(0), p.size(1)}, [&] {
      const dnnl::softmax_forward::primitive_desc hint(
          {dnnl::prop_kind::forward_training, md, 1}, internal::CpuEngine());
      return dnnl::softmax_backward({{md, md, 1}, internal::UserScratchpad(), internal::CpuEngine(), hint});
    });
    internal::RunDnnl(kBackward, [&](dnnl::stream& stream) {
      dnnl::memory grad = internal::Dnnl(dp);
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_DST, internal::Dnnl(p)}, {DNNL_ARG_DIFF_DST, grad}, {DNNL_ARG_DIFF_SRC, grad}};
      std::vector<Tensor> keep;
      internal::AddScratchpad(prim, args, keep);
      prim.execute(stream, args);
    });
    return;
  }
  const double* y = p.data<double>();
  double* g = dp.data<double>();
  const int64_t rows = p.size(0), n = p.size(1);
  for (int64_t r = 0; r < rows; ++r, y += n, g += n) {
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) dot += g[i] * y[i];
    for (int64_t i = 0; i < n; ++i) g[i] = y[i] * (g[i] - dot);
  }
}

// ---------------------------------------------------------------- layouts

std::string Shown(const Tensor& t) { return t.defined() ? ShapeToString(t.sizes()) : "undefined"; }

// [N, L, H*D] -> the view [N, H, L, D] of head h's columns (no copy).
Tensor HeadView(const Tensor& t, int64_t heads) {
  const int64_t d = t.size(2) / heads;
  return Tensor::FromStorage(t.storage(), t.dtype(), {t.size(0), heads, t.size(1), d},
                             {t.stride(0), d * t.stride(2), t.stride(1), t.stride(2)},
                             t.storage_offset());
}

// An uninitialised [n, l, e] tensor with e innermost: [N, L, E] in memory when
// batch_outer, else the transposed view of a contiguous [L, N, E] one.
Tensor EmptyInOrder(int64_t n, int64_t l, int64_t e, DType dtype, bool batch_outer) {
  if (batch_outer) return Tensor::Empty({n, l, e}, dtype);
  return Transpose(Tensor::Empty({l, n, e}, dtype), 0, 1);
}

// An uninitialised [N, L, e] tensor in the order of N and L of `t` [N, L, *].
Tensor EmptyLike(const Tensor& t, int64_t e) {
  return EmptyInOrder(t.size(0), t.size(1), e, t.dtype(), t.stride(0) >= t.stride(1));
}

// The same for the [N, L, *] tensor that the head view `t4` [N, H, L, *] was made from.
Tensor EmptyLikeHeads(const Tensor& t4, int64_t e) {
  return EmptyInOrder(t4.size(0), t4.size(2), e, t4.dtype(), t4.stride(0) >= t4.stride(2));
}

// `t` [N, L, E] when each head's [L, D] matrix is BLAS-readable, else a copy (E innermost,
// N and L in t's order).
Tensor HeadReady(const Tensor& t, int64_t heads) {
  const int64_t d = t.size(2) / heads;
  if (BlasReadable(t.size(1), d, t.stride(1), t.stride(2))) return t;
  Tensor copy = EmptyLike(t, t.size(2));
  CopyInPlace(copy, t);
  return copy;
}

// The mask as a float [N, H, L, S] view (stride 0 where it broadcasts) whose rows have a
// unit stride, or undefined without a mask.
Tensor MaskView(const Tensor& mask, const Shape& full, DType dtype) {
  if (!mask.defined()) return Tensor();
  bool ok = mask.dim() <= 4;
  for (int64_t d = 1; ok && d <= mask.dim(); ++d) {
    const int64_t size = mask.size(-d);
    ok = size == 1 || size == full[4 - d];
  }
  GW_CHECK(ok, kOp, "mask ", ShapeToString(mask.sizes()), " does not broadcast to [N, H, L, S] = ",
           ShapeToString(full));
  Tensor m = mask;
  if (m.dtype() == DType::kBool) {
    m = MaskedFill(Tensor::Zeros(m.sizes(), dtype), m, -std::numeric_limits<double>::infinity());
  }
  GW_CHECK(m.dtype() == dtype, kOp, "a float mask must have the inputs' dtype ",
           DTypeName(dtype), ", got ", DTypeName(m.dtype()));
  while (m.dim() < 4) m = Unsqueeze(m, 0);
  if (m.size(3) != full[3] || (m.stride(3) != 1 && full[3] > 1)) {
    m = Contiguous(Expand(m, {-1, -1, -1, full[3]}));
  }
  return Expand(m, full);
}

// ---------------------------------------------------------------- checks

void CheckOperand(const Tensor& t, const char* name) {
  GW_CHECK(t.defined() && t.dim() == 3, kOp, "expected ", name, " [N, L, E], got ", Shown(t));
  internal::CheckDefined(kOp, t);
  GW_CHECK(t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat64, kOp,
           "expected a float32 or float64 ", name, ", got ", DTypeName(t.dtype()));
}

void CheckArgs(const AttentionArgs& args) {
  GW_CHECK(args.dropout_p >= 0 && args.dropout_p <= 1, kOp, "dropout_p must be in [0, 1], got ",
           args.dropout_p);
  GW_CHECK(args.dropout_p == 0 || args.gen != nullptr, kOp, "dropout_p > 0 needs a Generator");
}

// ---------------------------------------------------------------- forward and backward

// The gradient of p from that of pd = dropout(p), in place: scaled where the weight was
// kept. No mask is kept: pd != 0 says which weights were, and a weight p == 0 gets no
// gradient either way.
template <typename T>
void DropoutBackward(const T* __restrict pd, T* __restrict grad, int64_t count, double scale) {
  const T s = static_cast<T>(scale);
  for (int64_t i = 0; i < count; ++i) grad[i] *= pd[i] != 0 ? s : T{0};
}

// Fills f.weights and f.dropped from the head views f.q, f.k, f.v and the mask view
// mask4 (or none), and writes the output's head view out4 [N, H, L, Dv].
void RunForward(AttentionState& f, const Tensor& mask4, Generator* gen, const Tensor& out4) {
  const int64_t n = f.q.size(0), h = f.q.size(1), l = f.q.size(2), d = f.q.size(3);
  const int64_t s = f.k.size(2), dv = f.v.size(3);
  f.weights = Tensor::Empty({n, h, l, s}, f.q.dtype());
  internal::DispatchFloating(kOp, f.q.dtype(), [&]<typename T>() {
    const Mats<const T> query(f.q), key(f.k), value(f.v), mask(mask4);
    const Mats<T> p(f.weights), out(out4);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) {
        const Mat<T> pij = p(i, j);
        if (mask4.defined()) {  // scores = mask + scale * q k^T, as torch.baddbmm
          const Mat<const T> mij = mask(i, j);
          for (int64_t r = 0; r < l; ++r) {
            std::memcpy(pij.data + r * pij.rs, mij.data + r * mij.rs, sizeof(T) * s);
          }
        }
        MatGemm<T>(query(i, j), key(i, j).t(), l, s, d, f.scale, mask4.defined() ? 1 : 0, pij);
      }
    }
    SoftmaxRows(View(f.weights, {n * h * l, s}));
    f.dropped = f.weights;
    if (f.dropout_p > 0) {
      f.dropped = Tensor::Empty(f.weights.sizes(), f.weights.dtype());
      internal::ApplyDropout<T>(*gen, f.dropout_p, f.weights.data<T>(), f.dropped.data<T>(),
                                f.weights.numel());
    }
    const Mats<const T> pd(f.dropped);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) MatGemm<T>(pd(i, j), value(i, j), l, dv, s, 1, 0, out(i, j));
    }
  });
}

// Gradients of q, k and v (head views [N, H, *, *] to write; undefined ones are skipped)
// from the output's gradient `grad_output` [N, L, H*Dv] and that of the dropped weights
// `grad_dropped` [N, H, L, S] (either undefined for zero, not both).
void RunBackward(const AttentionState& f, const Tensor& grad_output, const Tensor& grad_dropped,
                 const Tensor& dq4, const Tensor& dk4, const Tensor& dv4) {
  const Tensor& p = f.weights;
  const int64_t n = f.q.size(0), h = f.q.size(1), l = f.q.size(2), d = f.q.size(3);
  const int64_t s = f.k.size(2), dv = f.v.size(3);
  if (grad_output.defined()) {
    GW_CHECK(grad_output.dim() == 3 && grad_output.size(0) == n && grad_output.size(1) == l &&
                 grad_output.size(2) == h * dv && grad_output.dtype() == p.dtype(),
             kBackward, "expected a ", DTypeName(p.dtype()), " output gradient [", n, ", ", l,
             ", ", h * dv, "], got ", DTypeName(grad_output.dtype()), " ", Shown(grad_output));
  }
  if (grad_dropped.defined()) {
    GW_CHECK(grad_dropped.sizes() == p.sizes() && grad_dropped.dtype() == p.dtype(), kBackward,
             "expected a ", DTypeName(p.dtype()), " weights gradient ", Shown(p), ", got ",
             DTypeName(grad_dropped.dtype()), " ", Shown(grad_dropped));
  }
  const Tensor g4 = grad_output.defined() ? HeadView(HeadReady(grad_output, h), h) : Tensor();
  const bool need_scores = dq4.defined() || dk4.defined();
  internal::DispatchFloating(kBackward, p.dtype(), [&]<typename T>() {
    // d(pd) = g v^T (+ grad_dropped); dv = pd^T g.
    Tensor dp;
    if (need_scores) {
      dp = grad_dropped.defined() ? Clone(grad_dropped) : Tensor::Empty(p.sizes(), p.dtype());
    }
    const Mats<const T> query(f.q), key(f.k), value(f.v), weights(f.dropped), g(g4);
    const Mats<T> dpd(dp), dq(dq4), dk(dk4), dvm(dv4);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) {
        if (g4.defined() && need_scores) {
          MatGemm<T>(g(i, j), value(i, j).t(), l, s, dv, 1, grad_dropped.defined() ? 1 : 0,
                     dpd(i, j));
        }
        if (dv4.defined()) {
          const Mat<T> dvij = dvm(i, j);
          if (g4.defined()) {
            MatGemm<T>(weights(i, j).t(), g(i, j), s, dv, l, 1, 0, dvij);
          } else {
            for (int64_t r = 0; r < s; ++r) std::fill_n(dvij.data + r * dvij.rs, dv, T{0});
          }
        }
      }
    }
    if (!need_scores) return;
    if (f.dropout_p > 0) {
      DropoutBackward(f.dropped.data<T>(), dp.data<T>(), dp.numel(), 1.0 / (1.0 - f.dropout_p));
    }
    SoftmaxBackwardRows(View(p, {n * h * l, s}), View(dp, {n * h * l, s}));
    // dq = scale * ds k; dk = scale * ds^T q.
    const Mats<const T> ds(dp);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) {
        if (dq4.defined()) MatGemm<T>(ds(i, j), key(i, j), l, d, s, f.scale, 0, dq(i, j));
        if (dk4.defined()) MatGemm<T>(ds(i, j).t(), query(i, j), s, d, l, f.scale, 0, dk(i, j));
      }
    }
  });
}

// The forward on q, k and v [N, *, E] (checked by the caller, except the mask).
AttentionState Forward(const Tensor& query, const Tensor& key, const Tensor& value,
                       const AttentionArgs& args) {
  const int64_t heads = args.num_heads;
  const int64_t n = query.size(0), l = query.size(1), e = query.size(2), s = key.size(1);
  AttentionState f;
  const Tensor q = HeadReady(query, heads);
  f.q = HeadView(q, heads);
  f.k = HeadView(HeadReady(key, heads), heads);
  f.v = HeadView(HeadReady(value, heads), heads);
  f.scale =
      args.scale.value_or(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(e / heads, 1))));
  f.dropout_p = args.dropout_p;
  const Tensor mask4 = MaskView(args.mask, {n, heads, l, s}, q.dtype());
  f.output = EmptyLike(q, value.size(2));
  RunForward(f, mask4, args.gen, HeadView(f.output, heads));
  return f;
}

}  // namespace

AttentionState MultiHeadAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionArgs& args) {
  CheckOperand(q, "q");
  CheckOperand(k, "k");
  CheckOperand(v, "v");
  CheckArgs(args);
  GW_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), kOp, "dtype mismatch: q ",
           DTypeName(q.dtype()), ", k ", DTypeName(k.dtype()), ", v ", DTypeName(v.dtype()));
  GW_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0) && k.size(1) == v.size(1) &&
               q.size(2) == k.size(2),
           kOp, "expected q [N, L, E], k [N, S, E] and v [N, S, Ev], got q ", Shown(q), ", k ",
           Shown(k), ", v ", Shown(v));
  const int64_t heads = args.num_heads;
  GW_CHECK(heads > 0 && q.size(2) % heads == 0 && v.size(2) % heads == 0, kOp,
           "the widths of q ", Shown(q), " and v ", Shown(v), " must be multiples of num_heads=",
           heads);
  return Forward(q, k, v, args);
}

AttentionState MultiHeadSelfAttentionForward(const Tensor& qkv, const AttentionArgs& args) {
  CheckOperand(qkv, "qkv");
  CheckArgs(args);
  const int64_t heads = args.num_heads;
  GW_CHECK(heads > 0 && qkv.size(2) % (3 * heads) == 0, kOp, "the width of qkv ", Shown(qkv),
           " must be a multiple of 3 * num_heads=", 3 * heads);
  const int64_t e = qkv.size(2) / 3;
  return Forward(Narrow(qkv, 2, 0, e), Narrow(qkv, 2, e, e), Narrow(qkv, 2, 2 * e, e), args);
}

AttentionGrads MultiHeadAttentionBackward(const AttentionState& forward,
                                          const Tensor& grad_output, const Tensor& grad_dropped,
                                          AttentionGradMask need) {
  AttentionGrads grads;
  if (!grad_output.defined() && !grad_dropped.defined()) return grads;
  const int64_t heads = forward.q.size(1);
  auto grad_of = [&](const Tensor& t4) {
    return EmptyLikeHeads(t4, heads * t4.size(3));
  };
  if (need.q) grads.q = grad_of(forward.q);
  if (need.k) grads.k = grad_of(forward.k);
  if (need.v) grads.v = grad_of(forward.v);
  auto heads_of = [&](const Tensor& t) { return t.defined() ? HeadView(t, heads) : Tensor(); };
  RunBackward(forward, grad_output, grad_dropped, heads_of(grads.q), heads_of(grads.k),
              heads_of(grads.v));
  return grads;
}

Tensor MultiHeadSelfAttentionBackward(const AttentionState& forward, const Tensor& grad_output,
                                      const Tensor& grad_dropped) {
  if (!grad_output.defined() && !grad_dropped.defined()) return Tensor();
  const int64_t heads = forward.q.size(1), e = heads * forward.q.size(3);
  GW_CHECK(forward.k.size(3) == forward.q.size(3) && forward.v.size(3) == forward.q.size(3),
           kBackward, "expected the state of a self-attention (q, k and v of one width), got "
           "heads of q ", Shown(forward.q), ", k ", Shown(forward.k), ", v ", Shown(forward.v));
  // One gradient for qkv; those of q, k and v are its three column blocks.
  Tensor grad = EmptyLikeHeads(forward.q, 3 * e);
  RunBackward(forward, grad_output, grad_dropped, HeadView(Narrow(grad, 2, 0, e), heads),
              HeadView(Narrow(grad, 2, e, e), heads), HeadView(Narrow(grad, 2, 2 * e, e), heads));
  return grad;
}

}  // namespace gw::kernels
