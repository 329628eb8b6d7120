// Recurrent layers (LSTM, GRU): GEMMs over whole sequences where the recurrence allows it,
// one GEMM per step for the hidden projection, and fused gate kernels per step.
#include "gradwire/tensor/recurrent.h"
#include "gradwire/tensor/vector_math.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "dispatch.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

// ---------------------------------------------------------------- activations
//
// float32 uses gradwire/tensor/vector_math.h's exp and tanh so that the gate loops
// vectorise (libm's expf/tanhf are calls the vectoriser cannot inline); float64 (the
// reference) uses libm.

template <typename T>
inline T Sigm(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f / (1.0f + vector_math::Exp(-x));
  } else {
    return 1.0 / (1.0 + std::exp(-x));
  }
}

template <typename T>
inline T Tanh(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return vector_math::Tanh(x);
  } else {
    return std::tanh(x);
  }
}

// ---------------------------------------------------------------- operands

// A sequence [L, N, K] with unit stride along K: row (t, n) starts at data + t*ts + n*ns.
template <typename T>
struct Seq {
  T* data;
  int64_t ts, ns;
  T* row(int64_t t, int64_t n) const { return data + t * ts + n * ns; }
};

template <typename T>
Seq<T> SeqOf(const Tensor& t) {  // REQUIRES: 3-D, unit innermost stride
  return {t.data<std::remove_const_t<T>>(), t.stride(0), t.stride(1)};
}

template <typename T>
Seq<T> MatOf(const Tensor& t) {  // a [N, K] matrix as a one-step sequence
  return {t.data<std::remove_const_t<T>>(), 0, t.stride(0)};
}

// `t` itself when its innermost stride is 1 (rows can be read directly), else a copy.
Tensor UnitInner(const Tensor& t) { return t.stride(-1) == 1 ? t : Contiguous(t); }

// The gradient or state `t`, or zeros of `sizes` when undefined.
Tensor OrZeros(const Tensor& t, const Shape& sizes, DType dtype) {
  return t.defined() ? UnitInner(t) : Tensor::Zeros(sizes, dtype);
}

// ---------------------------------------------------------------- gate kernels
//
// Each runs one time step over N rows, one call of a row kernel per row. `g` holds the
// gates: on entry of the forward the input projection x W_ih^T + b_ih, on exit the
// activated gates (kept for backward). `a` is h_prev W_hh^T (without bias), `b` is b_hh.
//
// The row kernels take __restrict pointers (GCC does not vectorise the same loop nested
// in the row loop) and are compiled for AVX-512, AVX2 and the baseline, picked at load
// time (GCC's target_clones), since the library itself targets baseline x86-64. The file
// is built with -fno-trapping-math so that the clamps in vector_math::Exp are if-converted (see
// tensor/CMakeLists.txt). fp-contract stays off: every clone rounds alike.

template <typename T>
GW_VECTOR_CLONES void LstmForwardRow(int64_t H, T* __restrict g, const T* __restrict a,
                                      const T* __restrict b, const T* __restrict c_prev,
                                      T* __restrict c, T* __restrict h) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = Sigm(g[j] + a[j] + b[j]);
    const T f = Sigm(g[H + j] + a[H + j] + b[H + j]);
    const T gg = Tanh(g[2 * H + j] + a[2 * H + j] + b[2 * H + j]);
    const T o = Sigm(g[3 * H + j] + a[3 * H + j] + b[3 * H + j]);
    const T cn = f * c_prev[j] + i * gg;
    g[j] = i;
    g[H + j] = f;
    g[2 * H + j] = gg;
    g[3 * H + j] = o;
    c[j] = cn;
    h[j] = o * Tanh(cn);
  }
}

// `hn` receives W_hn h + b_hn (kept for backward).
template <typename T>
GW_VECTOR_CLONES void GruForwardRow(int64_t H, T* __restrict g, const T* __restrict a,
                                     const T* __restrict b, const T* __restrict h_prev,
                                     T* __restrict hn, T* __restrict h) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = Sigm(g[j] + a[j] + b[j]);
    const T z = Sigm(g[H + j] + a[H + j] + b[H + j]);
    const T hh = a[2 * H + j] + b[2 * H + j];
    const T nn = Tanh(g[2 * H + j] + r * hh);
    g[j] = r;
    g[H + j] = z;
    g[2 * H + j] = nn;
    hn[j] = hh;
    h[j] = (1 - z) * nn + z * h_prev[j];
  }
}

