// Unit: losses and a small MLP against PyTorch reference values (kept as test data).
#include "gradwire/nn/loss.h"

#include <gtest/gtest.h>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/gradcheck.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"

namespace gw::nn {
namespace {

using gw::testing::Det;

class PyTorchReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ref_ = gw::testing::ReadReference(GRADWIRE_SOURCE_DIR "/nn/tests/data/nn_reference.txt");
    ASSERT_FALSE(ref_.empty()) << "missing nn/tests/data/nn_reference.txt";
  }
  void ExpectMatches(const std::string& name, const Tensor& t) {
    ASSERT_TRUE(ref_.count(name)) << name;
    const std::vector<double>& want = ref_[name];
    const std::vector<double> got = t.ToVector<double>();
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << name << "[" << i << "]";
  }
  Tensor Param(const Shape& s, double k) {
    Tensor t = Det(s, k);
    t.set_requires_grad(true);
    return t;
  }
  std::map<std::string, std::vector<double>> ref_;
};

TEST_F(PyTorchReferenceTest, MlpCrossEntropyLossAndGradients) {
  Tensor x = Det({6, 5}, 0);
  Tensor w1 = Param({4, 5}, 1), b1 = Param({4}, 2), w2 = Param({3, 4}, 3), b2 = Param({3}, 4);
  Tensor targets = Tensor::FromVector<int64_t>({0, 2, 1, 1, 0, 2});
  Tensor h = Tanh(Relu(Linear(x, w1, b1)));
  Tensor loss = CrossEntropyLoss(Linear(h, w2, b2), targets);
  autograd::Backward({loss});
  ExpectMatches("mlp.loss", loss);
  ExpectMatches("mlp.grad.w1", w1.grad());
  ExpectMatches("mlp.grad.b1", b1.grad());
  ExpectMatches("mlp.grad.w2", w2.grad());
  ExpectMatches("mlp.grad.b2", b2.grad());
}

TEST_F(PyTorchReferenceTest, CrossEntropySumAndMse) {
  Tensor z = Param({4, 7}, 5);
  Tensor l = CrossEntropyLoss(z, Tensor::FromVector<int64_t>({6, 0, 3, 3}), Reduction::kSum);
  autograd::Backward({l});
  ExpectMatches("ce_sum.loss", l);
  ExpectMatches("ce_sum.grad", z.grad());
  Tensor a = Param({3, 4}, 6);
  Tensor m = MseLoss(a, Det({3, 4}, 7));
  autograd::Backward({m});
  ExpectMatches("mse.loss", m);
  ExpectMatches("mse.grad", a.grad());
}

TEST_F(PyTorchReferenceTest, EmbeddingBagSumAndMean) {
  for (auto [mode, name] : {std::pair{BagMode::kSum, "bag_sum"}, {BagMode::kMean, "bag_mean"}}) {
    Tensor w = Param({10, 3}, 8);
    Tensor out = EmbeddingBagLookup(w, Tensor::FromVector<int64_t>({1, 4, 4, 9, 0, 2, 7}),
                                    Tensor::FromVector<int64_t>({0, 3, 3, 5}), mode);
    autograd::Backward({Sum(Mul(out, Det(out.sizes(), 9)))});
    ExpectMatches(std::string(name) + ".out", out);
    ExpectMatches(std::string(name) + ".grad", w.grad());
  }
}

TEST(LossTest, CrossEntropyGradCheckAndErrors) {
  Generator gen(2);
  Tensor logits = Tensor::Randn({5, 4}, gen, DType::kFloat64);
  logits.set_requires_grad(true);
  Tensor t = Tensor::FromVector<int64_t>({0, 3, 1, 1, 2});
  auto r = autograd::GradCheck([&](auto& x) { return CrossEntropyLoss(x[0], t); }, {logits});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_THROW(CrossEntropyLoss(logits, Tensor::FromVector<int64_t>({0, 4, 1, 1, 2})), Error);
  EXPECT_THROW(CrossEntropyLoss(logits, Tensor::FromVector<int64_t>({0, 1})), Error);
  EXPECT_THROW(MseLoss(logits, Tensor::Zeros({5}, DType::kFloat64)), Error);
}

TEST(LossTest, AccuracyCountsArgmaxHits) {
  Tensor logits = Tensor::FromVector<float>({1, 2, 3, 0, 5, 1}, {3, 2});
  EXPECT_DOUBLE_EQ(Accuracy(logits, Tensor::FromVector<int64_t>({1, 0, 1})), 2.0 / 3);
}

}  // namespace
}  // namespace gw::nn
