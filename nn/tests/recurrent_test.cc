// Unit: recurrent layers LSTM and GRU — PyTorch's parameters, init, repr, errors, and
// outputs and gradients equal to PyTorch 1.13's (make_reference_recurrent.py).
#include "gradwire/nn/recurrent.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"

namespace gw::nn {
namespace {

namespace k = kernels;

class RecurrentReferenceTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ref_ = testing::ReadReference(GRADWIRE_SOURCE_DIR "/nn/tests/data/recurrent_reference.txt");
    ASSERT_FALSE(ref_.empty()) << "missing nn/tests/data/recurrent_reference.txt";
  }
  DType dtype() const { return GetParam(); }
  std::string Prefix(const std::string& name) const {
    return name + (dtype() == DType::kFloat64 ? ".f64." : ".f32.");
  }
  Tensor Det(const Shape& shape, double k, double scale = 1) const {
    return k::ToDType(k::MulScalar(testing::Det(shape, k), scale), dtype());
  }
  // Parameter p of the module gets det(shape, 10 + p), as in the generator.
  void SetParameters(Module& m) const {
    autograd::NoGradGuard no_grad;
    int p = 0;
    for (const auto& [_, param] : m.NamedParameters()) {
      k::CopyInPlace(param, Det(param.sizes(), 10 + p++));
    }
  }
  // float64 to 1e-10, float32 to 1e-5, relative to the reference's largest magnitude.
  void Expect(const std::string& name, const Tensor& got) const {
    auto it = ref_.find(name);
    ASSERT_NE(it, ref_.end()) << "no reference " << name;
    ASSERT_TRUE(got.defined()) << name;
    const std::vector<double> v = got.ToVector<double>();
    ASSERT_EQ(v.size(), it->second.size()) << name;
    double scale = 1e-3, err = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      scale = std::max(scale, std::abs(it->second[i]));
      err = std::max(err, std::abs(v[i] - it->second[i]));
    }
    EXPECT_LE(err, (dtype() == DType::kFloat64 ? 1e-10 : 1e-5) * scale) << name;
  }
  void ExpectParameterGrads(const std::string& prefix, const Module& m) const {
    for (const auto& [name, param] : m.NamedParameters()) Expect(prefix + "grad." + name, param.grad());
  }
  Tensor Loss(const Tensor& output, const Tensor& h_n, const Tensor& c_n = {}) const {
    Tensor loss = Add(Sum(Mul(output, Det(output.sizes(), 3.5))), Sum(Mul(h_n, Det(h_n.sizes(), 4.5))));
    if (c_n.defined()) loss = Add(loss, Sum(Mul(c_n, Det(c_n.sizes(), 5.5))));
    return loss;
  }

  std::map<std::string, std::vector<double>> ref_;
};

TEST_P(RecurrentReferenceTest, LstmTwoLayersBatchFirstWithStatesAndStridedInput) {
  Generator gen(1);
  LSTM lstm(3, 4, gen, {.num_layers = 2, .batch_first = true}, dtype());
  SetParameters(lstm);
  // The input [N=2, L=5, 3] as a strided view (the transpose of a time-major leaf).
  Tensor leaf = k::Contiguous(k::Transpose(Det({2, 5, 3}, 0.5), 0, 1));
  leaf.set_requires_grad(true);
  Tensor input = Transpose(leaf, 0, 1);
  ASSERT_FALSE(input.is_contiguous());
  Tensor h0 = Det({2, 2, 4}, 1.5, 0.5), c0 = Det({2, 2, 4}, 2.5);
  h0.set_requires_grad(true);
  c0.set_requires_grad(true);
  auto [output, h_n, c_n] = lstm.Forward(input, h0, c0);
  EXPECT_EQ(output.sizes(), Shape({2, 5, 4}));
  EXPECT_EQ(h_n.sizes(), Shape({2, 2, 4}));
  autograd::Backward({Loss(output, h_n, c_n)});
  const std::string p = Prefix("lstm2");
  Expect(p + "output", output);
  Expect(p + "h_n", h_n);
  Expect(p + "c_n", c_n);
  Expect(p + "grad.input", k::Transpose(leaf.grad(), 0, 1));
  Expect(p + "grad.h_0", h0.grad());
  Expect(p + "grad.c_0", c0.grad());
  ExpectParameterGrads(p, lstm);
}

TEST_P(RecurrentReferenceTest, GruTwoLayersWithoutInitialState) {
  Generator gen(2);
  GRU gru(3, 5, gen, {.num_layers = 2}, dtype());
  SetParameters(gru);
  Tensor input = Det({4, 3, 3}, 0.5);
  input.set_requires_grad(true);
  auto [output, h_n] = gru.Forward(input, Tensor());
  autograd::Backward({Loss(output, h_n)});
  const std::string p = Prefix("gru2");
  Expect(p + "output", output);
  Expect(p + "h_n", h_n);
  Expect(p + "grad.input", input.grad());
  ExpectParameterGrads(p, gru);
}

