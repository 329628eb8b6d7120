// The backward engine: dependency-counted execution of the recorded graph.
//
// Contract
//   - Backward(roots, grads) runs one pass from the given root tensors with the given
//     seed gradients (default: ones for one-element roots) and accumulates into the
//     .grad() of every reachable leaf. Grad(outputs, inputs) returns the gradients of
//     `inputs` instead and leaves every .grad() untouched.
//   - Without retain_graph, saved tensors are freed as nodes run; a second pass through
//     the same nodes then throws gw::Error saying so.
//   - Errors in backward functions (shape mismatches, a modified saved tensor) propagate
//     as gw::Error out of Backward/Grad/GraphTask::Run, naming the node.
//   - A pass runs on the calling thread. GraphTask is not thread-safe: callers that feed
//     it from several threads (the distributed engine) serialise access.
//
// The seam for the distributed engine (see dist_autograd/, later) is GraphTask:
//   (a) Start anywhere: AddInput(edge, grad) delivers a gradient to any node input —
//       e.g. to a SendFunction when the peer's gradient arrives — and Run() executes
//       every node whose dependencies are satisfied. Inputs may keep arriving between
//       Run() calls.
//   (b) Exact dependency counts: SetDependencies() installs counts computed elsewhere
//       (SMART mode computes them across workers), replacing ComputeDependencies().
//       A node runs once it has received an input and its count reaches zero.
//   (c) Per-pass gradient store: BackwardOptions::sink receives every leaf gradient
//       (AccumulateGrad edge) instead of the leaf's .grad(), so concurrent passes over
//       the same parameters never collide.
//   (d) Post-accumulate hooks (grad_hooks.h) run right after a leaf's gradient of the
//       pass was accumulated, in .grad() or in the sink.
#ifndef GRADWIRE_AUTOGRAD_ENGINE_H_
#define GRADWIRE_AUTOGRAD_ENGINE_H_

#include <cstddef>
#include <memory>
#include <queue>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gradwire/autograd/node.h"

namespace gw::autograd {

// Receives leaf gradients of a pass instead of the leaves' .grad() (seam (c)).
class GradSink {
 public:
  virtual ~GradSink() = default;
  // Called once per AccumulateGrad node reached, with the summed gradient for `leaf`.
  // Returns the gradient the sink now holds for `leaf` (accumulated over passes), which
  // the leaf's post-accumulate hooks (grad_hooks.h) get and may change in place, or an
  // undefined tensor when the sink keeps none (then no hook runs).
  virtual Tensor Accumulate(const Tensor& leaf, Tensor grad) = 0;
};

struct BackwardOptions {
  bool retain_graph = false;
  GradSink* sink = nullptr;  // not owned; must outlive the pass
};

using DependencyMap = absl::flat_hash_map<Node*, int>;

class GraphTask {
 public:
  explicit GraphTask(BackwardOptions options = {});
  GraphTask(const GraphTask&) = delete;
  GraphTask& operator=(const GraphTask&) = delete;

  // Counts, for every node reachable from `roots`, the edges pointing at it from
  // reachable nodes, plus one for each root edge (the seed that AddInput will deliver).
  // Adds to counts already present.
  void ComputeDependencies(const std::vector<Edge>& roots);
  // Replaces the counts (seam (b)). Nodes absent from the map count zero.
  void SetDependencies(DependencyMap dependencies);
  const DependencyMap& dependencies() const { return dependencies_; }

  // Adds `grad` to input edge.input_nr of edge.node (seam (a)); undefined grads count as
  // a delivery with no value. Makes the node ready when its count is zero.
  void AddInput(const Edge& edge, Tensor grad);
  // When edge.node is about to run, stores its input edge.input_nr in *slot (used by
  // Grad() for non-leaf inputs). `slot` must outlive the pass.
  void CaptureInput(const Edge& edge, Tensor* slot);

  // Executes ready nodes until none is left. Returns how many ran.
  size_t Run();
  // Nodes that received input but still wait for dependencies.
  size_t waiting() const { return buffers_.size(); }

 private:
  struct Ready {
    uint64_t sequence_nr;
    std::shared_ptr<Node> node;
    bool operator<(const Ready& other) const { return sequence_nr < other.sequence_nr; }
  };

  void Execute(const std::shared_ptr<Node>& node, std::vector<Tensor> inputs);
  void Deliver(const Edge& edge, Tensor grad);

  BackwardOptions options_;
  DependencyMap dependencies_;
  absl::flat_hash_map<Node*, std::vector<Tensor>> buffers_;  // inputs received so far
  absl::flat_hash_map<Node*, std::vector<std::pair<uint32_t, Tensor*>>> captures_;
  std::priority_queue<Ready> ready_;
};

// Runs a backward pass from `roots`. `grads` are the seed gradients (same count as
// roots; may be empty when every root has one element, meaning ones).
void Backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {},
              bool retain_graph = false);

// Returns d(outputs)/d(inputs) weighted by `grad_outputs`, without touching any .grad().
// Like Backward it runs (and, without retain_graph, frees) the whole graph below the
// outputs, not only the paths that lead to `inputs`.
// With allow_unused, an input the outputs do not depend on gets an undefined tensor;
// otherwise that is an error.
std::vector<Tensor> Grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {},
                         bool retain_graph = false, bool allow_unused = false);

}  // namespace gw::autograd

#endif  // GRADWIRE_AUTOGRAD_ENGINE_H_
