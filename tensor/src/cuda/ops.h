// Internal: the element-wise operations of the CUDA kernels, shared by kernels.cc (host) and
// the .cu files (device); no dependencies, so that nvcc compiles it alone.
#ifndef GRADWIRE_TENSOR_SRC_CUDA_OPS_H_
#define GRADWIRE_TENSOR_SRC_CUDA_OPS_H_

namespace gw::internal::cuda {

enum class BinaryOp : int {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMaximum,
  kAxpy,             // a + alpha * b
  kReluBackward,     // a * (b > 0), b the forward's output
  kTanhBackward,     // a * (1 - b^2)
  kSigmoidBackward,  // a * b * (1 - b)
  kEq,
  kLt,
  kGt,  // bool out
};
enum class UnaryOp : int {
  kCopy,
  kNeg,
  kAbs,
  kRelu,
  kExp,
  kLog,
  kSqrt,
  kTanh,
  kSigmoid,
  kScale,      // x * alpha
  kAddScalar,  // x + alpha
  kFill,       // alpha (a is out itself)
};

}  // namespace gw::internal::cuda

#endif  // GRADWIRE_TENSOR_SRC_CUDA_OPS_H_
