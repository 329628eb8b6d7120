// Unit: NllLoss, CrossEntropyLoss (weights, ignore_index, label smoothing, [N, C, d...],
// every reduction) and MseLoss against PyTorch reference values (make_reference_losses.py),
// in float64 and float32, contiguous and strided; GradCheck; errors; the loss modules.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/gradcheck.h"
#include "gradwire/nn/loss.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"

namespace gw::nn {
namespace {

using gw::testing::Det;

// Strided inputs: Packed(t) holds t's values so that Unpack (differentiable) views them
// strided: the first and last dims transposed in memory, or for 1-D tensors every other
// element of a [n, 2] tensor.
Tensor Packed(const Tensor& t) {
  if (t.dim() == 1) return kernels::Stack({t, t}, 1);
  return kernels::Contiguous(kernels::Transpose(t, 0, t.dim() - 1));
}
Tensor Unpack(const Tensor& packed, int64_t dim) {
  return dim == 1 ? Select(packed, 1, 0) : Transpose(packed, 0, dim - 1);
}
Tensor Strided(const Tensor& t) { return Unpack(Packed(t), t.dim()); }

ClassLossOptions Options(Reduction reduction, Tensor weight = Tensor(), double smoothing = 0,
                         int64_t ignore_index = -100) {
  ClassLossOptions o;
  o.weight = std::move(weight);
  o.reduction = reduction;
  o.label_smoothing = smoothing;
  o.ignore_index = ignore_index;
  return o;
}

Tensor Targets2() { return Tensor::FromVector<int64_t>({0, 3, -100, 1, 3}); }
Tensor Targets4() { return Tensor::FromVector<int64_t>({0, 2, 1, 1, 2, 0, 1, 0}, {2, 2, 2}); }
Tensor Weight(int64_t c, double k, DType dtype) {
  return kernels::ToDType(kernels::AddScalar(kernels::MulScalar(Det({c}, k), 0.5), 1), dtype);
}

// One case of make_reference_losses.py: the loss of inputs made by Det(shape, k).
struct Case {
  std::string name;
  std::vector<std::pair<Shape, double>> inputs;
  std::function<Tensor(const std::vector<Tensor>&, DType)> loss;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (auto [reduction, suffix] : {std::pair{Reduction::kMean, "mean"}, {Reduction::kSum, "sum"},
                                   {Reduction::kNone, "none"}}) {
    const Reduction r = reduction;
    cases.push_back({std::string("nll_") + suffix, {{{5, 4}, 1.0}}, [r](auto& x, DType d) {
                       return NllLoss(x[0], Targets2(), Options(r, Weight(4, 2, d)));
                     }});
    cases.push_back({std::string("ce_") + suffix, {{{5, 4}, 1.0}}, [r](auto& x, DType d) {
                       return CrossEntropyLoss(x[0], Targets2(), Options(r, Weight(4, 2, d), 0.1));
                     }});
    cases.push_back({std::string("mse_") + suffix, {{{3, 4}, 6.0}, {{3, 4}, 7.0}},
                     [r](auto& x, DType) { return MseLoss(x[0], x[1], r); }});
  }
  cases.push_back({"nll_4d", {{{2, 3, 2, 2}, 3.0}}, [](auto& x, DType) {
                     return NllLoss(x[0], Targets4(), Options(Reduction::kMean, Tensor(), 0, 1));
                   }});
  cases.push_back({"ce_4d", {{{2, 3, 2, 2}, 3.0}}, [](auto& x, DType d) {
                     return CrossEntropyLoss(x[0], Targets4(), Options(Reduction::kMean, Weight(3, 4, d), 0.2, 2));
                   }});
  cases.push_back({"ce_4d_none", {{{2, 3, 2, 2}, 3.0}},
                   [](auto& x, DType) { return CrossEntropyLoss(x[0], Targets4(), Reduction::kNone); }});
  cases.push_back({"ce_smooth_unweighted", {{{5, 4}, 1.0}}, [](auto& x, DType) {
                     return CrossEntropyLoss(x[0], Targets2(), Options(Reduction::kMean, Tensor(), 0.3));
                   }});
  cases.push_back({"ce_unbatched", {{{4}, 5.0}}, [](auto& x, DType) {
                     return CrossEntropyLoss(x[0], kernels::Reshape(Tensor::FromVector<int64_t>({2}), {}),
                                             Options(Reduction::kMean, Tensor(), 0.1));
                   }});
  return cases;
}

class LossReferenceTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {
 protected:
  void SetUp() override {
    ref_ = gw::testing::ReadReference(GRADWIRE_SOURCE_DIR "/nn/tests/data/losses_reference.txt");
    ASSERT_FALSE(ref_.empty()) << "missing nn/tests/data/losses_reference.txt";
  }
  void ExpectMatches(const std::string& name, const Tensor& t, double rtol) {
    ASSERT_TRUE(ref_.count(name)) << name;
    ASSERT_TRUE(t.defined()) << name;
    const std::vector<double>& want = ref_[name];
    const std::vector<double> got = t.ToVector<double>();
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], rtol * std::max(std::abs(want[i]), 0.1)) << name << "[" << i << "]";
    }
  }
  std::map<std::string, std::vector<double>> ref_;
};