TEST_P(RecurrentReferenceTest, LstmUnbatchedInput) {
  Generator gen(3);
  LSTM lstm(2, 3, gen, {}, dtype());
  SetParameters(lstm);
  Tensor input = Det({6, 2}, 0.5), h0 = Det({1, 3}, 1.5, 0.5), c0 = Det({1, 3}, 2.5);
  for (const Tensor& t : {input, h0, c0}) t.set_requires_grad(true);
  auto [output, h_n, c_n] = lstm.Forward(input, h0, c0);
  EXPECT_EQ(output.sizes(), Shape({6, 3}));
  EXPECT_EQ(c_n.sizes(), Shape({1, 3}));
  autograd::Backward({Loss(output, h_n, c_n)});
  const std::string p = Prefix("lstm_unbatched");
  Expect(p + "output", output);
  Expect(p + "h_n", h_n);
  Expect(p + "c_n", c_n);
  Expect(p + "grad.input", input.grad());
  Expect(p + "grad.h_0", h0.grad());
  Expect(p + "grad.c_0", c0.grad());
  ExpectParameterGrads(p, lstm);
}

TEST_P(RecurrentReferenceTest, GruBidirectionalWithoutBias) {
  Generator gen(4);
  GRU gru(2, 3, gen, {.num_layers = 2, .bias = false, .batch_first = true, .bidirectional = true},
          dtype());
  SetParameters(gru);
  Tensor input = Det({2, 3, 2}, 0.5), h0 = Det({4, 2, 3}, 1.5, 0.5);
  input.set_requires_grad(true);
  h0.set_requires_grad(true);
  auto [output, h_n] = gru.Forward(input, h0);
  EXPECT_EQ(output.sizes(), Shape({2, 3, 6}));
  autograd::Backward({Loss(output, h_n)});
  const std::string p = Prefix("gru_bi");
  Expect(p + "output", output);
  Expect(p + "h_n", h_n);
  Expect(p + "grad.input", input.grad());
  Expect(p + "grad.h_0", h0.grad());
  ExpectParameterGrads(p, gru);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RecurrentReferenceTest,
                         ::testing::Values(DType::kFloat64, DType::kFloat32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(RecurrentModuleTest, PyTorchParameterNamesShapesAndInit) {
  Generator gen(5);
  LSTM lstm(28, 128, gen, {.num_layers = 2, .bidirectional = true});
  const NamedTensors params = lstm.NamedParameters();
  ASSERT_EQ(params.size(), 16u);
  EXPECT_EQ(params[0].first, "weight_ih_l0");
  EXPECT_EQ(params[0].second.sizes(), Shape({512, 28}));
  EXPECT_EQ(params[5].first, "weight_hh_l0_reverse");
  EXPECT_EQ(params[8].first, "weight_ih_l1");
  EXPECT_EQ(params[8].second.sizes(), Shape({512, 256}));
  EXPECT_EQ(params[15].first, "bias_hh_l1_reverse");
  const double bound = 1 / std::sqrt(128.0);
  for (const auto& [name, p] : params) {
    EXPECT_LE(k::MaxAll(k::Abs(p)).item(), bound) << name;
    EXPECT_TRUE(p.requires_grad()) << name;
  }
  EXPECT_EQ(lstm.ToString(), "LSTM(28, 128, num_layers=2, bidirectional=true)");
  GRU gru(10, 20, gen, {.bias = false, .batch_first = true});
  ASSERT_EQ(gru.NamedParameters().size(), 2u);
  EXPECT_EQ(gru.NamedParameters()[1].second.sizes(), Shape({60, 20}));
  EXPECT_EQ(gru.ToString(), "GRU(10, 20, bias=false, batch_first=true)");
}

TEST(RecurrentModuleTest, ErrorsNameTheModuleAndShapes) {
  Generator gen(6);
  LSTM lstm(28, 128, gen, {.num_layers = 2});
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message([&] { lstm.Forward(Tensor::Zeros({64, 784})); }),
            "LSTM(28, 128, num_layers=2): expected input [L, N, 28] (batch_first=false), got "
            "[64, 784]");
  EXPECT_EQ(message([&] {
              lstm.Forward(Tensor::Zeros({5, 3, 28}), Tensor::Zeros({2, 4, 128}),
                           Tensor::Zeros({2, 3, 128}));
            }),
            "LSTM(28, 128, num_layers=2): expected h_0 float32[2, 3, 128], got float32[2, 4, 128]");
  EXPECT_NE(message([&] { lstm.Forward(Tensor::Zeros({5, 3, 28}, DType::kFloat64)); })
                .find("input is float64 but the parameters are float32"),
            std::string::npos);
  GRU gru(4, 8, gen, {.batch_first = true});
  EXPECT_EQ(message([&] { gru.Forward(Tensor::Zeros({2, 3, 5})); }),
            "GRU(4, 8, batch_first=true): expected input [N, L, 4] (batch_first=true), got "
            "[2, 3, 5]");
}

TEST(RecurrentModuleTest, DropoutBetweenLayersOnlyInTraining) {
  Generator gen(7);
  GRU gru(3, 4, gen, {.num_layers = 2, .dropout = 0.5});
  Tensor x = Tensor::Ones({5, 2, 3});
  gru.Eval();
  Tensor a = gru.Forward(x), b = gru.Forward(x);
  EXPECT_EQ(a.ToVector<float>(), b.ToVector<float>());
  gru.Train();
  Tensor c = gru.Forward(x);
  EXPECT_NE(a.ToVector<float>(), c.ToVector<float>());
}

}  // namespace
}  // namespace gw::nn
