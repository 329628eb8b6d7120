// Node and Edge: the backward graph that autograd records during the forward pass.
//
// Contract
//   - A Node is the backward of one forward operation. Its inputs are the gradients of the
//     operation's outputs (num_inputs() of them, shapes in input_meta()); its outputs are
//     the gradients of the operation's inputs, sent along next_edges() (one per forward
//     input; an invalid Edge means that input needs no gradient).
//   - An Edge (node, input_nr) names input `input_nr` of `node`.
//   - Nodes are owned by shared_ptr: a tensor owns its grad_fn, a node owns the nodes its
//     edges point to, so a graph lives exactly as long as some output tensor refers to it.
//   - Apply() is called by the engine, at most once per pass, from one thread at a time.
//     ReleaseVariables() drops saved tensors once a pass without retain_graph is done;
//     applying a released node throws gw::Error.
//   - Subclassing is the extension point for the distributed engine: a send/recv node is
//     just a Node whose Apply ships gradients to a peer.
#ifndef GRADWIRE_AUTOGRAD_NODE_H_
#define GRADWIRE_AUTOGRAD_NODE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gw::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;

  bool valid() const { return node != nullptr; }
};

// Shape and dtype a gradient flowing into a node input must have.
struct InputMeta {
  Shape sizes;
  DType dtype = DType::kFloat32;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  // grads.size() == num_inputs(); an entry may be undefined (that output got no
  // gradient). Returns one gradient per next edge; undefined means "no gradient".
  virtual std::vector<Tensor> Apply(std::vector<Tensor>&& grads) = 0;
  virtual void ReleaseVariables() {}
  // True for nodes that must run even when every input is undefined (a distributed
  // receive node tells its peer "no gradient" so that the peer does not wait).
  virtual bool RunsWithoutGradient() const { return false; }

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void add_next_edge(Edge edge) { next_edges_.push_back(std::move(edge)); }
  uint32_t num_inputs() const { return static_cast<uint32_t>(input_meta_.size()); }
  const InputMeta& input_meta(uint32_t i) const { return input_meta_.at(i); }
  // Declares a new input shaped like `t`; returns its index.
  uint32_t AddInputMeta(const Tensor& t);
  // Larger means created later; the engine runs later nodes first.
  uint64_t sequence_nr() const { return sequence_nr_; }

 private:
  std::vector<Edge> next_edges_;
  std::vector<InputMeta> input_meta_;
  uint64_t sequence_nr_;
};

// The edge a gradient for `t` must flow into: its grad_fn for a computed tensor, its
// AccumulateGrad node for a leaf that requires grad, an invalid edge otherwise.
Edge GradientEdge(const Tensor& t);

// A tensor saved for backward: its data without autograd history, plus the storage
// version at save time so that a later in-place write is detected instead of silently
// giving wrong gradients.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // REQUIRES: the storage was not modified in place since it was saved (checked).
  const Tensor& Get(const char* node_name) const;

 private:
  Tensor data_;
  uint64_t version_ = 0;
};

}  // namespace gw::autograd

#endif  // GRADWIRE_AUTOGRAD_NODE_H_
