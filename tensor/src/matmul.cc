// Matrix products: Gemm (oneDNN sgemm for float32, blocked loop for float64),
// MatMul with NumPy semantics, and the fused Linear.
#include <dnnl.h>

#include <algorithm>

#include "dispatch.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

// A 2-D operand as BLAS sees it: row-major data, a transpose flag, a leading dimension.
template <typename T>
struct GemmOperand {
  const T* data;
  bool trans;  // relative to the logical (rows x cols) matrix
  int64_t ld;
  Tensor keep_alive;
};

// Describes `t` (logically rows x cols, then optionally transposed by `trans`) without
// copying when its strides are row- or column-major.
template <typename T>
GemmOperand<T> AsOperand(const Tensor& t, bool trans) {
  const int64_t rows = t.sizes()[0], cols = t.sizes()[1];
  const int64_t s0 = t.strides()[0], s1 = t.strides()[1];
  if ((s1 == 1 || cols == 1) && (s0 >= std::max<int64_t>(cols, 1) || rows == 1)) {
    return {t.data<T>(), trans, rows == 1 ? std::max<int64_t>(cols, 1) : s0, t};
  }
  if ((s0 == 1 || rows == 1) && (s1 >= std::max<int64_t>(rows, 1) || cols == 1)) {
    // Column-major: the row-major transpose of the data.
    return {t.data<T>(), !trans, cols == 1 ? std::max<int64_t>(rows, 1) : s1, t};
  }
  Tensor c = Clone(t);
  return {c.data<T>(), trans, std::max<int64_t>(cols, 1), c};
}

void SgemmRowMajor(const GemmOperand<float>& a, const GemmOperand<float>& b, int64_t m,
                   int64_t n, int64_t k, float alpha, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status =
      dnnl_sgemm(a.trans ? 'T' : 'N', b.trans ? 'T' : 'N', m, n, k, alpha, a.data, a.ld, b.data,
                 b.ld, beta, c, ldc);
  GW_CHECK(status == dnnl_success, "Gemm", "oneDNN sgemm failed with status ",
           static_cast<int>(status), " for m=", m, " n=", n, " k=", k);
}

// C = alpha * op(A) op(B) + beta * C, cache-blocked, for float64.
void DgemmBlocked(const GemmOperand<double>& a, const GemmOperand<double>& b, int64_t m,
                  int64_t n, int64_t k, double alpha, double beta, double* c, int64_t ldc) {
  auto at = [&](int64_t i, int64_t p) { return a.trans ? a.data[p * a.ld + i] : a.data[i * a.ld + p]; };
  auto bt = [&](int64_t p, int64_t j) { return b.trans ? b.data[j * b.ld + p] : b.data[p * b.ld + j]; };
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0 : beta * c[i * ldc + j];
  }
  constexpr int64_t kBlock = 64;
  std::vector<double> bpanel(static_cast<size_t>(kBlock * kBlock));
  for (int64_t p0 = 0; p0 < k; p0 += kBlock) {
    const int64_t p1 = std::min(k, p0 + kBlock);
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t j1 = std::min(n, j0 + kBlock);
      const int64_t nj = j1 - j0;
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t j = j0; j < j1; ++j) bpanel[(p - p0) * nj + (j - j0)] = bt(p, j);
      }
      for (int64_t i = 0; i < m; ++i) {
        double* crow = c + i * ldc + j0;
        for (int64_t p = p0; p < p1; ++p) {
          const double aip = alpha * at(i, p);
          const double* brow = bpanel.data() + (p - p0) * nj;
          for (int64_t j = 0; j < nj; ++j) crow[j] += aip * brow[j];
        }
      }
    }
  }
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
          double beta, const Tensor& c) {
  internal::CheckDefined("Gemm", a);
  internal::CheckDefined("Gemm", b);
  internal::CheckDefined("Gemm", c);
  GW_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "Gemm", "expects 2-D tensors, got ",
           ShapeToString(a.sizes()), ", ", ShapeToString(b.sizes()), " and ",
           ShapeToString(c.sizes()));
  internal::CheckSameDType("Gemm", a, b);
  internal::CheckSameDType("Gemm", a, c);
  const int64_t m = trans_a ? a.sizes()[1] : a.sizes()[0];
  const int64_t k = trans_a ? a.sizes()[0] : a.sizes()[1];
  const int64_t kb = trans_b ? b.sizes()[1] : b.sizes()[0];
  const int64_t n = trans_b ? b.sizes()[0] : b.sizes()[1];
  GW_CHECK(k == kb && c.sizes()[0] == m && c.sizes()[1] == n, "Gemm", "shapes ",
           ShapeToString(a.sizes()), (trans_a ? "^T" : ""), " x ", ShapeToString(b.sizes()),
           (trans_b ? "^T" : ""), " -> ", ShapeToString(c.sizes()), " do not match");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: C = beta * C
    if (beta == 0) {
      Fill(c, 0);
    } else {
      ScaleInPlace(c, beta);
    }
    return;
  }
  // The output must be row-major; otherwise compute into a temporary and copy back.
  const bool c_ok = c.strides()[1] == 1 && (c.strides()[0] >= n || m == 1);
  // Writes to c: directly (bumping the version around them), or through CopyInPlace.
  if (c_ok) c.storage()->BumpVersion();
  Tensor out = c_ok ? c : Contiguous(c);
  const int64_t ldc = m == 1 ? n : out.strides()[0];
  internal::DispatchFloating("Gemm", a.dtype(), [&]<typename T>() {
    GemmOperand<T> oa = AsOperand<T>(a, trans_a);
    GemmOperand<T> ob = AsOperand<T>(b, trans_b);
    if constexpr (std::is_same_v<T, float>) {
      SgemmRowMajor(oa, ob, m, n, k, static_cast<float>(alpha), static_cast<float>(beta),
                    out.data<float>(), ldc);
    } else {
      DgemmBlocked(oa, ob, m, n, k, alpha, beta, out.data<double>(), ldc);
    }
  });
  if (c_ok) {
    c.storage()->BumpVersion();
  } else {
    CopyInPlace(c, out);
  }
}

