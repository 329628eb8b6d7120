// DType: the element types a gw::Tensor can hold.
//
// Contract
//   - kFloat32, kFloat64 (differentiable), kInt64 (indices, labels), kBool (masks).
//   - DTypeOf<T>() maps a C++ element type to its DType; ElementSize/DTypeName describe it.
//   - Values are part of the state_dict file format: never renumber them.
#ifndef GRADWIRE_TENSOR_DTYPE_H_
#define GRADWIRE_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>

namespace gw {

enum class DType : uint8_t { kFloat32 = 0, kFloat64 = 1, kInt64 = 2, kBool = 3 };

constexpr size_t ElementSize(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
  }
  return 0;
}

constexpr const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

constexpr bool IsFloating(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

template <typename T> constexpr DType DTypeOf();
template <> constexpr DType DTypeOf<float>() { return DType::kFloat32; }
template <> constexpr DType DTypeOf<double>() { return DType::kFloat64; }
template <> constexpr DType DTypeOf<int64_t>() { return DType::kInt64; }
template <> constexpr DType DTypeOf<bool>() { return DType::kBool; }

}  // namespace gw

#endif  // GRADWIRE_TENSOR_DTYPE_H_
