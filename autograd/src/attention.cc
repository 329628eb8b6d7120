// Fused multi-head attention: per (batch, head) GEMMs on strided views of the projections
// (no copies to split or merge heads), one softmax over all rows, and a backward node of
// its own with one or two outputs (the attention output and, when asked, the weights).
#include "gradwire/autograd/attention.h"

#include <dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dispatch.h"
#include "dnnl_util.h"
#include "gradwire/autograd/function.h"
#include "gradwire/autograd/node.h"
#include "gradwire/tensor/kernels.h"

namespace gw {
namespace {

namespace k = kernels;
using autograd::SavedTensor;

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

// Whether BLAS can read a rows x cols matrix with these strides: row-major (unit column
// stride) or column-major (unit row stride), with a leading dimension that fits.
bool BlasReadable(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const bool row_major = (cs == 1 || cols == 1) && (rs >= cols || rows == 1);
  const bool col_major = (rs == 1 || rows == 1) && (cs >= rows || cols == 1);
  return row_major || col_major;
}

// BLAS's view of a BlasReadable matrix: transposed (column-major) or not, and its leading
// dimension, in the row-major convention of dnnl_sgemm.
template <typename T>
std::pair<bool, int64_t> BlasLayout(const Mat<T>& a, int64_t rows, int64_t cols) {
  if ((a.cs == 1 || cols == 1) && (a.rs >= cols || rows == 1)) {
    return {false, rows == 1 ? std::max<int64_t>(cols, 1) : a.rs};
  }
  return {true, cols == 1 ? std::max<int64_t>(rows, 1) : a.cs};
}

// c[m, n] = alpha * a[m, k] b[k, n] + beta * c, c row-major with leading dimension ldc.
// float runs on oneDNN's sgemm; double (and the reference) on a plain loop.
template <typename T>
void Gemm(const Mat<const T>& a, const Mat<const T>& b, int64_t m, int64_t n, int64_t kk,
          double alpha, double beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    const auto [ta, lda] = BlasLayout(a, m, kk);
    const auto [tb, ldb] = BlasLayout(b, kk, n);
    const dnnl_status_t status =
        dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, kk, static_cast<float>(alpha), a.data,
                   lda, b.data, ldb, static_cast<float>(beta), c, ldc);
    GW_CHECK(status == dnnl_success, kOp, "oneDNN sgemm failed with status ",
             static_cast<int>(status), " for m=", m, " n=", n, " k=", kk);
  } else {
    for (int64_t i = 0; i < m; ++i) {
      T* crow = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) crow[j] = beta == 0 ? T{0} : static_cast<T>(beta) * crow[j];
      for (int64_t p = 0; p < kk; ++p) {
        const T aip = static_cast<T>(alpha) * a.data[i * a.rs + p * a.cs];
        const T* brow = b.data + p * b.rs;
        for (int64_t j = 0; j < n; ++j) crow[j] += aip * brow[j * b.cs];
      }
    }
  }
}

