// Element-wise CUDA kernels: one grid-stride loop over the output's elements, each thread
// mapping its linear index to the operands' offsets through the merged dims (launch.h).
#include <cstdint>
#include <type_traits>

#include "cuda/launch.h"
#include "cuda/ops.h"

namespace gw::internal::cuda {
namespace {

constexpr int kThreads = 256;

template <int N>
struct Offsets {
  int64_t at[N];
};

template <int N>
__device__ Offsets<N> OffsetsOf(int64_t i, const Geometry& g) {
  Offsets<N> o{};
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t size = g.sizes[d];
    const int64_t idx = i % size;
    i /= size;
    for (int k = 0; k < N; ++k) o.at[k] += idx * g.strides[k][d];
  }
  return o;
}

int Blocks(int64_t numel) {
  const int64_t blocks = (numel + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65536 ? blocks : 65536);
}

template <typename R, typename A, typename B, typename Op>
__global__ void BinaryKernel(R* out, const A* a, const B* b, Geometry g, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < g.numel; i += int64_t{gridDim.x} * blockDim.x) {
    const Offsets<3> o = OffsetsOf<3>(i, g);
    out[o.at[0]] = op(a[o.at[1]], b[o.at[2]]);
  }
}

template <typename R, typename A, typename Op>
__global__ void UnaryKernel(R* out, const A* a, Geometry g, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < g.numel; i += int64_t{gridDim.x} * blockDim.x) {
    const Offsets<2> o = OffsetsOf<2>(i, g);
    out[o.at[0]] = op(a[o.at[1]]);
  }
}

template <typename T>
struct BinaryFn {
  BinaryOp op;
  T alpha;
  __device__ T operator()(T x, T y) const {
    switch (op) {
      case BinaryOp::kAdd: return x + y;
      case BinaryOp::kSub: return x - y;
      case BinaryOp::kMul: return x * y;
      case BinaryOp::kDiv: return x / y;
      case BinaryOp::kMaximum: return x > y || x != x ? x : y;  // NaN propagates, as on the CPU
      case BinaryOp::kAxpy: return x + alpha * y;
      case BinaryOp::kReluBackward: return y > T(0) ? x : T(0);
      case BinaryOp::kTanhBackward: return x * (T(1) - y * y);
      case BinaryOp::kSigmoidBackward: return x * y * (T(1) - y);
      default: return T(0);
    }
  }
};

template <typename T>
struct CompareFn {
  BinaryOp op;
  __device__ bool operator()(T x, T y) const {
    switch (op) {
      case BinaryOp::kEq: return x == y;
      case BinaryOp::kLt: return x < y;
      case BinaryOp::kGt: return x > y;
      default: return false;
    }
  }
};

template <typename T>
__device__ T Exp(T x) { return exp(x); }
template <>
__device__ float Exp(float x) { return expf(x); }

template <typename T>
struct UnaryFn {
  UnaryOp op;
  T alpha;
  __device__ T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      switch (op) {
        case UnaryOp::kExp: return Exp(x);
        case UnaryOp::kLog: return log(x);
        case UnaryOp::kSqrt: return sqrt(x);
        case UnaryOp::kTanh: return tanh(x);
        case UnaryOp::kSigmoid: return T(1) / (T(1) + Exp(-x));
        default: break;
      }
    }
    switch (op) {
      case UnaryOp::kCopy: return x;
      case UnaryOp::kNeg: return -x;
      case UnaryOp::kAbs: return x < T(0) ? -x : x;
      case UnaryOp::kRelu: return x > T(0) ? x : T(0);
      case UnaryOp::kScale: return x * alpha;
      case UnaryOp::kAddScalar: return x + alpha;
      case UnaryOp::kFill: return alpha;
      default: return x;
    }
  }
};

template <typename R, typename A>
struct Convert {
  __device__ R operator()(A x) const { return static_cast<R>(x); }
};

struct FillBool {
  bool value;
  __device__ bool operator()(bool) const { return value; }
};

template <typename F>
cudaError_t ByDType(int dtype, F&& f) {
  switch (dtype) {
    case 0: return f(float{});
    case 1: return f(double{});
    case 2: return f(int64_t{});
    case 3: return f(bool{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchBinary(int op_code, int dtype, void* out, const void* a, const void* b, const Geometry& g,
                         double alpha, cudaStream_t stream) {
  if (g.numel == 0) return cudaSuccess;
  const auto op = static_cast<BinaryOp>(op_code);
  const bool compare = op == BinaryOp::kEq || op == BinaryOp::kLt || op == BinaryOp::kGt;
  return ByDType(dtype, [&]<typename T>(T) {
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorInvalidValue;
    } else {
      if (compare) {
        BinaryKernel<<<Blocks(g.numel), kThreads, 0, stream>>>(static_cast<bool*>(out), static_cast<const T*>(a),
                                                               static_cast<const T*>(b), g, CompareFn<T>{op});
      } else {
        BinaryKernel<<<Blocks(g.numel), kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(a),
                                                               static_cast<const T*>(b), g,
                                                               BinaryFn<T>{op, static_cast<T>(alpha)});
      }
      return cudaGetLastError();
    }
  });
}

cudaError_t LaunchUnary(int op_code, int out_dtype, int in_dtype, void* out, const void* a, const Geometry& g,
                        double alpha, cudaStream_t stream) {
  if (g.numel == 0) return cudaSuccess;
  const auto op = static_cast<UnaryOp>(op_code);
  if (op == UnaryOp::kCopy && out_dtype != in_dtype) {
    return ByDType(out_dtype, [&]<typename R>(R) {
      return ByDType(in_dtype, [&]<typename A>(A) {
        UnaryKernel<<<Blocks(g.numel), kThreads, 0, stream>>>(static_cast<R*>(out), static_cast<const A*>(a), g,
                                                              Convert<R, A>{});
        return cudaGetLastError();
      });
    });
  }
  return ByDType(out_dtype, [&]<typename T>(T) {
    if constexpr (std::is_same_v<T, bool>) {
      if (op != UnaryOp::kCopy && op != UnaryOp::kFill) return cudaErrorInvalidValue;
      const bool value = alpha != 0;
      if (op == UnaryOp::kFill) {
        UnaryKernel<<<Blocks(g.numel), kThreads, 0, stream>>>(static_cast<bool*>(out), static_cast<const bool*>(a), g,
                                                              FillBool{value});
      } else {
        UnaryKernel<<<Blocks(g.numel), kThreads, 0, stream>>>(static_cast<bool*>(out), static_cast<const bool*>(a), g,
                                                              Convert<bool, bool>{});
      }
    } else {
      UnaryKernel<<<Blocks(g.numel), kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(a), g,
                                                            UnaryFn<T>{op, static_cast<T>(alpha)});
    }
    return cudaGetLastError();
  });
}

}  // namespace gw::internal::cuda
