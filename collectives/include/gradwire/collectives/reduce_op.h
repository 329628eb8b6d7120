// ReduceOp: how a collective combines the tensors of its ranks, and the element-wise
// kernels that do it (shared by the collectives and DistributedDataParallel).
//
// Contract
//   - kSum, kMax, kMin on float32, float64 and int64; kAvg (the sum divided by the
//     group's size, applied once after the sum) on float32 and float64 only: an int64
//     average would have to round, so it is refused with INVALID_ARGUMENT.
//   - ReduceInto(dst, src, op) computes dst = dst (op) src element by element over
//     `count` elements of raw memory of the given dtype; sums are commutative, so two
//     ranks that combine the same pair in either order get the same bits.
//   - CheckReducible names the first thing wrong with (dtype, op), or OK.
#ifndef GRADWIRE_COLLECTIVES_REDUCE_OP_H_
#define GRADWIRE_COLLECTIVES_REDUCE_OP_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "gradwire/tensor/dtype.h"

namespace gw::collectives {

enum class ReduceOp : int64_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

const char* ReduceOpName(ReduceOp op);
absl::Status CheckReducible(DType dtype, ReduceOp op);

// dst[i] = dst[i] (op) src[i] for i < count; kAvg adds (the division is ScaleForAverage).
// REQUIRES: CheckReducible(dtype, op) is OK; dst and src do not overlap.
void ReduceInto(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
// out[i] = a[i] (op) b[i]; out may alias a. For max and min the order matters for NaN
// and signed zeros (std::max's): callers that must agree pass the operands in one order.
void Reduce(void* out, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);
// data[i] /= n for a kAvg result (floating dtypes).
void ScaleForAverage(void* data, size_t count, DType dtype, int n);

}  // namespace gw::collectives

#endif  // GRADWIRE_COLLECTIVES_REDUCE_OP_H_
