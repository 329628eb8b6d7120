// Differentiable tensor math: the functions users write models with.
//
// Contract
//   - Each function computes its result with gw::kernels and, when grad mode is on and an
//     input requires grad, records a backward node (see function.h), so that
//     autograd::Backward / Grad can differentiate through it.
//   - Same shapes, broadcasting and errors as the kernels they wrap (gw::Error naming the
//     op and shapes). Views (Reshape, Transpose, ...) share storage as the kernels do.
//   - Non-differentiable helpers (comparisons, Argmax, ...) live in gw::kernels.
//   - Random ops (Dropout, FeatureDropout) draw from the Generator passed in; they are as
//     thread-safe as that Generator (one per thread).
#ifndef GRADWIRE_AUTOGRAD_FUNCTIONS_H_
#define GRADWIRE_AUTOGRAD_FUNCTIONS_H_

#include <vector>

#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/kernels.h"  // GeluApproximate
#include "gradwire/tensor/tensor.h"

namespace gw {

// ---- element-wise (broadcasting) ----
Tensor Add(const Tensor& a, const Tensor& b);
Tensor Sub(const Tensor& a, const Tensor& b);
Tensor Mul(const Tensor& a, const Tensor& b);
Tensor Div(const Tensor& a, const Tensor& b);
Tensor Pow(const Tensor& a, const Tensor& b);  // REQUIRES: a > 0 where b's gradient is needed
Tensor Pow(const Tensor& a, double exponent);
Tensor AddScalar(const Tensor& a, double s);
Tensor MulScalar(const Tensor& a, double s);
Tensor Neg(const Tensor& a);
Tensor Exp(const Tensor& a);
Tensor Log(const Tensor& a);
Tensor Sqrt(const Tensor& a);
Tensor Relu(const Tensor& a);
Tensor Tanh(const Tensor& a);
Tensor Sigmoid(const Tensor& a);
Tensor Erf(const Tensor& a);
// x * Phi(x) (torch.nn.functional.gelu), exact or with approximate="tanh".
Tensor Gelu(const Tensor& a, GeluApproximate approximate = GeluApproximate::kNone);
Tensor Silu(const Tensor& a);  // x * sigmoid(x)

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(const Tensor& a, double s);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(const Tensor& a, double s);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(const Tensor& a, double s);

// ---- reductions ----
Tensor Sum(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
Tensor Mean(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
// sum((x - mean)^2) / (N - correction) over `dims` (torch.var; unbiased by default).
Tensor Var(const Tensor& t, const Shape& dims = {}, double correction = 1, bool keepdim = false);
// Maximum values along `dim`; the gradient flows to the (first) maximum.
Tensor Max(const Tensor& t, int64_t dim, bool keepdim = false);

// ---- linear algebra ----
Tensor MatMul(const Tensor& a, const Tensor& b);
// x * w^T + bias, fused into one GEMM; bias may be undefined.
Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& bias);

// ---- softmax family ----
Tensor Softmax(const Tensor& t, int64_t dim);
Tensor LogSoftmax(const Tensor& t, int64_t dim);

// ---- shape ----
Tensor Reshape(const Tensor& t, Shape sizes);
Tensor Transpose(const Tensor& t, int64_t dim0, int64_t dim1);
Tensor Permute(const Tensor& t, const Shape& dims);
Tensor Narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor Select(const Tensor& t, int64_t dim, int64_t index);
Tensor Expand(const Tensor& t, const Shape& sizes);
Tensor Squeeze(const Tensor& t, int64_t dim);
Tensor Unsqueeze(const Tensor& t, int64_t dim);
Tensor Contiguous(const Tensor& t);
// t on `device` (t itself when it is there); the gradient goes back to t's device.
Tensor To(const Tensor& t, Device device);
// Dims start_dim..end_dim merged into one (torch.flatten, with nn.Flatten's defaults).
Tensor Flatten(const Tensor& t, int64_t start_dim = 1, int64_t end_dim = -1);
// Views along `dim`, as torch.split and torch.chunk (see kernels.h); each piece is
// differentiable on its own.
std::vector<Tensor> Split(const Tensor& t, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> Split(const Tensor& t, const Shape& sizes, int64_t dim = 0);
std::vector<Tensor> Chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);

// ---- indexing ----
Tensor IndexSelect(const Tensor& t, int64_t dim, const Tensor& index);
Tensor IndexAdd(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor Stack(const std::vector<Tensor>& tensors, int64_t dim);
// torch.gather (index: int64, t's rank); the gradient scatters back, adding duplicates.
Tensor Gather(const Tensor& t, int64_t dim, const Tensor& index);

// ---- selection (mask: bool, broadcasting; the gradient flows where each value was taken) ----
Tensor MaskedFill(const Tensor& t, const Tensor& mask, double value);
Tensor Where(const Tensor& mask, const Tensor& a, const Tensor& b);

// ---- dropout ----
// In training, zeroes each element with probability p and scales the rest by 1/(1-p);
// otherwise (or with p == 0) returns x itself. REQUIRES: 0 <= p <= 1.
Tensor Dropout(const Tensor& x, double p, bool training, Generator& gen);
// Dropout of whole feature maps: for x [N, C, ...] each (n, c) slice is zeroed or kept
// (and scaled) as one, as torch's Dropout2d/Dropout3d. REQUIRES: x.dim() >= 2.
Tensor FeatureDropout(const Tensor& x, double p, bool training, Generator& gen);

}  // namespace gw

#endif  // GRADWIRE_AUTOGRAD_FUNCTIONS_H_
