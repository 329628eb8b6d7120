#include "gradwire/autograd/function.h"

#include "gradwire/autograd/grad_mode.h"

namespace gw::autograd {

std::vector<Tensor> FunctionNode::Apply(std::vector<Tensor>&& grads) {
  GW_CHECK(backward_ != nullptr, name_,
           "trying to run backward through the graph a second time (its saved tensors were "
           "freed after the first pass); pass retain_graph=true to the first backward");
  return backward_(grads[0]);
}

bool AnyRequiresGrad(const std::vector<Tensor>& inputs) {
  if (!GradMode::IsEnabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void SetHistory(const Tensor& out, const std::shared_ptr<Node>& node) {
  AutogradMeta& meta = out.autograd_meta();
  meta.requires_grad = true;
  meta.output_nr = node->AddInputMeta(out);
  meta.grad_fn = node;
}

Tensor Record(std::string name, const std::vector<Tensor>& inputs, Tensor out,
              BackwardFn backward) {
  if (!AnyRequiresGrad(inputs)) return out;
  auto node = std::make_shared<FunctionNode>(std::move(name), std::move(backward));
  for (const Tensor& t : inputs) node->add_next_edge(GradientEdge(t));
  SetHistory(out, node);
  return out;
}

}  // namespace gw::autograd