TEST_P(LossReferenceTest, MatchesPyTorch) {
  const auto [dtype, strided] = GetParam();
  const double rtol = dtype == DType::kFloat64 ? 1e-10 : 1e-5;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> inputs;
    for (const auto& [shape, k] : c.inputs) {
      Tensor x = kernels::ToDType(Det(shape, k), dtype);
      if (strided) x = Strided(x);
      x.set_requires_grad(true);
      inputs.push_back(x);
    }
    const Tensor loss = c.loss(inputs, dtype);
    EXPECT_EQ(loss.dtype(), dtype);
    autograd::Backward({loss.dim() == 0 ? loss : Sum(Mul(loss, kernels::ToDType(Det(loss.sizes(), 9), dtype)))});
    ExpectMatches(c.name + ".loss", loss, rtol);
    ExpectMatches(c.name + ".grad", inputs[0].grad(), rtol);
    if (inputs.size() > 1) ExpectMatches(c.name + ".grad_target", inputs[1].grad(), rtol);
  }
}

INSTANTIATE_TEST_SUITE_P(DTypesAndLayouts, LossReferenceTest,
                         ::testing::Combine(::testing::Values(DType::kFloat64, DType::kFloat32),
                                            ::testing::Bool()));

TEST(LossGradCheckTest, EveryCaseContiguousAndStrided) {
  for (const Case& c : Cases()) {
    for (bool strided : {false, true}) {
      SCOPED_TRACE(c.name + (strided ? " strided" : ""));
      std::vector<Tensor> leaves;  // GradCheck perturbs contiguous leaves; the loss sees views
      std::vector<int64_t> dims;
      for (const auto& [shape, k] : c.inputs) {
        Tensor x = strided ? Packed(Det(shape, k)) : Det(shape, k);
        x.set_requires_grad(true);
        leaves.push_back(x);
        dims.push_back(static_cast<int64_t>(shape.size()));
      }
      auto fn = [&](const std::vector<Tensor>& x) {
        std::vector<Tensor> inputs;
        for (size_t i = 0; i < x.size(); ++i) inputs.push_back(strided ? Unpack(x[i], dims[i]) : x[i]);
        if (strided) {
          EXPECT_FALSE(inputs[0].is_contiguous());
        }
        return c.loss(inputs, DType::kFloat64);
      };
      auto r = autograd::GradCheck(fn, leaves);
      EXPECT_TRUE(r.ok) << r.message;
    }
  }
}

TEST(LossTest, OnlyTheGradientsNeededAreComputed) {
  Tensor a = Det({3, 4}, 1), b = Det({3, 4}, 2);
  b.set_requires_grad(true);
  autograd::Backward({MseLoss(a, b)});
  EXPECT_FALSE(a.grad().defined());
  EXPECT_NEAR(b.grad().ToVector<double>()[0], -2.0 / 12 * (std::sin(0.0 + 1) - std::sin(0.0 + 2)), 1e-15);
}

TEST(LossTest, EverythingIgnoredIsNaNWithZeroGradient) {
  Tensor x = Det({2, 3}, 1);
  x.set_requires_grad(true);
  const Tensor t = Tensor::FromVector<int64_t>({-100, -100});
  Tensor loss = CrossEntropyLoss(x, t);
  EXPECT_TRUE(std::isnan(loss.item()));
  autograd::Backward({loss});
  EXPECT_EQ(x.grad().ToVector<double>(), std::vector<double>(6, 0.0));
  EXPECT_EQ(CrossEntropyLoss(x, t, Reduction::kSum).item(), 0.0);
}