// c (a matrix with unit column stride) = alpha * a b + beta * c.
template <typename T>
void Gemm(const Mat<const T>& a, const Mat<const T>& b, int64_t m, int64_t n, int64_t kk,
          double alpha, double beta, const Mat<T>& c) {
  Gemm<T>(a, b, m, n, kk, alpha, beta, c.data, m == 1 ? std::max<int64_t>(n, 1) : c.rs);
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
          {{dnnl::prop_kind::forward_training, md, 1}, internal::CpuEngine()});
    });
    internal::RunDnnl(kOp, [&](dnnl::stream& stream) {
      dnnl::memory mem = internal::Dnnl(p);
      prim.execute(stream, {{DNNL_ARG_SRC, mem}, {DNNL_ARG_DST, mem}});
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
      return dnnl::softmax_backward({{md, md, 1}, internal::CpuEngine(), hint});
    });
    internal::RunDnnl(kBackward, [&](dnnl::stream& stream) {
      dnnl::memory grad = internal::Dnnl(dp);
      prim.execute(stream, {{DNNL_ARG_DST, internal::Dnnl(p)},
                            {DNNL_ARG_DIFF_DST, grad},
                            {DNNL_ARG_DIFF_SRC, grad}});
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

// `t` [N, L, E] when each head's [L, D] matrix is BLAS-readable, else a contiguous copy.
Tensor HeadReady(const Tensor& t, int64_t heads) {
  const int64_t d = t.size(2) / heads;
  return BlasReadable(t.size(1), d, t.stride(1), t.stride(2)) ? t : k::Contiguous(t);
}

// What a gradient's layout follows: an input's [N, L, E] sizes, dtype and order of N and L.
struct Layout {
  explicit Layout(const Tensor& t)
      : sizes(t.sizes()), dtype(t.dtype()), batch_outer(t.stride(0) >= t.stride(1)) {}
  Shape sizes;
  DType dtype;
  bool batch_outer;  // N's stride is the larger: [N, L, E] in memory, else [L, N, E]
};

// An uninitialised [N, L, e] tensor with E innermost, N and L in `like`'s order.
Tensor EmptyLike(const Layout& like, int64_t e) {
  const int64_t n = like.sizes[0], l = like.sizes[1];
  if (like.batch_outer) return Tensor::Empty({n, l, e}, like.dtype);
  return k::Transpose(Tensor::Empty({l, n, e}, like.dtype), 0, 1);
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
    m = k::MaskedFill(Tensor::Zeros(m.sizes(), dtype), m,
                      -std::numeric_limits<double>::infinity());
  }
  GW_CHECK(m.dtype() == dtype, kOp, "a float mask must have the inputs' dtype ",
           DTypeName(dtype), ", got ", DTypeName(m.dtype()));
  while (m.dim() < 4) m = k::Unsqueeze(m, 0);
  if (m.size(3) != full[3] || (m.stride(3) != 1 && full[3] > 1)) {
    m = k::Contiguous(k::Expand(m, {-1, -1, -1, full[3]}));
  }
  return k::Expand(m, full);
}

// ---------------------------------------------------------------- dropout of the weights

// A well-mixed 32-bit hash (Wellons' lowbias32).
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// pd = p / (1 - dropout_p) where kept, 0 where dropped (with probability dropout_p). The
// decisions are a counter-based stream (element index hashed with a 64-bit seed drawn from
// `gen`), so the loop vectorises. No mask is kept: pd != 0 says which weights were kept,
// and a weight p == 0 gets no gradient either way.
template <typename T>
void DropOut(const T* p, T* pd, int64_t count, double dropout_p, Generator& gen) {
  if (dropout_p >= 1) {
    std::fill_n(pd, count, T{0});
    return;
  }
  const uint64_t seed = gen.NextU64();
  // Dropped when the hash is below dropout_p * 2^32.
  const uint32_t threshold = static_cast<uint32_t>(std::ldexp(dropout_p, 32));
  const T scale = static_cast<T>(1.0 / (1.0 - dropout_p));
  constexpr int64_t kChunk = int64_t{1} << 30;  // 32-bit counters within a chunk
  for (int64_t start = 0; start < count; start += kChunk) {
    const uint32_t key =
        Mix32(static_cast<uint32_t>(seed >> 32) + static_cast<uint32_t>(start >> 30));
    const uint32_t lo = static_cast<uint32_t>(seed);
    const uint32_t n = static_cast<uint32_t>(std::min(kChunk, count - start));
    const T* __restrict in = p + start;
    T* __restrict out = pd + start;
    for (uint32_t i = 0; i < n; ++i) {
      const T keep = Mix32(Mix32(i ^ lo) + key) >= threshold ? scale : T{0};
      out[i] = in[i] * keep;
    }
  }
}

// The gradient of p from that of pd, in place: scaled where the weight was kept.
template <typename T>
void DropOutBackward(const T* __restrict pd, T* __restrict grad, int64_t count, double scale) {
  const T s = static_cast<T>(scale);
  for (int64_t i = 0; i < count; ++i) grad[i] *= pd[i] != 0 ? s : T{0};
}

// ---------------------------------------------------------------- forward and backward

// What the backward reads: the head views [N, H, L|S, D] of q, k and v, the softmax output
// p and the dropped-out weights pd ([N, H, L, S]; p itself without dropout).
struct Saved {
  SavedTensor q, k, v, p, pd;
  double scale = 1;
  double dropout_scale = 0;  // 1 / (1 - dropout_p) with dropout, else 0
};

struct Forward {
  Tensor p, pd;
};

// q4 [N, H, L, D], k4 [N, H, S, D], v4 [N, H, S, Dv] views; out4 [N, H, L, Dv] is written.
Forward RunForward(const Tensor& q4, const Tensor& k4, const Tensor& v4, const Tensor& mask4,
                   double scale, double dropout_p, Generator* gen, const Tensor& out4) {
  const int64_t n = q4.size(0), h = q4.size(1), l = q4.size(2), d = q4.size(3);
  const int64_t s = k4.size(2), dv = v4.size(3);
  Forward f;
  f.p = Tensor::Empty({n, h, l, s}, q4.dtype());
  internal::DispatchFloating(kOp, q4.dtype(), [&]<typename T>() {
    const Mats<const T> query(q4), key(k4), value(v4);
    const Mats<const T> mask(mask4);
    const Mats<T> p(f.p), out(out4);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) {
        const Mat<T> pij = p(i, j);
        if (mask4.defined()) {  // scores = mask + scale * q k^T, as torch.baddbmm
          const Mat<const T> mij = mask(i, j);
          for (int64_t r = 0; r < l; ++r) {
            std::memcpy(pij.data + r * pij.rs, mij.data + r * mij.rs, sizeof(T) * s);
          }
        }
        Gemm<T>(query(i, j), key(i, j).t(), l, s, d, scale, mask4.defined() ? 1 : 0, pij);
      }
    }
    SoftmaxRows(k::View(f.p, {n * h * l, s}));
    f.pd = f.p;
    if (dropout_p > 0) {
      f.pd = Tensor::Empty(f.p.sizes(), f.p.dtype());
      DropOut(f.p.data<T>(), f.pd.data<T>(), f.p.numel(), dropout_p, *gen);
    }
    const Mats<const T> pd(f.pd);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) Gemm<T>(pd(i, j), value(i, j), l, dv, s, 1, 0, out(i, j));
    }
  });
  return f;
}

