// Gradient checks (float64) of the differentiable recurrent layer gw::RnnLayer: LSTM and
// GRU, forward and reverse direction, strided input, with and without initial states
// and biases, and gradients requested for a subset of the inputs.
#include "gradwire/autograd/recurrent.h"

#include <gtest/gtest.h>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/gradcheck.h"
#include "gradwire/tensor/kernels.h"

namespace gw {
namespace {

using kernels::RnnCell;

Tensor Leaf(const Shape& shape, Generator& gen, double scale = 0.5) {
  Tensor t = kernels::MulScalar(Tensor::Randn(shape, gen, DType::kFloat64), scale);
  t.set_requires_grad(true);
  return t;
}

struct Case {
  RnnCell cell;
  bool reverse, states, bias;
};

class RnnLayerGradCheck : public ::testing::TestWithParam<Case> {};

TEST_P(RnnLayerGradCheck, MatchesFiniteDifferences) {
  const Case c = GetParam();
  const int64_t L = 3, N = 2, in = 3, H = 2, G = kernels::RnnGateCount(c.cell);
  const bool lstm = c.cell == RnnCell::kLstm;
  Generator gen(42);
  // x is a batch-first leaf [N, L, in]; the layer reads its transpose (strided).
  std::vector<Tensor> inputs{Leaf({N, L, in}, gen, 1.0), Leaf({G * H, in}, gen),
                             Leaf({G * H, H}, gen)};
  if (c.bias) inputs.insert(inputs.end(), {Leaf({G * H}, gen), Leaf({G * H}, gen)});
  if (c.states) inputs.push_back(Leaf({N, H}, gen));
  if (c.states && lstm) inputs.push_back(Leaf({N, H}, gen));
  auto fn = [&](const std::vector<Tensor>& v) {
    kernels::RnnLayerArgs args;
    args.cell = c.cell;
    args.reverse = c.reverse;
    args.x = Transpose(v[0], 0, 1);
    args.w_ih = v[1];
    args.w_hh = v[2];
    size_t next = 3;
    if (c.bias) {
      args.b_ih = v[next++];
      args.b_hh = v[next++];
    }
    if (c.states) args.h0 = v[next++];
    if (c.states && lstm) args.c0 = v[next++];
    RnnLayerOutputs out = RnnLayer(args);
    std::vector<Tensor> parts{Reshape(out.output, {-1}), Reshape(out.h_n, {-1})};
    if (lstm) parts.push_back(Reshape(out.c_n, {-1}));
    return Cat(parts, 0);
  };
  const autograd::GradCheckResult r = autograd::GradCheck(fn, inputs);
  EXPECT_TRUE(r.ok) << r.message;
}

INSTANTIATE_TEST_SUITE_P(
    Cells, RnnLayerGradCheck,
    ::testing::Values(Case{RnnCell::kLstm, false, true, true}, Case{RnnCell::kLstm, true, true, true},
                      Case{RnnCell::kLstm, false, false, false}, Case{RnnCell::kGru, false, true, true},
                      Case{RnnCell::kGru, true, true, false}, Case{RnnCell::kGru, false, false, true}),
    [](const auto& info) {
      const Case& c = info.param;
      return std::string(c.cell == RnnCell::kLstm ? "Lstm" : "Gru") +
             (c.reverse ? "Reverse" : "Forward") + (c.states ? "States" : "NoStates") +
             (c.bias ? "Bias" : "NoBias");
    });

// Only the gradients some input needs are computed; the others stay undefined.
TEST(RnnLayerTest, ComputesOnlyNeededGradients) {
  Generator gen(7);
  Tensor x = Tensor::Randn({4, 2, 3}, gen, DType::kFloat64);
  Tensor w_ih = Tensor::Randn({8, 3}, gen, DType::kFloat64);
  Tensor w_hh = Leaf({8, 2}, gen);
  kernels::RnnLayerArgs args{RnnCell::kLstm, x, {}, {}, w_ih, w_hh, {}, {}, false};
  RnnLayerOutputs out = RnnLayer(args);
  EXPECT_TRUE(out.h_n.requires_grad());
  autograd::Backward({Sum(out.h_n)});
  EXPECT_TRUE(w_hh.grad().defined());
  // The kernel leaves out what is not asked for.
  kernels::RnnLayerNeeds needs;
  needs.x = needs.h0 = needs.c0 = needs.w_ih = needs.b_ih = needs.b_hh = false;
  kernels::RnnLayerGrads g = kernels::RnnLayerBackward(
      args, kernels::RnnLayerForward(args), {}, Tensor::Ones({2, 2}, DType::kFloat64), {}, needs);
  EXPECT_TRUE(kernels::AllClose(g.w_hh, w_hh.grad(), 1e-12, 1e-12));
  EXPECT_FALSE(g.x.defined() || g.h0.defined() || g.c0.defined() || g.w_ih.defined() ||
               g.b_ih.defined() || g.b_hh.defined());
  // No input requires grad: no node.
  kernels::RnnLayerArgs plain = args;
  plain.w_hh = w_hh.detach();
  EXPECT_FALSE(RnnLayer(plain).output.requires_grad());
}

TEST(RnnLayerTest, ShapeErrorsNameTheLayer) {
  kernels::RnnLayerArgs args{RnnCell::kGru, Tensor::Zeros({4, 2, 3}), Tensor::Zeros({2, 5}),
                             {}, Tensor::Zeros({6, 3}), Tensor::Zeros({6, 2}), {}, {}, false};
  try {
    RnnLayer(args);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "GRU layer: h0 must be [2, 2], got [2, 5]");
  }
}

}  // namespace
}  // namespace gw
