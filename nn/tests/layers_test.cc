// Unit: layers — Linear, activations, Dropout, Sequential, Embedding, EmbeddingBag.
#include "gradwire/nn/layers.h"

#include <gtest/gtest.h>

#include <cmath>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/gradcheck.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

TEST(LinearTest, PyTorchDefaultInitIsSeededAndBounded) {
  Generator g1(0), g2(0);
  Linear a(400, 300, g1), b(400, 300, g2);
  EXPECT_EQ(a.weight().ToVector<float>(), b.weight().ToVector<float>());
  const double bound = 1 / std::sqrt(400.0);
  EXPECT_LE(kernels::MaxAll(kernels::Abs(a.weight())).item(), bound);
  EXPECT_GT(kernels::MaxAll(kernels::Abs(a.weight())).item(), 0.99 * bound);
  // U(-b, b) has variance b^2 / 3.
  const double var = kernels::Mean(kernels::Mul(a.weight(), a.weight())).item();
  EXPECT_NEAR(var, bound * bound / 3, 0.02 * bound * bound);
  EXPECT_LE(kernels::MaxAll(kernels::Abs(a.bias())).item(), bound);
  EXPECT_TRUE(a.weight().requires_grad());
  EXPECT_EQ(a.ToString(), "Linear(in_features=400, out_features=300, bias=true)");
}

TEST(LinearTest, ForwardShapesAndErrors) {
  Generator gen(1);
  Linear l(4, 3, gen);
  EXPECT_EQ(l.Forward(Tensor::Zeros({2, 4})).sizes(), Shape({2, 3}));
  EXPECT_EQ(l.Forward(Tensor::Zeros({5, 2, 4})).sizes(), Shape({5, 2, 3}));
  try {
    l.Forward(Tensor::Zeros({2, 5}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 5]"), std::string::npos) << e.what();
  }
}

TEST(SequentialTest, ChainsAndNamesParameters) {
  Generator gen(2);
  auto mlp = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(3, 4, gen), std::make_shared<ReLU>(),
      std::make_shared<Linear>(4, 2, gen, /*bias=*/false), std::make_shared<Sigmoid>(),
      std::make_shared<Tanh>()});
  auto names = mlp->NamedParameters();
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0].first, "0.weight");
  EXPECT_EQ(names[1].first, "0.bias");
  EXPECT_EQ(names[2].first, "2.weight");
  EXPECT_EQ(mlp->NumParameters(), 3 * 4 + 4 + 4 * 2);
  Tensor y = mlp->Forward(Tensor::Ones({5, 3}));
  EXPECT_EQ(y.sizes(), Shape({5, 2}));
  autograd::Backward({gw::Sum(y)});
  for (const Tensor& p : mlp->Parameters()) EXPECT_TRUE(p.grad().defined());
  mlp->ZeroGrad();
  for (const Tensor& p : mlp->Parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_NE(mlp->ToString().find("(1): ReLU()"), std::string::npos) << mlp->ToString();
}

TEST(DropoutTest, TrainingMasksAndScalesEvalIsIdentity) {
  Generator gen(3);
  Dropout d(0.25, gen);
  Tensor x = Tensor::Ones({100000});
  Tensor y = d.Forward(x);
  const std::vector<float> v = y.ToVector<float>();
  int64_t zeros = 0;
  for (float e : v) {
    if (e == 0) {
      ++zeros;
    } else {
      EXPECT_FLOAT_EQ(e, 1 / 0.75f);
    }
  }
  EXPECT_NEAR(static_cast<double>(zeros) / v.size(), 0.25, 0.01);
  d.Eval();
  EXPECT_TRUE(d.Forward(x).is_same(x));
  EXPECT_THROW(Dropout(1.0, gen), Error);
}

TEST(EmbeddingTest, LookupAndScatteredGradient) {
  Generator gen(4);
  Embedding e(5, 3, gen, DType::kFloat64);
  Tensor ids = Tensor::FromVector<int64_t>({4, 1, 4, 0}, {2, 2});
  Tensor out = e.Forward(ids);
  ASSERT_EQ(out.sizes(), Shape({2, 2, 3}));
  EXPECT_EQ(kernels::Select(kernels::Select(out, 0, 1), 0, 0).ToVector<double>(),
            kernels::Select(e.weight(), 0, 4).ToVector<double>());
  autograd::Backward({gw::Sum(out)});
  EXPECT_EQ(kernels::Sum(e.weight().grad(), {1}).ToVector<double>(),
            std::vector<double>({3, 3, 0, 0, 6}));  // row 4 looked up twice
  EXPECT_THROW(e.Forward(Tensor::FromVector<int64_t>({5})), Error);
}

TEST(EmbeddingBagTest, FixedLengthBagsMatchOffsetsAndGradCheck) {
  Generator gen(5);
  EmbeddingBag bag(6, 2, BagMode::kMean, gen, DType::kFloat64);
  Tensor ids2d = Tensor::FromVector<int64_t>({0, 1, 2, 5, 5, 3}, {2, 3});
  Tensor a = bag.Forward(ids2d);
  Tensor b = bag.Forward(Tensor::FromVector<int64_t>({0, 1, 2, 5, 5, 3}),
                         Tensor::FromVector<int64_t>({0, 3}));
  EXPECT_EQ(a.ToVector<double>(), b.ToVector<double>());
  Tensor w = Tensor::Randn({6, 2}, gen, DType::kFloat64);
  w.set_requires_grad(true);
  for (BagMode mode : {BagMode::kSum, BagMode::kMean}) {
    auto r = autograd::GradCheck(
        [&](auto& x) {
          return EmbeddingBagLookup(x[0], Tensor::FromVector<int64_t>({0, 1, 1, 5, 3}),
                                    Tensor::FromVector<int64_t>({0, 2, 2}), mode);
        },
        {w});
    EXPECT_TRUE(r.ok) << r.message;
  }
  EXPECT_THROW(bag.Forward(Tensor::FromVector<int64_t>({0, 1}), Tensor::FromVector<int64_t>({1})),
               Error);
}

}  // namespace
}  // namespace gw::nn

namespace gw::nn {
namespace {

TEST(ModuleSharingTest, SharedModuleParametersAreListedOnce) {
  Generator gen(6);
  auto shared = std::make_shared<Linear>(3, 3, gen);
  Sequential twice({shared, std::make_shared<ReLU>(), shared});
  EXPECT_EQ(twice.Parameters().size(), 2u);
  EXPECT_EQ(twice.NumParameters(), 12);
}

TEST(EmbeddingBagTest, EmptyFixedLengthBagsGiveZeros) {
  Generator gen(7);
  EmbeddingBag bag(4, 2, BagMode::kSum, gen);
  Tensor out = bag.Forward(Tensor::Zeros({3, 0}, DType::kInt64));
  EXPECT_EQ(out.sizes(), Shape({3, 2}));
  EXPECT_EQ(kernels::MaxAll(kernels::Abs(out)).item(), 0.0);
}

}  // namespace
}  // namespace gw::nn
