// The GEMM loops of gemm.h: oneDNN's sgemm for float32, a cache-blocked loop for float64.
#include "gemm.h"

#include <dnnl.h>

#include <vector>

#include "gradwire/tensor/error.h"

namespace gw::internal {

void SgemmRowMajor(const GemmOperand<float>& a, const GemmOperand<float>& b, int64_t m,
                   int64_t n, int64_t k, float alpha, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status =
      dnnl_sgemm(a.trans ? 'T' : 'N', b.trans ? 'T' : 'N', m, n, k, alpha, a.data, a.ld, b.data,
                 b.ld, beta, c, ldc);
  GW_CHECK(status == dnnl_success, "Gemm", "oneDNN sgemm failed with status ",
           static_cast<int>(status), " for m=", m, " n=", n, " k=", k);
}

void DgemmBlocked(const GemmOperand<double>& a, const GemmOperand<double>& b, int64_t m,
                  int64_t n, int64_t k, double alpha, double beta, double* c, int64_t ldc) {
  auto at = [&](int64_t i, int64_t p) { return a.trans ? a.data[p * a.ld + i] : a.data[i * a.ld + p]; };
  auto bt = [&](int64_t p, int64_t j) { return b.trans ? b.data[j * b.ld + p] : b.data[p * b.ld + j]; };
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0 : beta * c[i * ldc + j];
  }
  constexpr int64_t kBlock = 64;
  std::vector<double> bpanel(static_cast<size_t>(kBlock * kBlock));
  for (int64_t p0 = 0; p0 < k; p0 += kBlock) {
    const int64_t p1 = std::min(k, p0 + kBlock);
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t j1 = std::min(n, j0 + kBlock);
      const int64_t nj = j1 - j0;
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t j = j0; j < j1; ++j) bpanel[(p - p0) * nj + (j - j0)] = bt(p, j);
      }
      for (int64_t i = 0; i < m; ++i) {
        double* crow = c + i * ldc + j0;
        for (int64_t p = p0; p < p1; ++p) {
          const double aip = alpha * at(i, p);
          const double* brow = bpanel.data() + (p - p0) * nj;
          for (int64_t j = 0; j < nj; ++j) crow[j] += aip * brow[j];
        }
      }
    }
  }
}

}  // namespace gw::internal