// dh: the gradient of h_t carried from step t+1 (dy, the output's, is added here); dc:
// the gradient of c_t on entry, of c_{t-1} on exit. Writes the gate gradients dg
// (pre-activation).
template <typename T>
GW_VECTOR_CLONES void LstmBackwardRow(int64_t H, const T* __restrict g, const T* __restrict c,
                                       const T* __restrict c_prev, const T* __restrict dy,
                                       const T* __restrict dh, T* __restrict dc,
                                       T* __restrict dg) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = g[j], f = g[H + j], gg = g[2 * H + j], o = g[3 * H + j];
    const T tc = Tanh(c[j]);
    const T dhj = dh[j] + dy[j];
    const T dcj = dc[j] + dhj * o * (1 - tc * tc);
    dg[j] = dcj * gg * i * (1 - i);
    dg[H + j] = dcj * c_prev[j] * f * (1 - f);
    dg[2 * H + j] = dcj * i * (1 - gg * gg);
    dg[3 * H + j] = dhj * tc * o * (1 - o);
    dc[j] = dcj * f;
  }
}

// dh: on entry the gradient of h_t carried from step t+1, on exit its direct part for
// h_{t-1} (dh * z; the caller adds dgh W_hh). Writes the gate gradients of the input
// projection (dgx) and of the hidden projection (dgh), which differ in the n gate.
template <typename T>
GW_VECTOR_CLONES void GruBackwardRow(int64_t H, const T* __restrict g, const T* __restrict hn,
                                      const T* __restrict h_prev, const T* __restrict dy,
                                      T* __restrict dh, T* __restrict dgx, T* __restrict dgh) {
  for (int64_t j = 0; j < H; ++j) {
    const T r = g[j], z = g[H + j], nn = g[2 * H + j];
    const T dhj = dh[j] + dy[j];
    const T dn = dhj * (1 - z) * (1 - nn * nn);
    const T dz = dhj * (h_prev[j] - nn) * z * (1 - z);
    const T dr = dn * hn[j] * r * (1 - r);
    dgx[j] = dr;
    dgx[H + j] = dz;
    dgx[2 * H + j] = dn;
    dgh[j] = dr;
    dgh[H + j] = dz;
    dgh[2 * H + j] = dn * r;
    dh[j] = dhj * z;
  }
}

// ---------------------------------------------------------------- shapes

struct Dims {
  int64_t L, N, in, H, G;
};

void CheckShape(std::string_view op, const char* what, const Tensor& t, const Shape& want,
                DType dtype) {
  if (!t.defined()) return;
  GW_CHECK(t.sizes() == want, op, what, " must be ", ShapeToString(want), ", got ",
           ShapeToString(t.sizes()));
  GW_CHECK(t.dtype() == dtype, op, what, " is ", DTypeName(t.dtype()), " but x is ",
           DTypeName(dtype));
  internal::CheckDefined(op, t);
}

Dims CheckArgs(const RnnLayerArgs& a) {
  const std::string_view op = RnnLayerName(a.cell);
  GW_CHECK(a.x.defined() && a.w_ih.defined() && a.w_hh.defined(), op,
           "x, w_ih and w_hh must be defined");
  internal::CheckDefined(op, a.x);
  GW_CHECK(a.x.dim() == 3 && a.x.size(0) > 0, op, "expected x [L, N, in] with L > 0, got ",
           ShapeToString(a.x.sizes()));
  GW_CHECK(a.w_hh.dim() == 2, op, "w_hh must be [G*H, H], got ", ShapeToString(a.w_hh.sizes()));
  GW_CHECK(a.cell == RnnCell::kLstm || !a.c0.defined(), op, "c0 is for LSTM only");
  const int64_t G = RnnGateCount(a.cell);
  Dims d{a.x.size(0), a.x.size(1), a.x.size(2), a.w_hh.size(1), G};
  const DType dt = a.x.dtype();
  GW_CHECK(dt == DType::kFloat32 || dt == DType::kFloat64, op,
           "expected float32 or float64, got ", DTypeName(dt));
  CheckShape(op, "w_ih", a.w_ih, {G * d.H, d.in}, dt);
  CheckShape(op, "w_hh", a.w_hh, {G * d.H, d.H}, dt);
  CheckShape(op, "b_ih", a.b_ih, {G * d.H}, dt);
  CheckShape(op, "b_hh", a.b_hh, {G * d.H}, dt);
  CheckShape(op, "h0", a.h0, {d.N, d.H}, dt);
  CheckShape(op, "c0", a.c0, {d.N, d.H}, dt);
  return d;
}

