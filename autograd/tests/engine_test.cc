// Unit: the backward engine — accumulation, retain_graph, no-grad, Grad(), and the seams
// the distributed engine uses (start anywhere, given dependency counts, gradient sink).
#include "gradwire/autograd/engine.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/function.h"
#include "gradwire/autograd/grad_hooks.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"

namespace gw::autograd {
namespace {

Tensor Leaf(std::vector<double> v) {
  Tensor t = Tensor::FromVector<double>(v);
  t.set_requires_grad(true);
  return t;
}

std::vector<double> V(const Tensor& t) { return t.ToVector<double>(); }

TEST(EngineTest, BackwardAccumulatesIntoLeaves) {
  Tensor x = Leaf({1, 2, 3});
  Tensor y = Sum(x * x);  // dy/dx = 2x
  Backward({y});
  EXPECT_EQ(V(x.grad()), std::vector<double>({2, 4, 6}));
  Tensor z = Sum(x * 3.0);
  Backward({z});  // accumulates
  EXPECT_EQ(V(x.grad()), std::vector<double>({5, 7, 9}));
}

TEST(EngineTest, DiamondGraphSumsBothPaths) {
  Tensor x = Leaf({2});
  Tensor a = x * 3.0, b = Exp(x);
  Backward({Sum(a * b)});  // d/dx (3x e^x) = 3e^x + 3x e^x
  EXPECT_NEAR(V(x.grad())[0], 3 * std::exp(2.0) * 3, 1e-12);
}

TEST(EngineTest, SharedGradientIsNotAliasedBetweenLeaves) {
  Tensor a = Leaf({1, 1}), b = Leaf({1, 1});
  Backward({Sum(a + b)});  // AddBackward hands the same tensor to both leaves
  kernels::AddInPlace(a.grad(), Tensor::Ones({2}, DType::kFloat64));
  EXPECT_EQ(V(b.grad()), std::vector<double>({1, 1}));
}

TEST(EngineTest, MultipleRootsAndSeedGradients) {
  Tensor x = Leaf({1, 2});
  Tensor y1 = x * 2.0, y2 = x * x;
  Backward({y1, y2}, {Tensor::FromVector<double>({1, 10}), Tensor::FromVector<double>({1, 1})});
  EXPECT_EQ(V(x.grad()), std::vector<double>({2 + 2, 20 + 4}));
  EXPECT_THROW(Backward({x * 2.0}), Error);  // non-scalar root needs an explicit seed
}

TEST(EngineTest, RetainGraphAllowsASecondPass) {
  Tensor x = Leaf({3});
  Tensor y = Sum(x * x);
  Backward({y}, {}, /*retain_graph=*/true);
  Backward({y});
  EXPECT_EQ(V(x.grad()), std::vector<double>({12}));
  try {
    Backward({y});
    FAIL() << "third pass through a released graph must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(EngineTest, NoGradGuardRecordsNothing) {
  Tensor x = Leaf({1});
  Tensor y;
  {
    NoGradGuard guard;
    y = x * 2.0;
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_TRUE(GradMode::IsEnabled());
  EXPECT_THROW(Backward({Sum(y)}), Error);
}

TEST(EngineTest, GradReturnsWithoutTouchingDotGrad) {
  Tensor x = Leaf({1, 2}), w = Leaf({3, 4});
  Tensor h = x * w;
  Tensor y = Sum(h * h);
  std::vector<Tensor> g = Grad({y}, {x, h}, {}, /*retain_graph=*/true);
  EXPECT_EQ(V(g[0]), std::vector<double>({2 * 3 * 3 * 1, 2 * 4 * 4 * 2}));
  EXPECT_EQ(V(g[1]), std::vector<double>({6, 16}));  // non-leaf input
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  Tensor unused = Leaf({0});
  EXPECT_THROW(Grad({y}, {unused}, {}, true), Error);
  EXPECT_FALSE(Grad({y}, {unused}, {}, true, /*allow_unused=*/true)[0].defined());
}

TEST(EngineTest, InPlaceChangeOfSavedTensorIsDetected) {
  Tensor x = Leaf({1, 2});
  Tensor y = Sum(Exp(x));  // saves exp(x)'s output
  Tensor w = Leaf({1, 1});
  Tensor z = Sum(x * w);  // saves x and w
  {
    NoGradGuard g;
    kernels::AddInPlace(w, Tensor::Ones({2}, DType::kFloat64));
  }
  EXPECT_NO_THROW(Backward({y}));
  try {
    Backward({z});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

// The three seams the distributed engine relies on.

// (c) leaf gradients into a per-pass store.
class MapSink : public GradSink {
 public:
  Tensor Accumulate(const Tensor& leaf, Tensor grad) override {
    Tensor& slot = grads[leaf.unsafe_impl()];
    AccumulateGrad::Accumulate(&slot, grad);
    return slot;
  }
  absl::flat_hash_map<TensorImpl*, Tensor> grads;
};

// A pass from the scalar `y` whose leaf gradients go to `sink`.
void BackwardIntoSink(const Tensor& y, GradSink* sink) {
  GraphTask task(BackwardOptions{.sink = sink});
  Edge root = GradientEdge(y);
  task.ComputeDependencies({root});
  task.AddInput(root, Tensor::Scalar(1, DType::kFloat64));
  task.Run();
}

TEST(EngineSeamTest, SinkReceivesLeafGradientsInsteadOfDotGrad) {
  Tensor w = Leaf({1, 2});
  MapSink sink1, sink2;
  for (MapSink* sink : {&sink1, &sink2}) BackwardIntoSink(Sum(w * w), sink);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(V(sink1.grads[w.unsafe_impl()]), std::vector<double>({2, 4}));
  EXPECT_EQ(V(sink2.grads[w.unsafe_impl()]), std::vector<double>({2, 4}));
}

// (d) post-accumulate hooks: once per pass and leaf, after accumulation, on the
// accumulated gradient (which they may change in place), in .grad() or in a sink.
TEST(EngineSeamTest, PostAccumulateHookSeesTheAccumulatedGradientOncePerPass) {
  Tensor w = Leaf({1, 2}), b = Leaf({5});
  std::vector<std::pair<std::string, std::vector<double>>> calls;
  HookHandle hw = AddPostAccumulateHook(w, [&](const Tensor& leaf, Tensor& grad) {
    EXPECT_EQ(leaf.unsafe_impl(), w.unsafe_impl());
    calls.emplace_back("w", V(grad));
    kernels::ScaleInPlace(grad, 10);  // seen in .grad()
  });
  HookHandle hb = AddPostAccumulateHook(b, [&](const Tensor&, Tensor& grad) { calls.emplace_back("b", V(grad)); });
  // w reached along two paths: its hook runs once, with the summed gradient.
  Backward({Sum(w * w + w * b)});
  ASSERT_EQ(calls.size(), 2u);  // in the order the engine reaches the leaves
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls[0], (std::pair<std::string, std::vector<double>>{"b", {3}}));
  EXPECT_EQ(calls[1], (std::pair<std::string, std::vector<double>>{"w", {2 + 5, 4 + 5}}));
  EXPECT_EQ(V(w.grad()), std::vector<double>({70, 90}));
  // A second pass: the hook gets the gradient accumulated over both passes.
  calls.clear();
  Backward({Sum(w)});
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].second, std::vector<double>({71, 91}));
  // Removed hooks stop running; Grad() runs none.
  hw.Remove();
  calls.clear();
  Backward({Sum(w * b)});
  (void)Grad({Sum(w * b)}, {b});
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].first, "b");
}

// A hook may add the gradient of a leaf the pass never reached to the pass's sink; in a
// local pass (no sink) and outside hooks that is refused (false) and changes nothing.
TEST(EngineSeamTest, AHookAddsAnUnreachedLeafsGradientToThePassSink) {
  Tensor w = Leaf({1, 2}), unused = Leaf({7, 7});
  bool added = false;
  HookHandle h = AddPostAccumulateHook(
      w, [&](const Tensor&, Tensor&) { added = AccumulateInPassSink(unused, Tensor::Ones({2}, DType::kFloat64)); });
  MapSink sink;
  BackwardIntoSink(Sum(w * w), &sink);
  EXPECT_TRUE(added);
  EXPECT_EQ(V(sink.grads[unused.unsafe_impl()]), std::vector<double>({1, 1}));
  EXPECT_FALSE(unused.grad().defined());

  Backward({Sum(w * w)});  // local: no sink
  EXPECT_FALSE(added);
  EXPECT_FALSE(unused.grad().defined());
  EXPECT_FALSE(AccumulateInPassSink(unused, Tensor::Ones({2}, DType::kFloat64)));  // not in a hook
}

TEST(EngineSeamTest, PostAccumulateHookRunsOnTheSinksGradientAndItsErrorsEndThePass) {
  Tensor w = Leaf({1, 2});
  MapSink sink;
  int runs = 0;
  HookHandle h = AddPostAccumulateHook(w, [&](const Tensor&, Tensor& grad) {
    ++runs;
    kernels::AddInPlace(grad, Tensor::Ones({2}, DType::kFloat64));
  });
  BackwardIntoSink(Sum(w * w), &sink);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(V(sink.grads[w.unsafe_impl()]), std::vector<double>({3, 5}));

  HookHandle failing = AddPostAccumulateHook(w, [](const Tensor&, Tensor&) {
    throw Error("test hook: the allreduce failed");
  });
  try {
    Backward({Sum(w)});
    ADD_FAILURE() << "the hook's error did not end the pass";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the allreduce failed"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)AddPostAccumulateHook(Sum(w), [](const Tensor&, Tensor&) {}), Error);  // not a leaf
}

// (a) start at an arbitrary node, with inputs arriving over time (like a RecvFunction).
TEST(EngineSeamTest, StartAtAnyNodeAndFeedLater) {
  Tensor x = Leaf({1, 2});
  Tensor mid = x * 3.0;       // we start the pass at mid's grad_fn
  Tensor out = Sum(mid * mid);  // never differentiated here
  (void)out;
  GraphTask task;
  Edge start = GradientEdge(mid);
  task.ComputeDependencies({start});
  task.AddInput(start, Tensor::FromVector<double>({1, 1}));
  EXPECT_EQ(task.Run(), 2u);  // MulScalarBackward, AccumulateGrad
  EXPECT_EQ(V(x.grad()), std::vector<double>({3, 3}));
}

// (b) externally computed dependency counts: a node waits for every expected input.
TEST(EngineSeamTest, GivenDependencyCountsHoldANodeUntilAllInputsArrive) {
  Tensor x = Leaf({1});
  Tensor mid = x * 2.0;
  GraphTask task;
  Edge e = GradientEdge(mid);
  DependencyMap deps;
  deps[e.node.get()] = 2;  // e.g. two remote consumers will each send a gradient
  task.SetDependencies(std::move(deps));
  task.AddInput(e, Tensor::FromVector<double>({1}));
  EXPECT_EQ(task.Run(), 0u);
  EXPECT_EQ(task.waiting(), 1u);
  task.AddInput(e, Tensor::FromVector<double>({4}));
  EXPECT_EQ(task.Run(), 2u);
  EXPECT_EQ(V(x.grad()), std::vector<double>({10}));
}

TEST(EngineSeamTest, WrongGradientShapeNamesTheNode) {
  Tensor x = Leaf({1, 2});
  Tensor mid = Exp(x);
  GraphTask task;
  try {
    task.AddInput(GradientEdge(mid), Tensor::FromVector<double>({1, 2, 3}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ExpBackward"), std::string::npos) << e.what();
  }
}

TEST(EngineTest, CustomRecordedOperation) {
  Tensor x = Leaf({1, 2});
  // y = x^3 with a hand-written backward, as a layer above autograd would write it.
  Tensor y = Record("CubeBackward", {x}, kernels::PowScalar(x, 3),
                    [s = SavedTensor(x)](const Tensor& g) -> std::vector<Tensor> {
                      const Tensor& v = s.Get("CubeBackward");
                      return {kernels::Mul(g, kernels::MulScalar(kernels::Mul(v, v), 3))};
                    });
  EXPECT_EQ(y.grad_fn()->name(), "CubeBackward");
  Backward({Sum(y)});
  EXPECT_EQ(V(x.grad()), std::vector<double>({3, 12}));
}

}  // namespace
}  // namespace gw::autograd

namespace gw::autograd {
namespace {

TEST(EngineRegressionTest, RootReachableFromAnotherRootGetsOneSummedGradient) {
  Tensor w = Leaf({1, 2});
  Tensor y = w * 2.0;
  int calls = 0;
  class CountingSink : public GradSink {
   public:
    explicit CountingSink(int* calls) : calls_(calls) {}
    Tensor Accumulate(const Tensor&, Tensor grad) override {
      ++*calls_;
      total = grad;
      return total;
    }
    Tensor total;

   private:
    int* calls_;
  } counting(&calls);
  GraphTask task(BackwardOptions{.sink = &counting});
  std::vector<Edge> roots = {GradientEdge(y), GradientEdge(w)};
  task.ComputeDependencies(roots);
  task.AddInput(roots[0], Tensor::FromVector<double>({1, 1}));
  task.AddInput(roots[1], Tensor::FromVector<double>({10, 10}));
  task.Run();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(V(counting.total), std::vector<double>({12, 12}));
}

TEST(EngineRegressionTest, SqueezeOfAScalarLeafKeepsItALeaf) {
  Tensor s = Tensor::Scalar(3, DType::kFloat64);
  s.set_requires_grad(true);
  Tensor y = Squeeze(s, 0) * 2.0;
  EXPECT_TRUE(s.is_leaf());
  Backward({y});
  EXPECT_EQ(s.grad().item(), 2.0);
  Backward({s * 3.0});
  EXPECT_EQ(s.grad().item(), 5.0);
}

TEST(EngineRegressionTest, PowZeroHasZeroGradientAtZero) {
  Tensor x = Leaf({0, 2});
  Backward({Sum(Pow(x, 0.0))});
  EXPECT_EQ(V(x.grad()), std::vector<double>({0, 0}));
}

}  // namespace
}  // namespace gw::autograd
