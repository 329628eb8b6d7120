// Unit: the local Optimizer — ZeroGrad/Step over a parameter list, skipping parameters
// without gradients, agreement with the functional Update, configuration checks, and
// training a tiny autograd model.
#include "gradwire/optim/optimizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/kernels.h"

namespace gw::optim {
namespace {

Tensor Param(std::vector<double> values) {
  Tensor t = Tensor::FromVector<double>(values);
  t.set_requires_grad(true);
  return t;
}

std::vector<double> V(const Tensor& t) { return t.ToVector<double>(); }

TEST(OptimizerTest, ZeroGradSetsGradientsToUndefined) {
  Tensor a = Param({1, 2}), b = Param({3});
  Optimizer opt({a, b}, Sgd{.lr = 0.1});
  autograd::Backward({Sum(a * a) + Sum(b)});
  ASSERT_TRUE(a.grad().defined());
  ASSERT_TRUE(b.grad().defined());
  opt.ZeroGrad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  opt.Step();  // nothing to do
  EXPECT_EQ(V(a), (std::vector<double>{1, 2}));
  EXPECT_EQ(opt.state(0).step, 0);
}

TEST(OptimizerTest, StepSkipsParamsWithoutGradient) {
  Tensor used = Param({1, 2}), unused = Param({5, 6});
  Optimizer opt({used, unused}, Adam{.lr = 0.1});
  autograd::Backward({Sum(used * 3.0)});
  ASSERT_FALSE(unused.grad().defined());
  opt.Step();
  EXPECT_EQ(opt.state(0).step, 1);
  EXPECT_EQ(opt.state(1).step, 0);
  EXPECT_TRUE(opt.state(1).buffers.empty());
  EXPECT_EQ(V(unused), (std::vector<double>{5, 6}));
  // First Adam step moves each element by lr against the gradient's sign.
  EXPECT_NEAR(V(used)[0], 0.9, 1e-6);
  EXPECT_NEAR(V(used)[1], 1.9, 1e-6);
}

TEST(OptimizerTest, StepMatchesFunctionalUpdate) {
  const OptimizerConfig config = AdamW{.lr = 0.05, .amsgrad = true};
  Tensor a = Param({1, -2, 3}), b = Param({0.5});
  Tensor a_ref = kernels::Clone(a.detach()), b_ref = kernels::Clone(b.detach());
  ParamState a_state, b_state;
  Optimizer opt({a, b}, config);
  for (int step = 0; step < 3; ++step) {
    opt.ZeroGrad();
    autograd::Backward({Sum(a * a * b)});
    Update(config, a_ref, a.grad(), a_state);
    Update(config, b_ref, b.grad(), b_state);
    opt.Step();
    EXPECT_EQ(V(a), V(a_ref));
    EXPECT_EQ(V(b), V(b_ref));
  }
  EXPECT_EQ(opt.state(0).step, 3);
  EXPECT_EQ(V(opt.state(0).buffers.at("max_exp_avg_sq")), V(a_state.buffers.at("max_exp_avg_sq")));
}

TEST(OptimizerTest, SetLrChangesLaterSteps) {
  Tensor p = Param({1});
  Optimizer opt({p}, Sgd{.lr = 0.1});
  EXPECT_EQ(opt.lr(), 0.1);
  opt.set_lr(0.5);
  EXPECT_EQ(opt.lr(), 0.5);
  EXPECT_EQ(std::get<Sgd>(opt.config()).lr, 0.5);
  p.set_grad(Tensor::FromVector<double>({1}));
  opt.Step();
  EXPECT_DOUBLE_EQ(p.item<double>(), 0.5);
  EXPECT_THROW(opt.set_lr(-1), Error);
  EXPECT_EQ(opt.lr(), 0.5);
}

TEST(OptimizerTest, ConstructorChecksParamsAndConfig) {
  Tensor p = Param({1});
  EXPECT_THROW(Optimizer({p, p}, Sgd{}), Error);
  EXPECT_THROW(Optimizer({Tensor()}, Sgd{}), Error);
  EXPECT_THROW(Optimizer({Tensor::Zeros({2}, DType::kInt64)}, Adam{}), Error);
  EXPECT_THROW(Optimizer({p}, Sgd{.lr = -1}), Error);
  Optimizer opt({p}, Adagrad{});
  EXPECT_EQ(opt.size(), 1u);
  EXPECT_TRUE(opt.params()[0].is_same(p));
  EXPECT_THROW(opt.state(1), Error);
}

TEST(OptimizerTest, ShapeErrorFromStepNamesOptimizer) {
  Tensor p = Param({1, 2});
  Optimizer opt({p}, Adagrad{});
  // set_grad checks shapes itself, so plant a mismatched gradient behind its back.
  p.autograd_meta().grad = Tensor::Zeros({3}, DType::kFloat64).impl_ptr();
  try {
    opt.Step();
    ADD_FAILURE() << "expected gw::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("Adagrad"), std::string::npos) << message;
    EXPECT_NE(message.find("[3]"), std::string::npos) << message;
    EXPECT_NE(message.find("[2]"), std::string::npos) << message;
  }
}

// Linear regression y = x w + b on fixed data; every optimizer must drive the loss down.
class TrainTest : public ::testing::TestWithParam<OptimizerConfig> {};

TEST_P(TrainTest, TinyModelLossDecreases) {
  Generator gen(42);
  const Tensor x = Tensor::Randn({64, 3}, gen, DType::kFloat32);
  const Tensor w_true = Tensor::FromVector<float>({1.5f, -2.0f, 0.5f}, {3, 1});
  const Tensor y = kernels::AddScalar(kernels::MatMul(x, w_true), 0.3);
  Tensor w = Tensor::Zeros({3, 1}, DType::kFloat32);
  Tensor b = Tensor::Zeros({1}, DType::kFloat32);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Optimizer opt({w, b}, GetParam());

  auto loss_fn = [&] {
    Tensor err = MatMul(x, w) + b - y;
    return Mean(err * err);
  };
  const double initial = loss_fn().item<double>();
  for (int step = 0; step < 200; ++step) {
    opt.ZeroGrad();
    Tensor loss = loss_fn();
    autograd::Backward({loss});
    opt.Step();
    EXPECT_TRUE(w.is_leaf());
    EXPECT_TRUE(w.requires_grad());
  }
  const double last = loss_fn().item<double>();
  SCOPED_TRACE(Name(GetParam()));
  EXPECT_GT(initial, 1.0);
  EXPECT_LT(last, 0.01 * initial);
  EXPECT_EQ(opt.state(0).step, 200);
}

INSTANTIATE_TEST_SUITE_P(
    AllOptimizers, TrainTest,
    ::testing::Values(OptimizerConfig(Sgd{.lr = 0.1}),
                      OptimizerConfig(Sgd{.lr = 0.05, .momentum = 0.9, .nesterov = true}),
                      OptimizerConfig(Adam{.lr = 0.05}),
                      OptimizerConfig(AdamW{.lr = 0.05, .weight_decay = 1e-3, .amsgrad = true}),
                      OptimizerConfig(Adagrad{.lr = 0.5})),
    [](const ::testing::TestParamInfo<OptimizerConfig>& info) {
      return Name(info.param) + std::to_string(info.index);
    });

}  // namespace
}  // namespace gw::optim
