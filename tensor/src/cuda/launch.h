// Internal (CUDA build only): the kernel launchers of the .cu files, in plain types, so that
// nvcc compiles no gradwire or Abseil header. kernels.cc turns tensors into these.
//
// Contract
//   - Pointers are to the first element of each operand; strides are in elements; dtypes
//     are gw::DType's values (0 float32, 1 float64, 2 int64, 3 bool).
//   - Ops are cuda_kernels.h's BinaryOp / UnaryOp values. Unsupported (op, dtype) pairs
//     were rejected by the caller.
//   - Each launcher queues its kernel on `stream` and returns cudaGetLastError().
#ifndef GRADWIRE_TENSOR_SRC_CUDA_LAUNCH_H_
#define GRADWIRE_TENSOR_SRC_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace gw::internal::cuda {

constexpr int kLaunchMaxDims = 8;

// An element-wise iteration space over up to 3 operands (0: out).
struct Geometry {
  int ndim = 0;
  int64_t numel = 0;
  int64_t sizes[kLaunchMaxDims] = {};
  int64_t strides[3][kLaunchMaxDims] = {};
};

// A reduction: every output element sums `inner` input elements. The kept dims index the
// outputs (out is contiguous over them), the reduced dims the summands.
struct ReduceGeometry {
  int kept_ndim = 0;
  int reduced_ndim = 0;
  int64_t outputs = 0;
  int64_t inner = 0;
  int64_t kept_sizes[kLaunchMaxDims] = {};
  int64_t kept_strides[kLaunchMaxDims] = {};  // of the input
  int64_t reduced_sizes[kLaunchMaxDims] = {};
  int64_t reduced_strides[kLaunchMaxDims] = {};
};

cudaError_t LaunchBinary(int op, int dtype, void* out, const void* a, const void* b, const Geometry& g, double alpha,
                         cudaStream_t stream);
cudaError_t LaunchUnary(int op, int out_dtype, int in_dtype, void* out, const void* a, const Geometry& g, double alpha,
                        cudaStream_t stream);
cudaError_t LaunchSum(int dtype, void* out, const void* a, const ReduceGeometry& g, cudaStream_t stream);
// Softmax (log: log-softmax) of each row of contiguous [rows, cols] float32/float64 data.
cudaError_t LaunchSoftmax(int dtype, void* out, const void* in, int64_t rows, int64_t cols, bool log,
                          cudaStream_t stream);

}  // namespace gw::internal::cuda

#endif  // GRADWIRE_TENSOR_SRC_CUDA_LAUNCH_H_
