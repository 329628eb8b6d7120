// RnnLayer: the kernels' recurrent layer recorded as one multi-output autograd node.
#include "gradwire/autograd/recurrent.h"

#include <string>

#include "gradwire/autograd/function.h"
#include "gradwire/autograd/node.h"

namespace gw {
namespace {

using autograd::SavedTensor;

bool Needs(const Tensor& t) { return t.defined() && t.requires_grad(); }

// Inputs (next edges): x, h0, c0, w_ih, w_hh, b_ih, b_hh. Outputs (node inputs): output,
// h_n and, for LSTM, c_n.
class RnnLayerNode final : public autograd::Node {
 public:
  RnnLayerNode(const kernels::RnnLayerArgs& args, const kernels::RnnLayerResult& result)
      : cell_(args.cell),
        reverse_(args.reverse),
        inputs_{SavedTensor(args.x),    SavedTensor(args.h0),   SavedTensor(args.c0),
                SavedTensor(args.w_ih), SavedTensor(args.w_hh), SavedTensor(args.b_ih),
                SavedTensor(args.b_hh)},
        output_(result.output),
        gates_(result.gates),
        aux_(result.aux),
        needs_{Needs(args.x),    Needs(args.h0),   Needs(args.c0), Needs(args.w_ih),
               Needs(args.w_hh), Needs(args.b_ih), Needs(args.b_hh)} {}

  std::string name() const override {
    return cell_ == kernels::RnnCell::kLstm ? "LstmLayerBackward" : "GruLayerBackward";
  }

  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override {
    const std::string node = name();
    GW_CHECK(!released_, node,
             "trying to run backward through the graph a second time (its saved tensors were "
             "freed after the first pass); pass retain_graph=true to the first backward");
    kernels::RnnLayerArgs args{cell_,
                               inputs_[0].Get(node.c_str()),
                               inputs_[1].Get(node.c_str()),
                               inputs_[2].Get(node.c_str()),
                               inputs_[3].Get(node.c_str()),
                               inputs_[4].Get(node.c_str()),
                               inputs_[5].Get(node.c_str()),
                               inputs_[6].Get(node.c_str()),
                               reverse_};
    kernels::RnnLayerResult result;
    result.output = output_.Get(node.c_str());
    result.gates = gates_.Get(node.c_str());
    result.aux = aux_.Get(node.c_str());
    const Tensor grad_c_n = grads.size() > 2 ? grads[2] : Tensor();
    kernels::RnnLayerGrads g =
        kernels::RnnLayerBackward(args, result, grads[0], grads[1], grad_c_n, needs_);
    return {g.x, g.h0, g.c0, g.w_ih, g.w_hh, g.b_ih, g.b_hh};
  }

  void ReleaseVariables() override {
    for (SavedTensor& t : inputs_) t = SavedTensor();
    output_ = gates_ = aux_ = SavedTensor();
    released_ = true;
  }

 private:
  kernels::RnnCell cell_;
  bool reverse_;
  SavedTensor inputs_[7];
  SavedTensor output_, gates_, aux_;
  kernels::RnnLayerNeeds needs_;
  bool released_ = false;
};

}  // namespace

RnnLayerOutputs RnnLayer(const kernels::RnnLayerArgs& args) {
  kernels::RnnLayerResult r = kernels::RnnLayerForward(args);
  RnnLayerOutputs out{r.output, r.h_n, r.c_n};
  const std::vector<Tensor> inputs{args.x,    args.h0,   args.c0,  args.w_ih,
                                   args.w_hh, args.b_ih, args.b_hh};
  if (!autograd::AnyRequiresGrad(inputs)) return out;
  auto node = std::make_shared<RnnLayerNode>(args, r);
  for (const Tensor& t : inputs) node->add_next_edge(autograd::GradientEdge(t));
  autograd::SetHistory(out.output, node);
  autograd::SetHistory(out.h_n, node);
  if (out.c_n.defined()) autograd::SetHistory(out.c_n, node);
  return out;
}

}  // namespace gw