// Step s of the sequence reads time t = Time(s).
int64_t Time(const RnnLayerArgs& a, int64_t L, int64_t s) { return a.reverse ? L - 1 - s : s; }

}  // namespace

int64_t RnnGateCount(RnnCell cell) { return cell == RnnCell::kLstm ? 4 : 3; }

std::string_view RnnLayerName(RnnCell cell) {
  return cell == RnnCell::kLstm ? "LSTM layer" : "GRU layer";
}

RnnLayerResult RnnLayerForward(const RnnLayerArgs& args) {
  const Dims d = CheckArgs(args);
  const int64_t L = d.L, N = d.N, H = d.H, G = d.G;
  const DType dt = args.x.dtype();
  const bool lstm = args.cell == RnnCell::kLstm;
  RnnLayerResult r;
  // The input projection of every step at once: [L*N, G*H], then activated in place.
  r.gates = Reshape(Linear(args.x, args.w_ih, args.b_ih), {L, N, G * H});
  r.output = Tensor::Empty({L, N, H}, dt);
  r.aux = Tensor::Empty({L, N, H}, dt);
  const Tensor h0 = OrZeros(args.h0, {N, H}, dt);
  const Tensor c0 = lstm ? OrZeros(args.c0, {N, H}, dt) : Tensor();
  const Tensor b_hh = args.b_hh.defined() ? Contiguous(args.b_hh) : Tensor::Zeros({G * H}, dt);
  const Tensor hidden = Tensor::Empty({N, G * H}, dt);  // h_prev W_hh^T of one step
  internal::DispatchFloating(RnnLayerName(args.cell), dt, [&]<typename T>() {
    const Seq<T> g = SeqOf<T>(r.gates), out = SeqOf<T>(r.output), aux = SeqOf<T>(r.aux);
    const Seq<const T> a = MatOf<const T>(hidden);
    const T* b = b_hh.data<T>();
    for (int64_t s = 0; s < L; ++s) {
      const int64_t t = Time(args, L, s), tp = Time(args, L, s - 1);
      const Tensor h_prev = s == 0 ? h0 : Select(r.output, 0, tp);
      if (s == 0 && !args.h0.defined()) {
        Fill(hidden, 0);
      } else {
        Gemm(false, true, 1.0, h_prev, args.w_hh, 0.0, hidden);
      }
      if (lstm) {
        const Seq<const T> c_prev =
            s == 0 ? MatOf<const T>(c0) : Seq<const T>{aux.row(tp, 0), 0, aux.ns};
        for (int64_t n = 0; n < N; ++n) {
          LstmForwardRow<T>(H, g.row(t, n), a.row(0, n), b, c_prev.row(0, n), aux.row(t, n),
                            out.row(t, n));
        }
      } else {
        const Seq<const T> hp = MatOf<const T>(h_prev);
        for (int64_t n = 0; n < N; ++n) {
          GruForwardRow<T>(H, g.row(t, n), a.row(0, n), b, hp.row(0, n), aux.row(t, n),
                           out.row(t, n));
        }
      }
    }
  });
  r.h_n = Select(r.output, 0, Time(args, L, L - 1));
  if (lstm) r.c_n = Select(r.aux, 0, Time(args, L, L - 1));
  return r;
}