Tensor MatMul(const Tensor& a, const Tensor& b) {
  internal::CheckDefined("MatMul", a);
  internal::CheckDefined("MatMul", b);
  GW_CHECK(a.dim() >= 1 && b.dim() >= 1, "MatMul", "operands must have at least one dimension, got ",
           ShapeToString(a.sizes()), " and ", ShapeToString(b.sizes()));
  internal::CheckSameDType("MatMul", a, b);
  const int64_t ka = a.sizes().back();
  const int64_t kb = b.dim() == 1 ? b.sizes()[0] : b.sizes()[b.dim() - 2];
  GW_CHECK(ka == kb, "MatMul", "shapes ", ShapeToString(a.sizes()), " and ",
           ShapeToString(b.sizes()), " cannot be multiplied (", ka, " != ", kb, ")");
  if (a.dim() == 1 && b.dim() == 1) {
    return Reshape(MatMul(Unsqueeze(a, 0), Unsqueeze(b, 1)), {});
  }
  if (a.dim() == 1) return Squeeze(MatMul(Unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return Squeeze(MatMul(a, Unsqueeze(b, 1)), -1);
  const int64_t m = a.sizes()[a.dim() - 2];
  const int64_t n = b.sizes().back();
  if (a.dim() == 2 && b.dim() == 2) {
    Tensor out = Tensor::Empty({m, n}, a.dtype());
    Gemm(false, false, 1.0, a, b, 0.0, out);
    return out;
  }
  if (b.dim() == 2 && a.is_contiguous()) {  // fold the batch into the rows: one GEMM
    Tensor out = MatMul(Flatten2D(a), b);
    Shape sizes = a.sizes();
    sizes.back() = n;
    return Reshape(out, sizes);
  }
  const Shape batch_a(a.sizes().begin(), a.sizes().end() - 2);
  const Shape batch_b(b.dim() > 2 ? Shape(b.sizes().begin(), b.sizes().end() - 2) : Shape{});
  const Shape batch = BroadcastShapes("MatMul", batch_a, batch_b);
  Shape ea_sizes = batch, eb_sizes = batch, out_sizes = batch;
  ea_sizes.insert(ea_sizes.end(), {m, ka});
  eb_sizes.insert(eb_sizes.end(), {kb, n});
  out_sizes.insert(out_sizes.end(), {m, n});
  Tensor ea = Expand(a, ea_sizes), eb = Expand(b, eb_sizes);
  Tensor out = Tensor::Empty(out_sizes, a.dtype());
  const int64_t nb = NumElements(batch);
  for (int64_t flat = 0; flat < nb; ++flat) {
    Tensor sa = ea, sb = eb, so = out;
    int64_t rem = flat;
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      sa = Select(sa, d, idx);
      sb = Select(sb, d, idx);
      so = Select(so, d, idx);
    }
    Gemm(false, false, 1.0, sa, sb, 0.0, so);
  }
  return out;
}

Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  internal::CheckDefined("Linear", x);
  internal::CheckDefined("Linear", w);
  GW_CHECK(w.dim() == 2 && x.dim() >= 1 && x.sizes().back() == w.sizes()[1], "Linear",
           "input ", ShapeToString(x.sizes()), " does not match weight ",
           ShapeToString(w.sizes()), " (expected [..., ", w.dim() == 2 ? w.sizes()[1] : -1, "])");
  const int64_t out_features = w.sizes()[0];
  if (bias.defined()) {
    GW_CHECK(bias.dim() == 1 && bias.sizes()[0] == out_features, "Linear", "bias ",
             ShapeToString(bias.sizes()), " does not match weight ", ShapeToString(w.sizes()));
  }
  Tensor x2 = Flatten2D(x);
  Tensor out = Tensor::Empty({x2.sizes()[0], out_features}, x.dtype());
  if (bias.defined()) CopyInPlace(out, bias);
  Gemm(false, true, 1.0, x2, w, bias.defined() ? 1.0 : 0.0, out);
  Shape sizes = x.sizes();
  sizes.back() = out_features;
  return Reshape(out, sizes);
}

}  // namespace gw::kernels
