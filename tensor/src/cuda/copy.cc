// Copies between the CPU and GPUs, and between GPUs, on the current stream of the GPU side
// (the destination's when both are GPUs).
#include <cuda_runtime.h>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_util.h"

namespace gw::internal::cuda {

void CopyBytes(const Tensor& dst, const Tensor& src) {
  GW_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.nbytes() == src.nbytes(), "CopyBytes",
           "needs contiguous tensors of one size, got ", ShapeToString(dst.sizes()), " and ",
           ShapeToString(src.sizes()));
  const size_t n = dst.nbytes();
  if (n == 0) return;
  const Device from = src.device();
  const Device to = dst.device();
  if (to.is_cuda() && from.is_cuda()) {
    DeviceGuard guard(to);
    const cudaStream_t stream = CurrentCudaStream(to);
    if (to == from) {
      CudaCheck(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), n, cudaMemcpyDeviceToDevice, stream),
                "a device-to-device copy", to);
    } else {
      CudaCheck(cudaMemcpyPeerAsync(dst.raw_data(), to.index, src.raw_data(), from.index, n, stream),
                "a copy from " + from.ToString(), to);
    }
  } else if (to.is_cuda()) {
    // From pageable memory the runtime stages through its own pinned buffer and returns once
    // src has been read: the caller may reuse src at once.
    DeviceGuard guard(to);
    CudaCheck(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), n, cudaMemcpyHostToDevice, CurrentCudaStream(to)),
              "a copy from the CPU", to);
  } else {
    DeviceGuard guard(from);
    const cudaStream_t stream = CurrentCudaStream(from);
    CudaCheck(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), n, cudaMemcpyDeviceToHost, stream), "a copy to the CPU",
              from);
    CudaCheck(cudaStreamSynchronize(stream), "a copy to the CPU", from);
  }
}

}  // namespace gw::internal::cuda
