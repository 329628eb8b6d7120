// Matrix products on CUDA through cuBLAS: row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T, so the operands go in swapped, with no copy.
#include <cublas_v2.h>

#include <array>
#include <mutex>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_util.h"

namespace gw::internal::cuda {
namespace {

void CublasCheck(cublasStatus_t s, std::string_view what, Device device) {
  GW_CHECK(s == CUBLAS_STATUS_SUCCESS, what, "cuBLAS failed on ", device.ToString(), ": ", cublasGetStatusString(s));
}

// One handle per device and thread (cuBLAS handles are not for concurrent use), kept for
// the thread's life.
cublasHandle_t Handle(Device device) {
  thread_local std::array<cublasHandle_t, 64> handles{};
  cublasHandle_t& h = handles[device.index];
  if (h == nullptr) CublasCheck(cublasCreate(&h), "cublasCreate", device);
  CublasCheck(cublasSetStream(h, CurrentCudaStream(device)), "cublasSetStream", device);
  return h;
}

// A matrix operand as cuBLAS sees it (column-major): its leading dimension, and whether
// the row-major view must be transposed once more.
struct Operand {
  const void* data;
  int64_t ld;
  bool transposed;  // stored as the transpose of its row-major self
  int64_t batch_stride;
};

Operand OperandOf(std::string_view op, const Tensor& t) {
  const int64_t r = t.dim();
  const int64_t rows = t.sizes()[r - 2], cols = t.sizes()[r - 1];
  const int64_t rs = t.strides()[r - 2], cs = t.strides()[r - 1];
  const int64_t batch_stride = r == 3 ? t.strides()[0] : 0;
  if (cs == 1 && (rs >= std::max<int64_t>(cols, 1) || rows == 1)) {
    return {t.raw_data(), std::max<int64_t>({rs, cols, 1}), false, batch_stride};
  }
  GW_CHECK(rs == 1 && (cs >= std::max<int64_t>(rows, 1) || cols == 1), op,
           "the GPU matrix product needs row- or column-major matrices (make the operand contiguous)");
  return {t.raw_data(), std::max<int64_t>({cs, rows, 1}), true, batch_stride};
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b, double beta, const Tensor& out) {
  const Device device = out.device();
  const int64_t r = out.dim();
  GW_CHECK((r == 2 || r == 3) && a.dim() == r && b.dim() == r, "MatMul",
           "the GPU matrix product takes 2-D or 3-D operands");
  const Operand A = OperandOf("MatMul", a), B = OperandOf("MatMul", b), C = OperandOf("MatMul", out);
  GW_CHECK(!C.transposed || out.sizes()[r - 1] == 1, "MatMul", "the GPU matrix product writes a row-major output");
  const int64_t m = out.sizes()[r - 2], n = out.sizes()[r - 1];
  const int64_t k = trans_a ? a.sizes()[r - 2] : a.sizes()[r - 1];
  const int64_t batch = r == 3 ? out.sizes()[0] : 1;
  if (m == 0 || n == 0) return;
  // Column-major: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  const cublasOperation_t op_b = (trans_b != B.transposed) ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = (trans_a != A.transposed) ? CUBLAS_OP_T : CUBLAS_OP_N;
  DeviceGuard guard(device);
  cublasHandle_t h = Handle(device);
  if (k == 0) {
    Unary(UnaryOp::kScale, out, out, beta);
    return;
  }
  if (out.dtype() == DType::kFloat32) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    CublasCheck(cublasSgemmStridedBatched(h, op_b, op_a, n, m, k, &al, static_cast<const float*>(B.data), B.ld,
                                          B.batch_stride, static_cast<const float*>(A.data), A.ld, A.batch_stride, &be,
                                          static_cast<float*>(out.raw_data()), C.ld, C.batch_stride, batch),
                "MatMul", device);
  } else {
    GW_CHECK(out.dtype() == DType::kFloat64, "MatMul", "the GPU matrix product takes float32 or float64");
    CublasCheck(cublasDgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, static_cast<const double*>(B.data), B.ld,
                                          B.batch_stride, static_cast<const double*>(A.data), A.ld, A.batch_stride,
                                          &beta, static_cast<double*>(out.raw_data()), C.ld, C.batch_stride, batch),
                "MatMul", device);
  }
}

}  // namespace gw::internal::cuda
