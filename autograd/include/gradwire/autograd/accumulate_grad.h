// AccumulateGrad: the node at the end of every path to a leaf tensor.
//
// Contract
//   - One per leaf that requires grad, created on first use and shared (the leaf keeps a
//     weak reference, the node a strong one to the leaf).
//   - Apply adds the incoming gradient into leaf.grad(): the first gradient is adopted
//     without a copy when nothing else references it, later ones are added in place.
//   - A pass with a GradSink (see engine.h) hands the gradient to the sink instead, and
//     never calls Apply, so leaf.grad() is untouched.
#ifndef GRADWIRE_AUTOGRAD_ACCUMULATE_GRAD_H_
#define GRADWIRE_AUTOGRAD_ACCUMULATE_GRAD_H_

#include "gradwire/autograd/node.h"

namespace gw::autograd {

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);

  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override;

  const Tensor& variable() const { return variable_; }

  // Adds `grad` into *slot (undefined means zero), adopting `grad` when it is unshared.
  static void Accumulate(Tensor* slot, Tensor grad);

 private:
  Tensor variable_;
};

}  // namespace gw::autograd

#endif  // GRADWIRE_AUTOGRAD_ACCUMULATE_GRAD_H_
