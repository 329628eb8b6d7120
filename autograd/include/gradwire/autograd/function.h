// Recording a differentiable operation: the helper every op (and every layer above
// autograd) uses to attach a backward to a forward result.
//
// Contract
//   - Record(name, inputs, out, backward) returns `out` unchanged when grad mode is off or
//     no input requires grad. Otherwise it creates a FunctionNode whose next edges are the
//     inputs' gradient edges and makes it out's grad_fn.
//   - `backward(grad_out)` must return one gradient per input, shaped like that input (or
//     undefined for "no gradient"). It captures what it needs by value; capture tensors
//     through SavedTensor so in-place modification is detected.
//   - The closure is destroyed by ReleaseVariables(), freeing what it captured.
#ifndef GRADWIRE_AUTOGRAD_FUNCTION_H_
#define GRADWIRE_AUTOGRAD_FUNCTION_H_

#include <functional>
#include <string>
#include <vector>

#include "gradwire/autograd/node.h"

namespace gw::autograd {

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad)>;

class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}

  std::string name() const override { return name_; }
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override;
  void ReleaseVariables() override { backward_ = nullptr; }

 private:
  std::string name_;
  BackwardFn backward_;
};

// True when grad mode is on and any of `inputs` requires grad.
bool AnyRequiresGrad(const std::vector<Tensor>& inputs);

Tensor Record(std::string name, const std::vector<Tensor>& inputs, Tensor out,
              BackwardFn backward);

// Makes `out` output `output_nr` of `node` (sets grad_fn and requires_grad).
void SetHistory(const Tensor& out, const std::shared_ptr<Node>& node);

}  // namespace gw::autograd

#endif  // GRADWIRE_AUTOGRAD_FUNCTION_H_
