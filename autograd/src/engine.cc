#include "gradwire/autograd/engine.h"

#include "absl/container/flat_hash_set.h"
#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/grad_hooks.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"

namespace gw::autograd {

GraphTask::GraphTask(BackwardOptions options) : options_(options) {}

void GraphTask::ComputeDependencies(const std::vector<Edge>& roots) {
  absl::flat_hash_set<Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& e : roots) {
    if (!e.valid()) continue;
    ++dependencies_[e.node.get()];  // the root's own seed gradient is one input
    if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      ++dependencies_[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
}

void GraphTask::SetDependencies(DependencyMap dependencies) {
  dependencies_ = std::move(dependencies);
}

void GraphTask::CaptureInput(const Edge& edge, Tensor* slot) {
  captures_[edge.node.get()].push_back({edge.input_nr, slot});
}

void GraphTask::AddInput(const Edge& edge, Tensor grad) {
  GW_CHECK(edge.valid(), "GraphTask::AddInput", "invalid edge");
  Deliver(edge, std::move(grad));
}

void GraphTask::Deliver(const Edge& edge, Tensor grad) {
  Node* n = edge.node.get();
  GW_CHECK(edge.input_nr < n->num_inputs(), n->name(), "gradient delivered to input ",
           edge.input_nr, " but the node has ", n->num_inputs(), " input(s)");
  if (grad.defined()) {
    const InputMeta& meta = n->input_meta(edge.input_nr);
    GW_CHECK(grad.sizes() == meta.sizes && grad.dtype() == meta.dtype, n->name(),
             "received a gradient of shape ", ShapeToString(grad.sizes()), " ",
             DTypeName(grad.dtype()), " for input ", edge.input_nr, " which has shape ",
             ShapeToString(meta.sizes), " ", DTypeName(meta.dtype));
  }
  auto [it, inserted] = buffers_.try_emplace(n);
  std::vector<Tensor>& buffer = it->second;
  if (inserted) buffer.resize(n->num_inputs());
  Tensor& slot = buffer[edge.input_nr];
  if (!slot.defined()) {
    slot = std::move(grad);
  } else if (grad.defined()) {
    slot = kernels::Add(slot, grad);
  }
  auto dep = dependencies_.find(n);
  if (dep != dependencies_.end() && --dep->second > 0) return;
  if (dep != dependencies_.end()) dependencies_.erase(dep);
  ready_.push({n->sequence_nr(), edge.node});
}

size_t GraphTask::Run() {
  size_t ran = 0;
  while (!ready_.empty()) {
    std::shared_ptr<Node> node = ready_.top().node;
    ready_.pop();
    auto it = buffers_.find(node.get());
    if (it == buffers_.end()) continue;  // queued twice; its inputs already ran
    std::vector<Tensor> inputs = std::move(it->second);
    buffers_.erase(it);
    Execute(node, std::move(inputs));
    ++ran;
  }
  return ran;
}

void GraphTask::Execute(const std::shared_ptr<Node>& node, std::vector<Tensor> inputs) {
  if (auto cap = captures_.find(node.get()); cap != captures_.end()) {
    for (auto& [input_nr, slot] : cap->second) *slot = inputs[input_nr];
  }
  bool any_defined = false;
  for (const Tensor& t : inputs) any_defined = any_defined || t.defined();

  if (auto* acc = dynamic_cast<AccumulateGrad*>(node.get())) {
    if (!any_defined) return;
    if (options_.sink != nullptr) {
      const Tensor held = options_.sink->Accumulate(acc->variable(), std::move(inputs[0]));
      RunPostAccumulateHooks(acc->variable(), &held, options_.sink);
    } else {
      acc->Apply(std::move(inputs));
      RunPostAccumulateHooks(acc->variable());
    }
    return;
  }

  std::vector<Tensor> outputs;
  if (any_defined || node->RunsWithoutGradient()) {
    NoGradGuard no_grad;  // backward math is never recorded
    outputs = node->Apply(std::move(inputs));
    GW_CHECK(outputs.size() == node->next_edges().size(), node->name(), "returned ",
             outputs.size(), " gradients for ", node->next_edges().size(), " inputs");
    if (!options_.retain_graph) node->ReleaseVariables();
  }
  const std::vector<Edge>& edges = node->next_edges();
  for (size_t i = 0; i < edges.size(); ++i) {
    if (!edges[i].valid()) continue;
    Deliver(edges[i], outputs.empty() ? Tensor() : std::move(outputs[i]));
  }
}

namespace {

Edge RootEdge(const Tensor& t, size_t i) {
  GW_CHECK(t.defined(), "Backward", "root ", i, " is undefined");
  Edge e = GradientEdge(t);
  GW_CHECK(e.valid(), "Backward", "root ", i, " (shape ", ShapeToString(t.sizes()),
           ") does not require grad and has no grad_fn; nothing to differentiate");
  return e;
}

Tensor SeedGradient(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                    size_t i) {
  if (!grads.empty() && grads[i].defined()) {
    GW_CHECK(grads[i].sizes() == roots[i].sizes(), "Backward", "seed gradient ", i,
             " has shape ", ShapeToString(grads[i].sizes()), " but its root has shape ",
             ShapeToString(roots[i].sizes()));
    return grads[i];
  }
  GW_CHECK(roots[i].numel() == 1, "Backward", "root ", i, " has shape ",
           ShapeToString(roots[i].sizes()),
           "; a gradient can only be implied for one-element roots, pass one explicitly");
  return Tensor::Ones(roots[i].sizes(), roots[i].dtype(), roots[i].device());
}

void RunFromRoots(GraphTask& task, const std::vector<Tensor>& roots,
                  const std::vector<Tensor>& grads) {
  GW_CHECK(grads.empty() || grads.size() == roots.size(), "Backward", roots.size(),
           " roots but ", grads.size(), " seed gradients");
  std::vector<Edge> edges;
  for (size_t i = 0; i < roots.size(); ++i) edges.push_back(RootEdge(roots[i], i));
  task.ComputeDependencies(edges);
  for (size_t i = 0; i < roots.size(); ++i) {
    task.AddInput(edges[i], SeedGradient(roots, grads, i));
  }
  task.Run();
}

// Collects the gradients of chosen leaves; drops every other leaf gradient.
class CaptureLeaves final : public GradSink {
 public:
  explicit CaptureLeaves(const std::vector<Tensor>& inputs, std::vector<Tensor>* results)
      : inputs_(inputs), results_(results) {}
  Tensor Accumulate(const Tensor& leaf, Tensor grad) override {
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (inputs_[i].unsafe_impl() == leaf.unsafe_impl()) {
        AccumulateGrad::Accumulate(&(*results_)[i], grad);
      }
    }
    return Tensor();  // Grad() runs no post-accumulate hooks
  }

 private:
  const std::vector<Tensor>& inputs_;
  std::vector<Tensor>* results_;
};

}  // namespace

void Backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph) {
  GraphTask task(BackwardOptions{.retain_graph = retain_graph});
  RunFromRoots(task, roots, grads);
}

std::vector<Tensor> Grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph,
                         bool allow_unused) {
  std::vector<Tensor> results(inputs.size());
  CaptureLeaves sink(inputs, &results);
  GraphTask task(BackwardOptions{.retain_graph = retain_graph, .sink = &sink});
  for (size_t i = 0; i < inputs.size(); ++i) {
    GW_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "Grad", "input ", i,
             " does not require grad");
    if (!inputs[i].is_leaf()) task.CaptureInput(GradientEdge(inputs[i]), &results[i]);
  }
  RunFromRoots(task, outputs, grad_outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    GW_CHECK(allow_unused || results[i].defined(), "Grad", "input ", i, " (shape ",
             ShapeToString(inputs[i].sizes()),
             ") was not used to compute the outputs; pass allow_unused=true if that is "
             "expected");
  }
  return results;
}

}  // namespace gw::autograd