// Gradients of q, k and v (head views [N, H, *, *] to write; undefined ones are skipped)
// from the output's gradient g4 [N, H, L, Dv] (undefined when only the weights got one)
// and the weights' gradient gw [N, H, L, S] (undefined when they got none).
void RunBackward(const Saved& saved, const Tensor& g4, const Tensor& gw, const Tensor& dq4,
                 const Tensor& dk4, const Tensor& dv4) {
  const Tensor& q4 = saved.q.Get(kBackward);
  const Tensor& k4 = saved.k.Get(kBackward);
  const Tensor& v4 = saved.v.Get(kBackward);
  const Tensor& p = saved.p.Get(kBackward);
  const Tensor& pd = saved.pd.Get(kBackward);
  const int64_t n = q4.size(0), h = q4.size(1), l = q4.size(2), d = q4.size(3);
  const int64_t s = k4.size(2), dv = v4.size(3);
  const bool need_scores = dq4.defined() || dk4.defined();
  internal::DispatchFloating(kBackward, q4.dtype(), [&]<typename T>() {
    // d(pd) = g v^T (+ gw); dv = pd^T g. REQUIRES: g4 or gw defined.
    Tensor dp;
    if (need_scores) dp = gw.defined() ? k::Clone(gw) : Tensor::Empty(p.sizes(), p.dtype());
    const Mats<const T> query(q4), key(k4), value(v4), weights(pd), g(g4);
    const Mats<T> dpd(dp), dq(dq4), dk(dk4), dvm(dv4);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) {
        if (g4.defined() && need_scores) {
          Gemm<T>(g(i, j), value(i, j).t(), l, s, dv, 1, gw.defined() ? 1 : 0, dpd(i, j));
        }
        if (dv4.defined()) {
          const Mat<T> dvij = dvm(i, j);
          if (g4.defined()) {
            Gemm<T>(weights(i, j).t(), g(i, j), s, dv, l, 1, 0, dvij);
          } else {
            for (int64_t r = 0; r < s; ++r) std::fill_n(dvij.data + r * dvij.rs, dv, T{0});
          }
        }
      }
    }
    if (!need_scores) return;
    if (saved.dropout_scale != 0) {
      DropOutBackward(pd.data<T>(), dp.data<T>(), dp.numel(), saved.dropout_scale);
    }
    SoftmaxBackwardRows(k::View(p, {n * h * l, s}), k::View(dp, {n * h * l, s}));
    // dq = scale * ds k; dk = scale * ds^T q.
    const Mats<const T> ds(dp);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) {
        if (dq4.defined()) Gemm<T>(ds(i, j), key(i, j), l, d, s, saved.scale, 0, dq(i, j));
        if (dk4.defined()) Gemm<T>(ds(i, j).t(), query(i, j), s, d, l, saved.scale, 0, dk(i, j));
      }
    }
  });
}

