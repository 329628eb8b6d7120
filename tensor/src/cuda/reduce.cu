// Sum reductions on CUDA: one block per output element; its threads stride over the
// summands, accumulate in double (float64 and float32) or int64, and combine in shared
// memory.
#include <cstdint>
#include <type_traits>

#include "cuda/launch.h"

namespace gw::internal::cuda {
namespace {

constexpr int kThreads = 256;

__device__ int64_t Offset(int64_t i, int ndim, const int64_t* sizes, const int64_t* strides) {
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    off += (i % sizes[d]) * strides[d];
    i /= sizes[d];
  }
  return off;
}

template <typename T>
__global__ void SumKernel(T* out, const T* a, ReduceGeometry g) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  __shared__ Acc partial[kThreads];
  for (int64_t o = blockIdx.x; o < g.outputs; o += gridDim.x) {
    const T* base = a + Offset(o, g.kept_ndim, g.kept_sizes, g.kept_strides);
    Acc acc = 0;
    for (int64_t r = threadIdx.x; r < g.inner; r += blockDim.x) {
      acc += static_cast<Acc>(base[Offset(r, g.reduced_ndim, g.reduced_sizes, g.reduced_strides)]);
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int width = kThreads / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = static_cast<T>(partial[0]);
    __syncthreads();
  }
}

template <typename T>
cudaError_t Launch(void* out, const void* a, const ReduceGeometry& g, cudaStream_t stream) {
  const int blocks = static_cast<int>(g.outputs < 65536 ? g.outputs : 65536);
  SumKernel<<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(a), g);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSum(int dtype, void* out, const void* a, const ReduceGeometry& g, cudaStream_t stream) {
  if (g.outputs == 0) return cudaSuccess;
  switch (dtype) {
    case 0: return Launch<float>(out, a, g, stream);
    case 1: return Launch<double>(out, a, g, stream);
    case 2: return Launch<int64_t>(out, a, g, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gw::internal::cuda