RnnLayerGrads RnnLayerBackward(const RnnLayerArgs& args, const RnnLayerResult& fwd,
                               const Tensor& grad_output, const Tensor& grad_h_n,
                               const Tensor& grad_c_n, const RnnLayerNeeds& needs) {
  const Dims d = CheckArgs(args);
  const int64_t L = d.L, N = d.N, H = d.H, G = d.G;
  const DType dt = args.x.dtype();
  const bool lstm = args.cell == RnnCell::kLstm;
  const std::string_view op = RnnLayerName(args.cell);
  CheckShape(op, "grad_output", grad_output, {L, N, H}, dt);
  CheckShape(op, "grad_h_n", grad_h_n, {N, H}, dt);
  CheckShape(op, "grad_c_n", grad_c_n, {N, H}, dt);

  const Tensor dy = OrZeros(grad_output, {L, N, H}, dt);
  const Tensor h0 = OrZeros(args.h0, {N, H}, dt);
  const Tensor c0 = lstm ? OrZeros(args.c0, {N, H}, dt) : Tensor();
  // Carried gradients of h and c, updated step by step (fresh buffers: written in place).
  Tensor dh = grad_h_n.defined() ? Clone(grad_h_n) : Tensor::Zeros({N, H}, dt);
  Tensor dc = lstm ? (grad_c_n.defined() ? Clone(grad_c_n) : Tensor::Zeros({N, H}, dt))
                   : Tensor();
  const Tensor dgx = Tensor::Empty({L, N, G * H}, dt);
  const Tensor dgh = lstm ? dgx : Tensor::Empty({L, N, G * H}, dt);

  internal::DispatchFloating(op, dt, [&]<typename T>() {
    const Seq<const T> g = SeqOf<const T>(fwd.gates), aux = SeqOf<const T>(fwd.aux);
    const Seq<const T> out = SeqOf<const T>(fwd.output), dys = SeqOf<const T>(dy);
    const Seq<T> dhs = MatOf<T>(dh), dgxs = SeqOf<T>(dgx), dghs = SeqOf<T>(dgh);
    const Seq<T> dcs = lstm ? MatOf<T>(dc) : Seq<T>{};
    for (int64_t s = L - 1; s >= 0; --s) {
      const int64_t t = Time(args, L, s), tp = Time(args, L, s - 1);
      const Tensor dgh_t = Select(dgh, 0, t);
      if (lstm) {
        const Seq<const T> c_prev =
            s == 0 ? MatOf<const T>(c0) : Seq<const T>{aux.row(tp, 0), 0, aux.ns};
        for (int64_t n = 0; n < N; ++n) {
          LstmBackwardRow<T>(H, g.row(t, n), aux.row(t, n), c_prev.row(0, n), dys.row(t, n),
                             dhs.row(0, n), dcs.row(0, n), dgxs.row(t, n));
        }
      } else {
        const Seq<const T> h_prev =
            s == 0 ? MatOf<const T>(h0) : Seq<const T>{out.row(tp, 0), 0, out.ns};
        for (int64_t n = 0; n < N; ++n) {
          GruBackwardRow<T>(H, g.row(t, n), aux.row(t, n), h_prev.row(0, n), dys.row(t, n),
                            dhs.row(0, n), dgxs.row(t, n), dghs.row(t, n));
        }
      }
      if (s > 0 || needs.h0) {
        Gemm(false, false, 1.0, dgh_t, args.w_hh, lstm ? 0.0 : 1.0, dh);
      }
    }
  });

  RnnLayerGrads grads;
  if (needs.h0) grads.h0 = dh;
  if (lstm && needs.c0) grads.c0 = dc;
  const Tensor dgx2 = View(dgx, {L * N, G * H});
  if (needs.x) {
    grads.x = Tensor::Empty({L * N, d.in}, dt);
    Gemm(false, false, 1.0, dgx2, args.w_ih, 0.0, grads.x);
    grads.x = View(grads.x, {L, N, d.in});
  }
  if (needs.w_ih) {
    grads.w_ih = Tensor::Empty({G * H, d.in}, dt);
    Gemm(true, false, 1.0, dgx2, Flatten2D(args.x), 0.0, grads.w_ih);
  }
  if (needs.w_hh) {
    // Step s > 0 read the output of step s - 1; the first step read h0.
    const int64_t first = Time(args, L, 0);
    const int64_t dg_from = args.reverse ? 0 : 1, out_from = args.reverse ? 1 : 0;
    grads.w_hh = Tensor::Empty({G * H, H}, dt);
    Gemm(true, false, 1.0, Flatten2D(Narrow(dgh, 0, dg_from, L - 1)),
         Flatten2D(Narrow(fwd.output, 0, out_from, L - 1)), 0.0, grads.w_hh);
    if (args.h0.defined()) Gemm(true, false, 1.0, Select(dgh, 0, first), h0, 1.0, grads.w_hh);
  }
  if (needs.b_ih) grads.b_ih = Sum(dgx2, {0});
  if (needs.b_hh) grads.b_hh = Sum(View(dgh, {L * N, G * H}), {0});
  return grads;
}

}  // namespace gw::kernels
