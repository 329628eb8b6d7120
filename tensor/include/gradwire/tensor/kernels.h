// gw::kernels: tensor math that never records autograd.
//
// Contract
//   - These are the raw operations the autograd layer, optimizers and servers build on.
//     They ignore requires_grad and GradMode entirely; for differentiable math use the
//     functions in gradwire/autograd/functions.h (namespace gw).
//   - Out-of-place ops return a new contiguous tensor; view ops (Reshape when possible,
//     View, Transpose, Permute, Narrow, Select, Expand, Squeeze, Unsqueeze) share storage.
//   - Binary ops broadcast NumPy-style and require equal dtypes (no implicit promotion).
//   - *InPlace ops write into their first argument and bump its storage version.
//   - Errors (shape/dtype mismatch, index out of range, operands on different devices, an
//     op with no kernel for its tensors' device) throw gw::Error naming the op and the
//     shapes or devices involved.
//   - Devices: every op runs on the CPU. On a GPU (gradwire/tensor/cuda.h), so far: views,
//     Contiguous, Clone, ToDType, ToDevice, Fill, CopyInPlace, AddInPlace, ScaleInPlace,
//     Add, Sub, Mul, Div, Maximum, Eq, Lt, Gt, AddScalar, MulScalar, Neg, Abs, Exp, Log,
//     Sqrt, Relu, Tanh, Sigmoid and their backward kernels, Sum, Mean, SumToShape, MatMul,
//     Gemm and Linear; results stay on the operands' device, queued on its current stream.
//   - float32 matrix products run on oneDNN's sgemm (JIT AVX2/AVX-512 kernels), batched
//     ones on one oneDNN matmul primitive; float64 uses a cache-blocked loop. GELU and SiLU
//     run in float32 on oneDNN's eltwise primitives. oneDNN primitives are cached by shape
//     and strides. Compute is single-threaded unless oneDNN's OpenMP is allowed more threads
//     (OMP_NUM_THREADS).
//   - Random ops (DropoutMask) draw from an explicit Generator.
#ifndef GRADWIRE_TENSOR_KERNELS_H_
#define GRADWIRE_TENSOR_KERNELS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gw {

// GELU's formula: the exact x * Phi(x) (with erf), or PyTorch's approximate="tanh".
enum class GeluApproximate { kNone, kTanh };

}  // namespace gw

