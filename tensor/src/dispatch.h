// Internal: dtype dispatch and the strided loop every element-wise kernel runs on.
#ifndef GRADWIRE_TENSOR_SRC_DISPATCH_H_
#define GRADWIRE_TENSOR_SRC_DISPATCH_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "gradwire/tensor/tensor.h"

namespace gw::internal {

// Calls f.template operator()<T>() with T the C++ type of `dtype`.
template <typename F>
decltype(auto) DispatchFloating(std::string_view op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f.template operator()<float>();
    case DType::kFloat64: return f.template operator()<double>();
    default: Fail(op, "expected a floating tensor (float32 or float64), got ", DTypeName(dtype));
  }
}

template <typename F>
decltype(auto) DispatchNumeric(std::string_view op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f.template operator()<float>();
    case DType::kFloat64: return f.template operator()<double>();
    case DType::kInt64: return f.template operator()<int64_t>();
    default: Fail(op, "expected a numeric tensor, got ", DTypeName(dtype));
  }
}

template <typename F>
decltype(auto) DispatchAll(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f.template operator()<float>();
    case DType::kFloat64: return f.template operator()<double>();
    case DType::kInt64: return f.template operator()<int64_t>();
    case DType::kBool: return f.template operator()<bool>();
  }
  Fail("Dispatch", "unknown dtype");
}

// Views and metadata: any device.
inline void CheckTensor(std::string_view op, const Tensor& t) {
  GW_CHECK(t.defined(), op, "called with an undefined tensor");
}

// Kernels that run on the CPU (their GPU twins dispatch before this check).
inline void CheckDefined(std::string_view op, const Tensor& t) {
  GW_CHECK(t.defined(), op, "called with an undefined tensor");
  GW_CHECK(t.device().type == DeviceType::kCPU, op, "tensor on ", t.device().ToString(),
           " but this kernel runs on the CPU");
}

inline void CheckSameDType(std::string_view op, const Tensor& a, const Tensor& b) {
  GW_CHECK(a.dtype() == b.dtype(), op, "dtype mismatch: ", DTypeName(a.dtype()), " ",
           ShapeToString(a.sizes()), " vs ", DTypeName(b.dtype()), " ",
           ShapeToString(b.sizes()));
}

// Strides (in elements) of `t` seen at the broadcast shape `sizes` (0 where broadcast).
Shape BroadcastStrides(const Tensor& t, const Shape& sizes, std::string_view op = "Broadcast");

// An N-operand strided iteration space with adjacent dimensions merged where every
// operand allows it. Operand 0 is usually the output.
template <size_t N>
struct Loop {
  Shape sizes;
  std::array<Shape, N> strides;
};

template <size_t N>
Loop<N> MakeLoop(const Shape& sizes, const std::array<Shape, N>& strides) {
  Loop<N> loop;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    bool merge = !loop.sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = loop.strides[k].back() == strides[k][d] * sizes[d];
    }
    if (merge) {
      loop.sizes.back() *= sizes[d];
      for (size_t k = 0; k < N; ++k) loop.strides[k].back() = strides[k][d];
    } else {
      loop.sizes.push_back(sizes[d]);
      for (size_t k = 0; k < N; ++k) loop.strides[k].push_back(strides[k][d]);
    }
  }
  return loop;
}

// Calls inner(offsets, n, inner_strides) for each innermost row of the loop.
template <size_t N, typename Inner>
void RunLoop(const Loop<N>& loop, Inner&& inner) {
  std::array<int64_t, N> off{};
  std::array<int64_t, N> s{};
  const int64_t nd = static_cast<int64_t>(loop.sizes.size());
  if (nd == 0) {
    inner(off, int64_t{1}, s);
    return;
  }
  for (size_t k = 0; k < N; ++k) s[k] = loop.strides[k][nd - 1];
  const int64_t n = loop.sizes[nd - 1];
  if (n == 0) return;
  Shape counter(nd, 0);
  for (int64_t d = 0; d < nd - 1; ++d) {
    if (loop.sizes[d] == 0) return;
  }
  while (true) {
    inner(off, n, s);
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      ++counter[d];
      for (size_t k = 0; k < N; ++k) off[k] += loop.strides[k][d];
      if (counter[d] < loop.sizes[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= loop.strides[k][d] * loop.sizes[d];
      counter[d] = 0;
    }
    if (d < 0) return;
  }
}

// out[i] = op(a[i]) over out's shape; `a` broadcasts to it. Types: A in, R out.
template <typename R, typename A, typename Op>
void UnaryLoop(const Tensor& out, const Tensor& a, Op op) {
  R* po = out.data<R>();
  const A* pa = a.data<A>();
  auto loop = MakeLoop<2>(out.sizes(), {out.strides(), BroadcastStrides(a, out.sizes())});
  RunLoop(loop, [&](const std::array<int64_t, 2>& off, int64_t n,
                    const std::array<int64_t, 2>& s) {
    R* o = po + off[0];
    const A* x = pa + off[1];
    if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = op(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = op(x[i * s[1]]);
    }
  });
}

// out[i] = op(a[i], b[i]) over out's shape; a and b broadcast to it.
template <typename R, typename A, typename B, typename Op>
void BinaryLoop(const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  R* po = out.data<R>();
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  auto loop = MakeLoop<3>(out.sizes(), {out.strides(), BroadcastStrides(a, out.sizes()),
                                        BroadcastStrides(b, out.sizes())});
  RunLoop(loop, [&](const std::array<int64_t, 3>& off, int64_t n,
                    const std::array<int64_t, 3>& s) {
    R* o = po + off[0];
    const A* x = pa + off[1];
    const B* y = pb + off[2];
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
      const B yv = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], yv);
    } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
      const A xv = *x;
      for (int64_t i = 0; i < n; ++i) o[i] = op(xv, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = op(x[i * s[1]], y[i * s[2]]);
    }
  });
}

}  // namespace gw::internal

#endif  // GRADWIRE_TENSOR_SRC_DISPATCH_H_
