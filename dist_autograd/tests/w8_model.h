// The model of W8 (the gradient oracle), with the fixed values that
// dist_autograd/tests/make_reference.py also uses: shared by the test and bench/.
#ifndef GRADWIRE_DIST_AUTOGRAD_TESTS_W8_MODEL_H_
#define GRADWIRE_DIST_AUTOGRAD_TESTS_W8_MODEL_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/kernels.h"

namespace gw::dist_autograd::w8 {

inline Tensor Values(int64_t rows, int64_t cols, const std::function<double(double, double)>& f) {
  std::vector<double> v;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) v.push_back(f(static_cast<double>(i), static_cast<double>(j)));
  }
  return Reshape(Tensor::FromVector<double>(v), {rows, cols});
}
// x [4,6]; W_a [6,5], b_a [5] on worker 0; W_b [5,3] on worker 1; target [4,3].
inline Tensor X() { return Values(4, 6, [](double i, double j) { return std::sin(0.3 * (i * 6 + j) + 0.1); }); }
inline Tensor Wa() { return Values(6, 5, [](double i, double j) { return 0.2 * std::cos(0.7 * (i * 5 + j) + 0.2); }); }
inline Tensor Ba() { return Reshape(Values(1, 5, [](double, double j) { return 0.05 * (j - 2); }), {5}); }
inline Tensor Wb() { return Values(5, 3, [](double i, double j) { return 0.3 * std::sin(0.5 * (i * 3 + j) + 0.3); }); }
inline Tensor Target() { return Values(4, 3, [](double i, double j) { return 0.1 * (i - j); }); }

inline Tensor Leaf(const Tensor& t) { return kernels::Contiguous(t).set_requires_grad(true); }
// Worker 0's half: h = tanh(x W_a + b_a); worker 1's half: out = h W_b.
inline Tensor Hidden(const Tensor& x, const Tensor& wa, const Tensor& ba) { return Tanh(Add(MatMul(x, wa), ba)); }
inline Tensor Loss(const Tensor& out) {
  Tensor diff = Sub(out, Target());
  return Mean(Mul(diff, diff));
}

}  // namespace gw::dist_autograd::w8

#endif  // GRADWIRE_DIST_AUTOGRAD_TESTS_W8_MODEL_H_
