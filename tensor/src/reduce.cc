// Reductions: Sum, Mean, Var, Max, Argmax, SumToShape.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda/cuda_kernels.h"
#include "dispatch.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

// Normalised, de-duplicated dims; empty input means all dims.
std::vector<bool> ReducedMask(std::string_view op, const Tensor& t, const Shape& dims) {
  std::vector<bool> mask(static_cast<size_t>(t.dim()), dims.empty());
  for (int64_t d : dims) {
    const int64_t n = NormalizeDim(op, d, t.dim());
    if (t.dim() == 0) continue;
    GW_CHECK(!mask[n], op, "dimension ", d, " repeated in ", ShapeToString(dims));
    mask[n] = true;
  }
  return mask;
}

Shape ReducedShape(const Tensor& t, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (!mask[i]) {
      out.push_back(t.sizes()[i]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

}  // namespace

Tensor Sum(const Tensor& t, const Shape& dims, bool keepdim) {
  const bool gpu = internal::cuda::OnCuda("Sum", t);
  if (!gpu) internal::CheckDefined("Sum", t);
  const std::vector<bool> mask = ReducedMask("Sum", t, dims);
  const Shape kept = ReducedShape(t, mask, /*keepdim=*/true);
  if (gpu) {
    GW_CHECK(t.dtype() != DType::kBool, "Sum", "expected a numeric tensor, got bool");
    Tensor out = Tensor::Empty(kept, t.dtype(), t.device());
    internal::cuda::SumKeepDims(out, t);
    return keepdim ? out : Reshape(out, ReducedShape(t, mask, false));
  }
  Tensor out = Tensor::Zeros(kept, t.dtype());
  Shape out_strides = ContiguousStrides(kept);
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (mask[i]) out_strides[i] = 0;
  }
  internal::DispatchNumeric("Sum", t.dtype(), [&]<typename T>() {
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    T* po = out.data<T>();
    const T* pt = t.data<T>();
    auto loop = internal::MakeLoop<2>(t.sizes(), {out_strides, t.strides()});
    internal::RunLoop(loop, [&](const std::array<int64_t, 2>& off, int64_t n,
                                const std::array<int64_t, 2>& s) {
      T* o = po + off[0];
      const T* x = pt + off[1];
      if (s[0] == 0) {
        Acc acc = 0;
        for (int64_t i = 0; i < n; ++i) acc += x[i * s[1]];
        *o += static_cast<T>(acc);
      } else if (s[0] == 1 && s[1] == 1) {
        for (int64_t i = 0; i < n; ++i) o[i] += x[i];
      } else {
        for (int64_t i = 0; i < n; ++i) o[i * s[0]] += x[i * s[1]];
      }
    });
  });
  return keepdim ? out : Reshape(out, ReducedShape(t, mask, false));
}

Tensor Mean(const Tensor& t, const Shape& dims, bool keepdim) {
  internal::CheckTensor("Mean", t);
  GW_CHECK(IsFloating(t.dtype()), "Mean", "expected a floating tensor, got ",
           DTypeName(t.dtype()));
  Tensor s = Sum(t, dims, keepdim);
  const int64_t count = s.numel() == 0 ? 0 : t.numel() / s.numel();
  ScaleInPlace(s, 1.0 / static_cast<double>(count));
  return s;
}

Tensor Var(const Tensor& t, const Shape& dims, double correction, bool keepdim) {
  internal::CheckDefined("Var", t);
  GW_CHECK(IsFloating(t.dtype()), "Var", "expected a floating tensor, got ",
           DTypeName(t.dtype()), " ", ShapeToString(t.sizes()));
  // Two passes (the mean, then the squared deviations), summed in double.
  const Tensor mean = Mean(t, dims, /*keepdim=*/true);
  Tensor squares = Tensor::Empty(t.sizes(), t.dtype());
  internal::DispatchFloating("Var", t.dtype(), [&]<typename T>() {
    internal::BinaryLoop<T, T, T>(squares, t, mean, [](T x, T m) { return (x - m) * (x - m); });
  });
  Tensor var = Sum(squares, dims, keepdim);
  const double count = mean.numel() == 0 ? 0.0 : static_cast<double>(t.numel() / mean.numel());
  // As PyTorch: a count at or below the correction divides by zero (inf or nan).
  ScaleInPlace(var, 1.0 / std::max(0.0, count - correction));
  return var;
}

std::pair<Tensor, Tensor> Max(const Tensor& t, int64_t dim, bool keepdim) {
  internal::CheckDefined("Max", t);
  const int64_t nd = std::max<int64_t>(t.dim(), 1);
  dim = NormalizeDim("Max", dim, t.dim());
  Tensor src = t.dim() == 0 ? Reshape(t, {1}) : t;
  GW_CHECK(src.sizes()[dim] > 0, "Max", "cannot reduce an empty dimension ", dim, " of shape ",
           ShapeToString(t.sizes()));
  // Move `dim` last and make rows contiguous.
  Shape perm;
  for (int64_t i = 0; i < nd; ++i) {
    if (i != dim) perm.push_back(i);
  }
  perm.push_back(dim);
  Tensor rows = Contiguous(Permute(src, perm));
  const int64_t n = src.sizes()[dim];
  const int64_t m = rows.numel() / n;
  Shape out_shape = src.sizes();
  out_shape.erase(out_shape.begin() + dim);
  Tensor values = Tensor::Empty(out_shape, t.dtype());
  Tensor indices = Tensor::Empty(out_shape, DType::kInt64);
  internal::DispatchNumeric("Max", t.dtype(), [&]<typename T>() {
    const T* p = rows.data<T>();
    T* pv = values.data<T>();
    int64_t* pi = indices.data<int64_t>();
    for (int64_t r = 0; r < m; ++r) {
      const T* row = p + r * n;
      int64_t best = 0;
      for (int64_t i = 1; i < n; ++i) {
        if (std::isnan(static_cast<double>(row[best]))) break;
        if (row[i] > row[best] || std::isnan(static_cast<double>(row[i]))) best = i;
      }
      pv[r] = row[best];
      pi[r] = best;
    }
  });
  if (keepdim && t.dim() > 0) {
    values = Unsqueeze(values, dim);
    indices = Unsqueeze(indices, dim);
  }
  return {values, indices};
}

Tensor MaxAll(const Tensor& t) {
  internal::CheckDefined("MaxAll", t);
  GW_CHECK(t.numel() > 0, "MaxAll", "empty tensor of shape ", ShapeToString(t.sizes()));
  return Reshape(Max(Reshape(t, {-1}), 0).first, {});
}

Tensor Argmax(const Tensor& t, int64_t dim, bool keepdim) { return Max(t, dim, keepdim).second; }

Tensor SumToShape(const Tensor& t, const Shape& sizes) {
  internal::CheckTensor("SumToShape", t);
  if (t.sizes() == sizes) return t;
  const int64_t lead = t.dim() - static_cast<int64_t>(sizes.size());
  GW_CHECK(lead >= 0, "SumToShape", "cannot sum ", ShapeToString(t.sizes()), " down to ",
           ShapeToString(sizes));
  Shape dims;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else if (sizes[i - lead] == 1 && t.sizes()[i] != 1) {
      dims.push_back(i);
    } else {
      GW_CHECK(sizes[i - lead] == t.sizes()[i], "SumToShape", "cannot sum ",
               ShapeToString(t.sizes()), " down to ", ShapeToString(sizes));
    }
  }
  if (dims.empty()) return Reshape(t, sizes);
  return Reshape(Sum(t, dims, /*keepdim=*/true), sizes);
}

}  // namespace gw::kernels
