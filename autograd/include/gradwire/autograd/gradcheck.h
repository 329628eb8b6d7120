// GradCheck: compares autograd's gradients with central finite differences.
//
// Contract
//   - fn maps the inputs to one output tensor. The check differentiates the scalar
//     sum(fn(inputs) * W) for a fixed random W, so every output element matters.
//   - Inputs should be float64 leaves with requires_grad set; they are perturbed in
//     place by +-eps (and restored) to compute the numerical gradient.
//   - Returns ok=false with a message naming the input and element that disagree.
#ifndef GRADWIRE_AUTOGRAD_GRADCHECK_H_
#define GRADWIRE_AUTOGRAD_GRADCHECK_H_

#include <functional>
#include <string>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gw::autograd {

struct GradCheckResult {
  bool ok = true;
  double max_abs_error = 0;
  std::string message;
};

GradCheckResult GradCheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, double eps = 1e-6,
                          double atol = 1e-6, double rtol = 1e-5);

}  // namespace gw::autograd

#endif  // GRADWIRE_AUTOGRAD_GRADCHECK_H_