// The backward of one attention call. Its inputs are the gradients of the output and,
// with need_weights, of the weights; its outputs those of qkv (packed) or of q, k and v.
class AttentionBackward final : public autograd::Node {
 public:
  AttentionBackward(Saved saved, int64_t heads, bool packed, std::vector<bool> needs,
                    std::vector<Layout> like)
      : saved_(std::move(saved)),
        heads_(heads),
        packed_(packed),
        needs_(std::move(needs)),
        like_(std::move(like)) {}

  std::string name() const override { return kBackward; }
  void ReleaseVariables() override {
    released_ = true;
    saved_ = Saved();
  }

  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override {
    GW_CHECK(!released_, kBackward,
             "trying to run backward through the graph a second time (its saved tensors were "
             "freed after the first pass); pass retain_graph=true to the first backward");
    const Tensor& g = grads[0];
    const Tensor gw = grads.size() > 1 ? grads[1] : Tensor();
    if (!g.defined() && !gw.defined()) return std::vector<Tensor>(like_.size());
    const Tensor g4 = g.defined() ? HeadView(HeadReady(g, heads_), heads_) : Tensor();
    const Tensor gw4 = gw.defined() ? k::Contiguous(gw) : Tensor();
    std::vector<Tensor> out(like_.size());
    Tensor dq4, dk4, dv4;
    if (packed_) {  // one gradient for qkv; q, k and v are its three column blocks
      const int64_t e = like_[0].sizes[2] / 3;
      out[0] = EmptyLike(like_[0], 3 * e);
      dq4 = HeadView(k::Narrow(out[0], 2, 0, e), heads_);
      dk4 = HeadView(k::Narrow(out[0], 2, e, e), heads_);
      dv4 = HeadView(k::Narrow(out[0], 2, 2 * e, e), heads_);
    } else {
      for (size_t i = 0; i < 3; ++i) {
        if (needs_[i]) out[i] = EmptyLike(like_[i], like_[i].sizes[2]);
      }
      if (needs_[0]) dq4 = HeadView(out[0], heads_);
      if (needs_[1]) dk4 = HeadView(out[1], heads_);
      if (needs_[2]) dv4 = HeadView(out[2], heads_);
    }
    RunBackward(saved_, g4, gw4, dq4, dk4, dv4);
    return out;
  }

 private:
  Saved saved_;
  int64_t heads_;
  bool packed_;
  bool released_ = false;
  std::vector<bool> needs_;  // per input
  std::vector<Layout> like_;  // per input
};

