// The host side of the element-wise and reduction CUDA kernels: tensors to launch
// geometries (merged dims, broadcast strides), errors naming the op and the device.
#include <array>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_util.h"
#include "cuda/launch.h"
#include "dispatch.h"

namespace gw::internal::cuda {
namespace {

template <size_t N>
Geometry GeometryOf(std::string_view op, const Tensor& out, const std::array<Shape, N>& strides) {
  static_assert(N <= 3);
  const Loop<N> loop = MakeLoop<N>(out.sizes(), strides);
  GW_CHECK(loop.sizes.size() <= kLaunchMaxDims, op, "a ", loop.sizes.size(),
           "-dimensional strided layout is beyond the GPU kernels' ", kLaunchMaxDims,
           " dims; make it contiguous first");
  Geometry g;
  g.ndim = static_cast<int>(loop.sizes.size());
  g.numel = out.numel();
  for (int d = 0; d < g.ndim; ++d) {
    g.sizes[d] = loop.sizes[d];
    for (size_t k = 0; k < N; ++k) g.strides[k][d] = loop.strides[k][d];
  }
  if (g.ndim == 0 && g.numel == 1) {  // a 0-d (or all-ones) tensor: one element at offset 0
    g.ndim = 1;
    g.sizes[0] = 1;
  }
  return g;
}

void CheckLaunch(cudaError_t e, std::string_view op, Device device) { CudaCheck(e, op, device); }

}  // namespace

void Binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  const Geometry g = GeometryOf<3>("cuda::Binary", out,
                                   {out.strides(), BroadcastStrides(a, out.sizes()), BroadcastStrides(b, out.sizes())});
  const Device device = out.device();
  DeviceGuard guard(device);
  CheckLaunch(LaunchBinary(static_cast<int>(op), static_cast<int>(a.dtype()), out.raw_data(), a.raw_data(),
                           b.raw_data(), g, alpha, CurrentCudaStream(device)),
              "a CUDA element-wise kernel", device);
}

void Unary(UnaryOp op, const Tensor& out, const Tensor& a, double alpha) {
  const Geometry g = GeometryOf<2>("cuda::Unary", out, {out.strides(), BroadcastStrides(a, out.sizes())});
  const Device device = out.device();
  DeviceGuard guard(device);
  CheckLaunch(LaunchUnary(static_cast<int>(op), static_cast<int>(out.dtype()), static_cast<int>(a.dtype()),
                          out.raw_data(), a.raw_data(), g, alpha, CurrentCudaStream(device)),
              "a CUDA element-wise kernel", device);
}

void SumKeepDims(const Tensor& out, const Tensor& a) {
  ReduceGeometry g;
  g.outputs = out.numel();
  g.inner = 1;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.sizes()[d] == 1) continue;
    const bool reduced = out.sizes()[d] == 1;
    int& n = reduced ? g.reduced_ndim : g.kept_ndim;
    GW_CHECK(n < kLaunchMaxDims, "Sum", "more than ", kLaunchMaxDims, " dims on the GPU");
    (reduced ? g.reduced_sizes : g.kept_sizes)[n] = a.sizes()[d];
    (reduced ? g.reduced_strides : g.kept_strides)[n] = a.strides()[d];
    ++n;
    if (reduced) g.inner *= a.sizes()[d];
  }
  GW_CHECK(out.is_contiguous(), "Sum", "the GPU reduction writes a contiguous output");
  const Device device = out.device();
  DeviceGuard guard(device);
  if (a.numel() == 0) {  // sums of nothing
    Unary(UnaryOp::kFill, out, out, 0);
    return;
  }
  CheckLaunch(LaunchSum(static_cast<int>(a.dtype()), out.raw_data(), a.raw_data(), g, CurrentCudaStream(device)),
              "a CUDA reduction kernel", device);
}

void SoftmaxRows(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols, bool log) {
  const Device device = out.device();
  DeviceGuard guard(device);
  CheckLaunch(LaunchSoftmax(static_cast<int>(in.dtype()), out.raw_data(), in.raw_data(), rows, cols, log,
                            CurrentCudaStream(device)),
              "a CUDA softmax kernel", device);
}

}  // namespace gw::internal::cuda