namespace gw::kernels {

// ---- views and copies ----
// -1 in `sizes` is inferred. A view when the strides allow it, otherwise a copy.
Tensor Reshape(const Tensor& t, Shape sizes);
// Like Reshape but throws when a copy would be needed.
Tensor View(const Tensor& t, Shape sizes);
Tensor Transpose(const Tensor& t, int64_t dim0, int64_t dim1);
Tensor Permute(const Tensor& t, const Shape& dims);
Tensor Narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor Select(const Tensor& t, int64_t dim, int64_t index);  // removes `dim`
Tensor Expand(const Tensor& t, const Shape& sizes);          // -1 keeps a size
Tensor Squeeze(const Tensor& t, int64_t dim);
Tensor Unsqueeze(const Tensor& t, int64_t dim);
// [d0, ..., dn-1, last] -> [d0 * ... * dn-1, last] (a view when possible). REQUIRES dim >= 1.
Tensor Flatten2D(const Tensor& t);
// Merges dims start_dim..end_dim (inclusive) into one, as torch.flatten; a view when the
// strides allow it. A 0-d tensor becomes [1].
Tensor Flatten(const Tensor& t, int64_t start_dim = 1, int64_t end_dim = -1);
// Views of consecutive pieces along `dim` (torch.split / torch.chunk): of `split_size`
// each (the last one smaller when it does not divide), of the given sizes (which must sum
// to size(dim)), or `chunks` pieces of ceil(size(dim) / chunks) (possibly fewer pieces).
std::vector<Tensor> Split(const Tensor& t, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> Split(const Tensor& t, const Shape& sizes, int64_t dim = 0);
std::vector<Tensor> Chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);
Tensor Contiguous(const Tensor& t);  // returns t itself when already contiguous
Tensor Clone(const Tensor& t);       // always a fresh contiguous copy
Tensor ToDType(const Tensor& t, DType dtype);  // returns t itself when dtype already matches
// A contiguous copy on `device` (t itself when it is there already). A copy to the CPU
// returns once the data is there. gw::To (autograd/functions.h) records autograd.
Tensor ToDevice(const Tensor& t, Device device);

// ---- element-wise ----
Tensor Add(const Tensor& a, const Tensor& b);
Tensor Sub(const Tensor& a, const Tensor& b);
Tensor Mul(const Tensor& a, const Tensor& b);
Tensor Div(const Tensor& a, const Tensor& b);
Tensor Pow(const Tensor& a, const Tensor& b);
Tensor Maximum(const Tensor& a, const Tensor& b);
Tensor Eq(const Tensor& a, const Tensor& b);  // comparisons return bool tensors
Tensor Ne(const Tensor& a, const Tensor& b);
Tensor Lt(const Tensor& a, const Tensor& b);
Tensor Le(const Tensor& a, const Tensor& b);
Tensor Gt(const Tensor& a, const Tensor& b);
Tensor Ge(const Tensor& a, const Tensor& b);
Tensor Where(const Tensor& mask, const Tensor& a, const Tensor& b);  // mask: bool
// t with `value` where mask (bool) is true; t and mask broadcast together.
Tensor MaskedFill(const Tensor& t, const Tensor& mask, double value);

Tensor AddScalar(const Tensor& a, double s);
Tensor MulScalar(const Tensor& a, double s);
Tensor PowScalar(const Tensor& a, double exponent);
Tensor Neg(const Tensor& a);
Tensor Exp(const Tensor& a);
Tensor Log(const Tensor& a);
Tensor Sqrt(const Tensor& a);
Tensor Abs(const Tensor& a);
Tensor Relu(const Tensor& a);
Tensor Tanh(const Tensor& a);
Tensor Sigmoid(const Tensor& a);
Tensor Erf(const Tensor& a);
// x * Phi(x), Phi the standard normal CDF (or its tanh approximation).
Tensor Gelu(const Tensor& a, GeluApproximate approximate = GeluApproximate::kNone);
Tensor Silu(const Tensor& a);  // x * sigmoid(x)

// Backward helpers, given the forward output `out` and the incoming gradient.
Tensor ReluBackward(const Tensor& grad, const Tensor& out);
Tensor TanhBackward(const Tensor& grad, const Tensor& out);
Tensor SigmoidBackward(const Tensor& grad, const Tensor& out);
// ... or given the forward input.
Tensor ErfBackward(const Tensor& grad, const Tensor& input);
Tensor GeluBackward(const Tensor& grad, const Tensor& input,
                    GeluApproximate approximate = GeluApproximate::kNone);
Tensor SiluBackward(const Tensor& grad, const Tensor& input);

// ---- random masks ----
// Dropout's mask of `sizes`: 1/(1-p) with probability 1-p, else 0 (all 0 when p == 1).
// Each element is decided by a counter-based 32-bit hash of its index and one 64-bit
// seed drawn from `gen` (vectorised; a seeded gen gives the same mask on every run).
// REQUIRES: 0 <= p <= 1; dtype floating.
Tensor DropoutMask(const Shape& sizes, double p, DType dtype, Generator& gen);

// ---- in place (dst is written; dst's storage version is bumped) ----
void Fill(const Tensor& dst, double value);
void CopyInPlace(const Tensor& dst, const Tensor& src);  // src broadcasts to dst; may be on another device
void AddInPlace(const Tensor& dst, const Tensor& src, double alpha = 1.0);  // dst += alpha*src
void ScaleInPlace(const Tensor& dst, double s);

// ---- reductions ----
// Empty `dims` reduces over every dimension.
Tensor Sum(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
Tensor Mean(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
// Variance over `dims`: sum((x - mean)^2) / (N - correction), N the count reduced (PyTorch's
// unbiased default is correction = 1). N <= correction gives inf or nan, as PyTorch.
Tensor Var(const Tensor& t, const Shape& dims = {}, double correction = 1, bool keepdim = false);
// Maximum along `dim` with the index of the (first) maximum.
std::pair<Tensor, Tensor> Max(const Tensor& t, int64_t dim, bool keepdim = false);
Tensor MaxAll(const Tensor& t);
Tensor Argmax(const Tensor& t, int64_t dim, bool keepdim = false);
// Sums `t` down to `sizes` (the inverse of broadcasting `sizes` up to t's shape).
Tensor SumToShape(const Tensor& t, const Shape& sizes);

// ---- linear algebra ----
// 2-D x 2-D, 1-D operands (as in NumPy), and batched N-D with broadcast batch dims.
Tensor MatMul(const Tensor& a, const Tensor& b);
// x[.., in] * w[out, in]^T + bias[out] in one GEMM; bias may be undefined.
Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& bias);
// c = alpha * op(a) * op(b) + beta * c for 2-D tensors, where op transposes when asked.
void Gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
          double beta, const Tensor& c);

// ---- softmax family ----
Tensor Softmax(const Tensor& t, int64_t dim);
Tensor LogSoftmax(const Tensor& t, int64_t dim);
Tensor SoftmaxBackward(const Tensor& grad, const Tensor& out, int64_t dim);
Tensor LogSoftmaxBackward(const Tensor& grad, const Tensor& out, int64_t dim);

// ---- indexing ----
// index: int64, 1-D. Throws when an index is out of [0, size(dim)).
Tensor IndexSelect(const Tensor& t, int64_t dim, const Tensor& index);
// A copy of t with src's slices added at `index` along dim (duplicates accumulate).
Tensor IndexAdd(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
void IndexAddInPlace(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
// out[i][j] = t[index[i][j]][j] for dim 0 (and so on), as torch.gather: index is int64 with
// t's rank, no larger than t outside `dim`; the output has index's shape.
Tensor Gather(const Tensor& t, int64_t dim, const Tensor& index);
// Gather's adjoint: a copy of t with t[index[i][j]][j] += src[i][j] for dim 0 (duplicates
// accumulate), as torch.scatter_add; src no smaller than index.
Tensor ScatterAdd(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
void ScatterAddInPlace(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor Stack(const std::vector<Tensor>& tensors, int64_t dim);

// ---- comparison helpers (tests, tools) ----
double MaxAbsDiff(const Tensor& a, const Tensor& b);
bool AllClose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace gw::kernels

#endif  // GRADWIRE_TENSOR_KERNELS_H_