// Checks, runs the forward on head views of q, k, v and records the backward for `inputs`
// (qkv alone when packed).
AttentionResult Attend(const std::vector<Tensor>& inputs, bool packed, const Tensor& query,
                       const Tensor& key, const Tensor& value, int64_t heads,
                       const AttentionOptions& options) {
  const int64_t n = query.size(0), l = query.size(1), e = query.size(2), s = key.size(1);
  const Tensor q = HeadReady(query, heads);
  const Tensor q4 = HeadView(q, heads), k4 = HeadView(HeadReady(key, heads), heads);
  const Tensor v4 = HeadView(HeadReady(value, heads), heads);
  const double scale =
      options.scale.value_or(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(e / heads, 1))));
  const Tensor mask4 = MaskView(options.mask, {n, heads, l, s}, q.dtype());

  AttentionResult result;
  result.output = EmptyLike(Layout(q), value.size(2));
  Forward f = RunForward(q4, k4, v4, mask4, scale, options.dropout_p, options.gen,
                         HeadView(result.output, heads));
  if (options.need_weights) result.weights = f.pd;
  if (!autograd::AnyRequiresGrad(inputs)) return result;

  Saved saved{SavedTensor(q4), SavedTensor(k4), SavedTensor(v4), SavedTensor(f.p),
              SavedTensor(f.pd), scale,
              options.dropout_p > 0 ? 1.0 / (1.0 - options.dropout_p) : 0.0};
  std::vector<bool> needs;
  std::vector<Layout> like;
  for (const Tensor& t : inputs) {
    needs.push_back(t.requires_grad());
    like.emplace_back(t);
  }
  auto node = std::make_shared<AttentionBackward>(std::move(saved), heads, packed,
                                                  std::move(needs), std::move(like));
  for (const Tensor& t : inputs) node->add_next_edge(autograd::GradientEdge(t));
  autograd::SetHistory(result.output, node);
  if (options.need_weights) {
    // The weights tensor is saved for the backward too; hand out a separate handle.
    result.weights = k::View(f.pd, f.pd.sizes());
    autograd::SetHistory(result.weights, node);
  }
  return result;
}

void CheckCommon(const Tensor& t, const char* name) {
  GW_CHECK(t.defined() && t.dim() == 3, kOp, "expected ", name, " [N, L, E], got ", Shown(t));
  GW_CHECK(t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat64, kOp,
           "expected a float32 or float64 ", name, ", got ", DTypeName(t.dtype()));
}

void CheckOptions(const AttentionOptions& options) {
  GW_CHECK(options.dropout_p >= 0 && options.dropout_p <= 1, kOp, "dropout_p must be in [0, 1], got ",
           options.dropout_p);
  GW_CHECK(options.dropout_p == 0 || options.gen != nullptr, kOp,
           "dropout_p > 0 needs a Generator");
}

}  // namespace

AttentionResult MultiHeadAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   int64_t num_heads, const AttentionOptions& options) {
  CheckCommon(q, "q");
  CheckCommon(k, "k");
  CheckCommon(v, "v");
  CheckOptions(options);
  GW_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), kOp, "dtype mismatch: q ",
           DTypeName(q.dtype()), ", k ", DTypeName(k.dtype()), ", v ", DTypeName(v.dtype()));
  GW_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0) && k.size(1) == v.size(1) &&
               q.size(2) == k.size(2),
           kOp, "expected q [N, L, E], k [N, S, E] and v [N, S, Ev], got q ", Shown(q), ", k ",
           Shown(k), ", v ", Shown(v));
  GW_CHECK(num_heads > 0 && q.size(2) % num_heads == 0 && v.size(2) % num_heads == 0, kOp,
           "the widths of q ", Shown(q), " and v ", Shown(v), " must be multiples of num_heads=",
           num_heads);
  return Attend({q, k, v}, /*packed=*/false, q, k, v, num_heads, options);
}

AttentionResult MultiHeadSelfAttention(const Tensor& qkv, int64_t num_heads,
                                       const AttentionOptions& options) {
  CheckCommon(qkv, "qkv");
  CheckOptions(options);
  GW_CHECK(num_heads > 0 && qkv.size(2) % (3 * num_heads) == 0, kOp, "the width of qkv ",
           Shown(qkv), " must be a multiple of 3 * num_heads=", 3 * num_heads);
  const int64_t e = qkv.size(2) / 3;
  return Attend({qkv}, /*packed=*/true, k::Narrow(qkv, 2, 0, e), k::Narrow(qkv, 2, e, e),
                k::Narrow(qkv, 2, 2 * e, e), num_heads, options);
}

}  // namespace gw
