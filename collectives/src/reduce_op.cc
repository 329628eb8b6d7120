#include "gradwire/collectives/reduce_op.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gw::collectives {
namespace {

template <typename T>
void Combine(T* __restrict out, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      return;
  }
}

// In place (out == a): the compiler vectorises this form without an aliasing check.
template <typename T>
void CombineInto(T* __restrict dst, const T* __restrict src, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) dst[i] += src[i];
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);
      return;
  }
}

}  // namespace

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

absl::Status CheckReducible(DType dtype, ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg && op != ReduceOp::kMax && op != ReduceOp::kMin) {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduce op ", static_cast<int64_t>(op)));
  }
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat("collectives reduce float32, float64 and int64 tensors, not ", DTypeName(dtype)));
  }
  if (op == ReduceOp::kAvg && dtype == DType::kInt64) {
    return absl::InvalidArgumentError("an average of int64 tensors would have to round: reduce with sum and divide");
  }
  return absl::OkStatus();
}

void ReduceInto(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32: return CombineInto(static_cast<float*>(dst), static_cast<const float*>(src), count, op);
    case DType::kFloat64: return CombineInto(static_cast<double*>(dst), static_cast<const double*>(src), count, op);
    case DType::kInt64: return CombineInto(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, op);
    default: return;
  }
}

void Reduce(void* out, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  if (out == a) return ReduceInto(out, b, count, dtype, op);
  switch (dtype) {
    case DType::kFloat32:
      return Combine(static_cast<float*>(out), static_cast<const float*>(a), static_cast<const float*>(b), count, op);
    case DType::kFloat64:
      return Combine(static_cast<double*>(out), static_cast<const double*>(a), static_cast<const double*>(b), count, op);
    case DType::kInt64:
      return Combine(static_cast<int64_t*>(out), static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), count,
                     op);
    default: return;
  }
}

void ScaleForAverage(void* data, size_t count, DType dtype, int n) {
  if (dtype == DType::kFloat32) {
    float* d = static_cast<float*>(data);
    const float fn = static_cast<float>(n);
    for (size_t i = 0; i < count; ++i) d[i] /= fn;
  } else if (dtype == DType::kFloat64) {
    double* d = static_cast<double*>(data);
    const double dn = n;
    for (size_t i = 0; i < count; ++i) d[i] /= dn;
  }
}

}  // namespace gw::collectives
