// Softmax and log-softmax over the rows of a contiguous [rows, cols] matrix: one block per
// row; the row's maximum, then the sum of exp(x - max) accumulated in double, each combined
// in shared memory, then the outputs.
#include <cstdint>

#include "cuda/launch.h"

namespace gw::internal::cuda {
namespace {

constexpr int kThreads = 256;

// Combines every thread's value with op; all threads get the result.
template <typename T, typename Op>
__device__ T BlockReduce(T value, T* shared, Op op) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + width]);
    __syncthreads();
  }
  const T result = shared[0];
  __syncthreads();
  return result;
}

struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b || a != a ? a : b; }
};
struct Plus {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

template <typename T>
__global__ void SoftmaxKernel(T* out, const T* in, int64_t rows, int64_t cols, bool log) {
  __shared__ T max_shared[kThreads];
  __shared__ double sum_shared[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = in + r * cols;
    T* y = out + r * cols;
    T m = x[0];
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = Max()(m, x[i]);
    m = BlockReduce(m, max_shared, Max());
    double sum = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += exp(static_cast<double>(x[i] - m));
    sum = BlockReduce(sum, sum_shared, Plus());
    if (log) {
      const T lse = m + static_cast<T>(::log(sum));
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) y[i] = x[i] - lse;
    } else {
      const double inv = 1.0 / sum;
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        y[i] = static_cast<T>(exp(static_cast<double>(x[i] - m)) * inv);
      }
    }
  }
}

}  // namespace

cudaError_t LaunchSoftmax(int dtype, void* out, const void* in, int64_t rows, int64_t cols, bool log,
                          cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const int blocks = static_cast<int>(rows < 65536 ? rows : 65536);
  switch (dtype) {
    case 0:
      SoftmaxKernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(out), static_cast<const float*>(in), rows,
                                                     cols, log);
      break;
    case 1:
      SoftmaxKernel<<<blocks, kThreads, 0, stream>>>(static_cast<double*>(out), static_cast<const double*>(in), rows,
                                                     cols, log);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace gw::internal::cuda
