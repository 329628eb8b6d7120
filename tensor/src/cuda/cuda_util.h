// Internal (CUDA build only): error checks, the device guard and stream conversions shared
// by the CUDA backend's files.
#ifndef GRADWIRE_TENSOR_SRC_CUDA_CUDA_UTIL_H_
#define GRADWIRE_TENSOR_SRC_CUDA_CUDA_UTIL_H_

#include <cuda_runtime.h>

#include <string_view>

#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/error.h"

namespace gw::internal {

// Throws gw::Error "<what> on cuda:N failed: <CUDA's message>" unless e is cudaSuccess.
inline void CudaCheck(cudaError_t e, std::string_view what, Device device) {
  if (e == cudaSuccess) [[likely]]
    return;
  cudaGetLastError();  // a non-sticky error must not be reported again by the next call
  Fail(what, "on ", device.ToString(), " failed: ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")");
}

inline cudaStream_t ToCudaStream(StreamId id) { return reinterpret_cast<cudaStream_t>(id); }

inline cudaStream_t CurrentCudaStream(Device device) { return ToCudaStream(gw::cuda::CurrentStream(device).id); }

// Makes `device` current for the scope (CUDA's current device is per thread).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device) {
    cudaGetDevice(&previous_);
    if (previous_ != device.index) CudaCheck(cudaSetDevice(device.index), "cudaSetDevice", device);
  }
  ~DeviceGuard() {
    int now = -1;
    cudaGetDevice(&now);
    if (now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace gw::internal

#endif  // GRADWIRE_TENSOR_SRC_CUDA_CUDA_UTIL_H_
