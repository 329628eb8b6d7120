// Shape: sizes or strides of a tensor, plus helpers for broadcasting and dims.
//
// Contract
//   - Shape is a small inline vector (no heap allocation up to 6 dims).
//   - NormalizeDim accepts Python-style negative dims and throws gw::Error naming the op
//     when the dim is out of range.
//   - BroadcastShapes follows NumPy rules and throws gw::Error naming the op and both
//     shapes when they are incompatible.
#ifndef GRADWIRE_TENSOR_SHAPE_H_
#define GRADWIRE_TENSOR_SHAPE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/container/inlined_vector.h"

namespace gw {

using Shape = absl::InlinedVector<int64_t, 6>;

std::string ShapeToString(const Shape& s);  // "[2, 3]"
int64_t NumElements(const Shape& s);
Shape ContiguousStrides(const Shape& sizes);
int64_t NormalizeDim(std::string_view op, int64_t dim, int64_t ndim);
Shape BroadcastShapes(std::string_view op, const Shape& a, const Shape& b);

}  // namespace gw

#endif  // GRADWIRE_TENSOR_SHAPE_H_
