// Differentiable tensor math: the functions users write models with.
//
// Contract
//   - Each function computes its result with gw::kernels and, when grad mode is on and an
//     input requires grad, records a backward node (see function.h), so that
//     autograd::Backward / Grad can differentiate through it.
//   - Same shapes, broadcasting and errors as the kernels they wrap (gw::Error naming the
//     op and shapes). Views (Reshape, Transpose, ...) share storage as the kernels do.
//   - Non-differentiable helpers (comparisons, Argmax, ...) live in gw::kernels.
#ifndef GRADWIRE_AUTOGRAD_FUNCTIONS_H_
#define GRADWIRE_AUTOGRAD_FUNCTIONS_H_

#include <vector>

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

// ---- indexing ----
Tensor IndexSelect(const Tensor& t, int64_t dim, const Tensor& index);
Tensor IndexAdd(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor Stack(const std::vector<Tensor>& tensors, int64_t dim);

}  // namespace gw

#endif  // GRADWIRE_AUTOGRAD_FUNCTIONS_H_
