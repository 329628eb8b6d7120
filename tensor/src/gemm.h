// Internal: GEMM on strided matrices, shared by the kernels with matrix products
// (kernels::Gemm and MatMul in matmul.cc, the attention kernels in attention.cc).
//
// Contract
//   - A matrix is `rows` x `cols` elements at `data`, element (i, j) at data[i * s0 + j * s1].
//     BLAS reads it when it is row-major (unit column stride) or column-major (unit row
//     stride) with a leading dimension that fits; LayoutOf says which, or nullopt (the
//     caller copies such an operand first).
//   - RowMajorGemm computes C = alpha * op(A) op(B) + beta * C into row-major C (leading
//     dimension ldc): float32 on oneDNN's sgemm (JIT AVX2/AVX-512 kernels), float64 on a
//     cache-blocked loop that accumulates over k in order (so it also serves as the
//     reference). beta == 0 ignores C's old contents (NaN included).
//   - Errors: a failing sgemm throws gw::Error naming "Gemm" and m, n, k.
//   - Thread safety: no shared state.
#ifndef GRADWIRE_TENSOR_SRC_GEMM_H_
#define GRADWIRE_TENSOR_SRC_GEMM_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace gw::internal {

// How BLAS sees a matrix: row-major data with a leading dimension, or column-major (the
// row-major transpose).
struct MatrixLayout {
  bool col_major;
  int64_t ld;
};

inline std::optional<MatrixLayout> LayoutOf(int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  if ((s1 == 1 || cols == 1) && (s0 >= std::max<int64_t>(cols, 1) || rows == 1)) {
    return MatrixLayout{false, rows == 1 ? std::max<int64_t>(cols, 1) : s0};
  }
  if ((s0 == 1 || rows == 1) && (s1 >= std::max<int64_t>(rows, 1) || cols == 1)) {
    return MatrixLayout{true, cols == 1 ? std::max<int64_t>(rows, 1) : s1};
  }
  return std::nullopt;
}

// A matrix operand as BLAS sees it: data, a transpose flag (relative to row-major data),
// a leading dimension.
template <typename T>
struct GemmOperand {
  const T* data;
  bool trans;
  int64_t ld;
};

// The operand for `data` laid out as `layout`, transposed when `trans`.
template <typename T>
GemmOperand<T> Operand(const T* data, const MatrixLayout& layout, bool trans = false) {
  return {data, trans != layout.col_major, layout.ld};
}

void SgemmRowMajor(const GemmOperand<float>& a, const GemmOperand<float>& b, int64_t m,
                   int64_t n, int64_t k, float alpha, float beta, float* c, int64_t ldc);
void DgemmBlocked(const GemmOperand<double>& a, const GemmOperand<double>& b, int64_t m,
                  int64_t n, int64_t k, double alpha, double beta, double* c, int64_t ldc);

// C = alpha * op(A) op(B) + beta * C in T: sgemm for float, the blocked loop for double.
template <typename T>
void RowMajorGemm(const GemmOperand<T>& a, const GemmOperand<T>& b, int64_t m, int64_t n,
                  int64_t k, double alpha, double beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    SgemmRowMajor(a, b, m, n, k, static_cast<float>(alpha), static_cast<float>(beta), c, ldc);
  } else {
    DgemmBlocked(a, b, m, n, k, alpha, beta, c, ldc);
  }
}

}  // namespace gw::internal

#endif  // GRADWIRE_TENSOR_SRC_GEMM_H_