TEST(LossTest, ExtremeLogitsStayFinite) {
  Tensor x = Tensor::FromVector<float>({1000, -1000, 0, -1e30f, 1e30f, 3}, {2, 3});
  x.set_requires_grad(true);
  Tensor loss = CrossEntropyLoss(x, Tensor::FromVector<int64_t>({0, 2}), Reduction::kSum);
  EXPECT_NEAR(loss.item(), 1e30, 1e24);  // row 2: lse = 1e30, loss 1e30 - 3
  autograd::Backward({loss});
  for (float g : x.grad().ToVector<float>()) EXPECT_TRUE(std::isfinite(g));
}

void ExpectThrowsWith(const std::function<void()>& fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one with: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(LossTest, ErrorsNameTheLossAndTheShapes) {
  const Tensor x = Det({5, 4}, 1);
  ExpectThrowsWith([&] { NllLoss(x, Tensor::FromVector<int64_t>({0, 4, 1, 1, 2})); },
                   "NllLoss: target 4 at position 1 is out of range for 4 classes (input [5, 4]");
  ExpectThrowsWith([&] { CrossEntropyLoss(x, Tensor::FromVector<int64_t>({0, 1})); },
                   "CrossEntropyLoss: expected input [N, C] or [N, C, d1, ...] and targets [N] or [N, d1, ...]");
  ExpectThrowsWith([&] { CrossEntropyLoss(Det({2, 3, 4}, 1), Tensor::Zeros({2, 3}, DType::kInt64)); },
                   "got [2, 3, 4] and [2, 3]");
  ExpectThrowsWith([&] { CrossEntropyLoss(x, Tensor::Zeros({5})); }, "targets must be int64");
  ExpectThrowsWith([&] { NllLoss(x, Targets2(), Options(Reduction::kMean, Det({3}, 0))); },
                   "weight must be float64[4] (one per class of input [5, 4]), got float64[3]");
  ExpectThrowsWith([&] { CrossEntropyLoss(x, Targets2(), Options(Reduction::kMean, Weight(4, 0, DType::kFloat32))); },
                   "weight must be float64[4]");
  ExpectThrowsWith([&] { CrossEntropyLoss(x, Targets2(), Options(Reduction::kMean, Tensor(), 1.5)); },
                   "label_smoothing must be in [0, 1]");
  ExpectThrowsWith([&] { NllLoss(x, Targets2(), Options(Reduction::kMean, Tensor(), 0.1)); },
                   "is CrossEntropyLoss's only");
  ExpectThrowsWith([&] { MseLoss(x, Tensor::Zeros({5})); },
                   "MseLoss: input float64[5, 4] and target float32[5] must have the same shape");
}

TEST(LossModuleTest, ModulesArePyTorchsWithTheWeightAsABuffer) {
  const Tensor w = Weight(4, 2, DType::kFloat64);
  CrossEntropyLossModule ce(Options(Reduction::kSum, w, 0.1));
  EXPECT_EQ(ce.ToString(), "CrossEntropyLoss()");
  ASSERT_EQ(ce.StateDict().size(), 1u);
  EXPECT_EQ(ce.StateDict()[0].first, "weight");
  const Tensor x = Det({5, 4}, 1);
  EXPECT_EQ(ce.Forward(x, Targets2()).item(),
            CrossEntropyLoss(x, Targets2(), Options(Reduction::kSum, w, 0.1)).item());
  NllLossModule nll;
  EXPECT_EQ(nll.ToString(), "NLLLoss()");
  EXPECT_TRUE(nll.StateDict().empty());
  EXPECT_EQ(nll.Forward(x, Targets2()).item(), NllLoss(x, Targets2()).item());
  MseLossModule mse(Reduction::kNone);
  EXPECT_EQ(mse.ToString(), "MSELoss()");
  EXPECT_EQ(mse.Forward(x, Det({5, 4}, 2)).sizes(), (Shape{5, 4}));
}

}  // namespace
}  // namespace gw::nn
