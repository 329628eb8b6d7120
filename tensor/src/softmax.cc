// Softmax and log-softmax along a dimension, with their backward helpers.
#include <cmath>

#include "cuda/cuda_kernels.h"
#include "dispatch.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

// Applies row_fn(in_row, out_row, n) to every slice along `dim`.
// On a GPU, the rows go to the softmax kernel (log: log-softmax) instead.
template <typename RowFn>
Tensor AlongDim(std::string_view op, const Tensor& t, int64_t dim, bool log, RowFn row_fn) {
  const bool gpu = internal::cuda::OnCuda(op, t);
  if (!gpu) internal::CheckDefined(op, t);
  if (t.dim() == 0) return Reshape(AlongDim(op, Reshape(t, {1}), 0, log, row_fn), {});
  dim = NormalizeDim(op, dim, t.dim());
  const int64_t last = t.dim() - 1;
  Tensor moved = dim == last ? Contiguous(t) : Contiguous(Transpose(t, dim, last));
  Tensor out = Tensor::Empty(moved.sizes(), t.dtype(), t.device());
  const int64_t n = t.sizes()[dim];
  const int64_t rows = n == 0 ? 0 : moved.numel() / n;
  if (gpu) {
    GW_CHECK(IsFloating(t.dtype()), op, "expected a floating tensor (float32 or float64), got ", DTypeName(t.dtype()));
    internal::cuda::SoftmaxRows(out, moved, rows, n, log);
    return dim == last ? out : Contiguous(Transpose(out, dim, last));
  }
  internal::DispatchFloating(op, t.dtype(), [&]<typename T>() {
    const T* in = moved.data<T>();
    T* o = out.data<T>();
    for (int64_t r = 0; r < rows; ++r) row_fn(in + r * n, o + r * n, n);
  });
  return dim == last ? out : Contiguous(Transpose(out, dim, last));
}

}  // namespace

Tensor Softmax(const Tensor& t, int64_t dim) {
  return AlongDim("Softmax", t, dim, /*log=*/false, []<typename T>(const T* x, T* y, int64_t n) {
    T m = x[0];
    for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      y[i] = std::exp(x[i] - m);
      sum += y[i];
    }
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  });
}

Tensor LogSoftmax(const Tensor& t, int64_t dim) {
  return AlongDim("LogSoftmax", t, dim, /*log=*/true, []<typename T>(const T* x, T* y, int64_t n) {
    T m = x[0];
    for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - m));
    const T lse = m + static_cast<T>(std::log(sum));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - lse;
  });
}

Tensor SoftmaxBackward(const Tensor& grad, const Tensor& out, int64_t dim) {
  // dx = y * (g - sum(g * y, dim))
  Tensor gy = Mul(grad, out);
  return Mul(out, Sub(grad, Sum(gy, {dim}, /*keepdim=*/true)));
}

Tensor LogSoftmaxBackward(const Tensor& grad, const Tensor& out, int64_t dim) {
  // dx = g - exp(y) * sum(g, dim)
  return Sub(grad, Mul(Exp(out), Sum(grad, {dim}, /*keepdim=*/true)));
}

}  // namespace gw::kernels
