// Internal: the CUDA kernels behind gw::kernels (namespace gw::internal::cuda), declared
// without CUDA types so that the CPU kernels' files can dispatch to them.
//
// Contract
//   - Every function runs on the current stream of its tensors' device, asynchronously: it
//     returns once the work is queued. Tensors are all on that one device (checked by the
//     caller, OnCuda below) and have the dtypes the CPU kernel accepts.
//   - out is written in place and may be strided (never broadcast); inputs broadcast to
//     out's shape (stride 0) and may be any strided view; at most 8 dims after
//     merging, else gw::Error.
//   - In a build without CUDA these throw gw::Error (no CUDA tensor can exist there).
#ifndef GRADWIRE_TENSOR_SRC_CUDA_CUDA_KERNELS_H_
#define GRADWIRE_TENSOR_SRC_CUDA_CUDA_KERNELS_H_

#include <string_view>

#include "cuda/ops.h"
#include "gradwire/tensor/tensor.h"

namespace gw::internal::cuda {

// True when t is on a GPU; then every other operand must be on that GPU (gw::Error naming
// op and both devices otherwise).
bool OnCuda(std::string_view op, const Tensor& t, std::initializer_list<const Tensor*> others = {});

void Binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double alpha = 0);
// out's dtype may differ from a's for kCopy (a conversion).
void Unary(UnaryOp op, const Tensor& out, const Tensor& a, double alpha = 0);
// out has a's rank, size 1 in the reduced dims: out = sum of a over those dims.
void SumKeepDims(const Tensor& out, const Tensor& a);
// out = alpha * op(a) @ op(b) + beta * out for 2-D matrices, or batched over a leading dim
// (3-D, with a or b possibly broadcast: batch stride 0). float32 or float64, cuBLAS.
void Gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b, double beta, const Tensor& out);
// out = softmax (log: log-softmax) of each row of contiguous [rows, cols] `in`.
void SoftmaxRows(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols, bool log);
// dst = src, both contiguous with the same byte size, on any two devices (at least one a GPU).
// A copy to the CPU returns once the data is there.
void CopyBytes(const Tensor& dst, const Tensor& src);

}  // namespace gw::internal::cuda

#endif  // GRADWIRE_TENSOR_SRC_CUDA_CUDA_KERNELS_H_
