// Unit: convolution and pooling layers (nn/conv.h, nn/pooling.h) — PyTorch's outputs and
// gradients (data/conv_reference.txt, from make_reference_conv.py) in float32 and
// float64, default initialisation, reprs, state-dict keys and error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/nn/conv.h"
#include "gradwire/nn/pooling.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"

namespace gw::nn {
namespace {

using Reference = std::map<std::string, std::vector<double>>;

const Reference& ConvReference() {
  static const Reference* ref = new Reference(
      gw::testing::ReadReference(GRADWIRE_SOURCE_DIR "/nn/tests/data/conv_reference.txt"));
  return *ref;
}

Tensor Det(const Shape& shape, double k, DType dtype) {
  return kernels::ToDType(gw::testing::Det(shape, k), dtype);
}

// Compares `t` with the reference line `name` (or its projection `name.proj`, see
// make_reference_conv.py): max |t - ref| <= rtol * max |ref|.
void ExpectMatches(const std::string& name, const Tensor& t, double rtol) {
  const Reference& ref = ConvReference();
  ASSERT_TRUE(t.defined()) << name;
  const std::vector<double> got = t.ToVector<double>();
  std::vector<double> want, have;
  if (auto it = ref.find(name); it != ref.end()) {
    want = it->second;
    have = got;
  } else {
    auto proj = ref.find(name + ".proj");
    ASSERT_NE(proj, ref.end()) << "no reference for " << name;
    want = proj->second;
    const std::vector<double> w = gw::testing::Det(t.sizes(), 5.0).ToVector<double>();
    double dot = 0, abs_sum = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      dot += got[i] * w[i];
      abs_sum += std::abs(got[i]);
    }
    have = {dot, abs_sum};
  }
  ASSERT_EQ(have.size(), want.size()) << name;
  double scale = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, std::abs(have[i] - want[i]));
  }
  EXPECT_LE(err, rtol * std::max(scale, 1e-30)) << name << ": max error " << err << " of "
                                                << scale;
}

struct Case {
  std::string name;
  std::function<std::shared_ptr<Module>(Generator&, DType)> make;
  Shape input;
};

template <typename M, typename Kernel, typename Options>
std::function<std::shared_ptr<Module>(Generator&, DType)> Layer(int64_t in, int64_t out,
                                                                Kernel kernel, Options options) {
  return [=](Generator& gen, DType dtype) -> std::shared_ptr<Module> {
    return std::make_shared<M>(in, out, kernel, gen, options, dtype);
  };
}

template <typename M, typename... Args>
std::function<std::shared_ptr<Module>(Generator&, DType)> Pool(Args... args) {
  return [=](Generator&, DType) -> std::shared_ptr<Module> { return std::make_shared<M>(args...); };
}

std::vector<Case> Cases() {
  return {
      {"conv1d", Layer<Conv1d>(4, 6, 3, Conv1dOptions{.stride = 2, .padding = 1, .dilation = 2, .groups = 2}),
       {2, 4, 11}},
      {"conv2d", Layer<Conv2d>(3, 4, Size2(3), Conv2dOptions{}), {2, 3, 6, 7}},
      {"conv2d_sdpg",
       Layer<Conv2d>(4, 6, Size2(3, 2),
                     Conv2dOptions{.stride = {2, 1}, .padding = {1, 2}, .dilation = {2, 1}, .groups = 2}),
       {2, 4, 8, 7}},
      {"conv2d_nobias", Layer<Conv2d>(2, 3, Size2(1), Conv2dOptions{.stride = 2, .bias = false}),
       {1, 2, 5, 5}},
      {"conv2d_wide", Layer<Conv2d>(32, 32, Size2(3), Conv2dOptions{.padding = 1}), {16, 32, 12, 12}},
      {"convt2d",
       Layer<ConvTranspose2d>(4, 6, Size2(3),
                              ConvTranspose2dOptions{.stride = 2, .padding = 1, .output_padding = 1, .groups = 2}),
       {2, 4, 4, 5}},
      {"convt2d_dil",
       Layer<ConvTranspose2d>(3, 2, Size2(2, 3),
                              ConvTranspose2dOptions{.stride = {1, 2}, .bias = false, .dilation = {2, 1}}),
       {1, 3, 4, 4}},
      {"maxpool", Pool<MaxPool2d>(Size2(2), MaxPool2dOptions{}), {2, 3, 6, 6}},
      {"maxpool_ceil", Pool<MaxPool2d>(Size2(3), MaxPool2dOptions{.stride = 2, .padding = 1, .ceil_mode = true}),
       {2, 3, 9, 8}},
      {"maxpool_dil",
       Pool<MaxPool2d>(Size2(2, 3), MaxPool2dOptions{.stride = Size2(2, 1), .padding = 1, .dilation = {1, 2}}),
       {1, 2, 7, 8}},
      {"avgpool", Pool<AvgPool2d>(Size2(2), AvgPool2dOptions{}), {2, 3, 6, 6}},
      {"avgpool_ceil_incl",
       Pool<AvgPool2d>(Size2(3), AvgPool2dOptions{.stride = 2, .padding = 1, .ceil_mode = true}), {2, 3, 8, 9}},
      {"avgpool_ceil_excl",
       Pool<AvgPool2d>(Size2(3), AvgPool2dOptions{.stride = 2, .padding = 1, .ceil_mode = true,
                                                   .count_include_pad = false}),
       {2, 3, 8, 9}},
      {"adaptive_7_3", Pool<AdaptiveAvgPool2d>(Size2(3)), {2, 3, 7, 7}},
      {"adaptive_28_1", Pool<AdaptiveAvgPool2d>(Size2(1)), {2, 3, 28, 28}},
  };
}

class ConvReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ConvReferenceTest, OutputsAndGradientsMatchPyTorch) {
  ASSERT_FALSE(ConvReference().empty()) << "missing nn/tests/data/conv_reference.txt";
  const Case& c = GetParam();
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const std::string prefix = c.name + (dtype == DType::kFloat32 ? ".f32" : ".f64");
    const double rtol = dtype == DType::kFloat32 ? 1e-5 : 1e-10;
    Generator gen(0);
    std::shared_ptr<Module> m = c.make(gen, dtype);
    for (const auto& [name, p] : m->NamedParameters()) {
      kernels::CopyInPlace(p, Det(p.sizes(), name == "weight" ? 1.0 : 2.0, dtype));
    }
    Tensor x = Det(c.input, 3.0, dtype);
    x.set_requires_grad(true);
    Tensor out = m->Forward(x);
    autograd::Backward({gw::Sum(gw::Mul(out, Det(out.sizes(), 4.0, dtype)))});
    ExpectMatches(prefix + ".out", out, rtol);
    ExpectMatches(prefix + ".gx", x.grad(), rtol);
    for (const auto& [name, p] : m->NamedParameters()) {
      ExpectMatches(prefix + (name == "weight" ? ".gw" : ".gb"), p.grad(), rtol);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, ConvReferenceTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(ConvLayerTest, PyTorchDefaultInitKeysAndRepr) {
  Generator gen(0);
  Conv2d conv(4, 8, 3, gen, {.groups = 2});
  const double bound = 1 / std::sqrt(2.0 * 9);  // fan_in = in / groups * kH * kW
  EXPECT_EQ(conv.weight().sizes(), Shape({8, 2, 3, 3}));
  EXPECT_LE(kernels::MaxAll(kernels::Abs(conv.weight())).item(), bound);
  EXPECT_GT(kernels::MaxAll(kernels::Abs(conv.weight())).item(), 0.9 * bound);
  EXPECT_LE(kernels::MaxAll(kernels::Abs(conv.bias())).item(), bound);
  auto state = conv.StateDict();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "weight");
  EXPECT_EQ(state[1].first, "bias");
  EXPECT_EQ(conv.ToString(), "Conv2d(4, 8, kernel_size=(3, 3), stride=(1, 1), groups=2)");

  ConvTranspose2d convt(6, 4, Size2(3, 2), gen, {.stride = 2, .padding = 1, .output_padding = 1, .bias = false});
  EXPECT_EQ(convt.weight().sizes(), Shape({6, 4, 3, 2}));  // [in, out / groups, kH, kW]
  EXPECT_GT(kernels::MaxAll(kernels::Abs(convt.weight())).item(), 0.9 / std::sqrt(4.0 * 6));
  EXPECT_LE(kernels::MaxAll(kernels::Abs(convt.weight())).item(), 1 / std::sqrt(4.0 * 6));
  EXPECT_EQ(convt.NamedParameters().size(), 1u);
  EXPECT_EQ(convt.ToString(),
            "ConvTranspose2d(6, 4, kernel_size=(3, 2), stride=(2, 2), padding=(1, 1), "
            "output_padding=(1, 1), bias=False)");
  Conv1d conv1(2, 3, 5, gen, {.padding = 2, .dilation = 2}, DType::kFloat64);
  EXPECT_EQ(conv1.weight().sizes(), Shape({3, 2, 5}));
  EXPECT_EQ(conv1.ToString(), "Conv1d(2, 3, kernel_size=(5,), stride=(1,), padding=(2,), dilation=(2,))");
  EXPECT_EQ(MaxPool2d(2).ToString(), "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");
  EXPECT_EQ(AvgPool2d(3, {.stride = Size2(2, 1), .padding = 1}).ToString(),
            "AvgPool2d(kernel_size=3, stride=(2, 1), padding=1)");
  EXPECT_EQ(AdaptiveAvgPool2d(Size2(3, 2)).ToString(), "AdaptiveAvgPool2d(output_size=(3, 2))");
}

TEST(ConvLayerTest, UnbatchedInputs) {
  Generator gen(1);
  Conv2d conv(3, 5, 3, gen, {.padding = 1});
  Tensor x = Tensor::Randn({2, 3, 6, 6}, gen);
  Tensor batched = conv.Forward(x);
  Tensor single = conv.Forward(kernels::Select(x, 0, 1));
  EXPECT_EQ(single.sizes(), Shape({5, 6, 6}));
  EXPECT_LT(kernels::MaxAbsDiff(single, kernels::Select(batched, 0, 1)), 1e-6);
  MaxPool2d pool(2);
  EXPECT_EQ(pool.Forward(kernels::Select(x, 0, 0)).sizes(), Shape({3, 3, 3}));
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ConvLayerTest, ErrorsNameTheLayerAndShapes) {
  Generator gen(2);
  Conv2d conv(1, 32, 3, gen);
  EXPECT_EQ(ErrorOf([&] { conv.Forward(Tensor::Zeros({64, 784})); }),
            "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1)): expected input [N, 1, H, W] or "
            "[1, H, W], got [64, 784]");
  EXPECT_EQ(ErrorOf([&] { conv.Forward(Tensor::Zeros({64, 3, 28, 28})); }),
            "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1)): expected input [N, 1, H, W] or "
            "[1, H, W], got [64, 3, 28, 28]");
  EXPECT_NE(ErrorOf([&] { conv.Forward(Tensor::Zeros({1, 1, 2, 2})); }).find("smaller than"),
            std::string::npos);
  Conv1d conv1(4, 2, 3, gen);
  EXPECT_EQ(ErrorOf([&] { conv1.Forward(Tensor::Zeros({2, 3, 9})); }),
            "Conv1d(4, 2, kernel_size=(3,), stride=(1,)): expected input [N, 4, L] or [4, L], "
            "got [2, 3, 9]");
  EXPECT_NE(ErrorOf([&] { Conv2d(3, 4, 3, gen, {.groups = 2}); }).find("divisible by groups"),
            std::string::npos);
  EXPECT_EQ(ErrorOf([&] { MaxPool2d(2).Forward(Tensor::Zeros({4, 4})); }),
            "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False): "
            "expected input [N, C, H, W] or [C, H, W], got [4, 4]");
  EXPECT_NE(ErrorOf([&] { kernels::Conv2d(Tensor::Zeros({1, 4, 5, 5}), Tensor::Zeros({2, 3, 3, 3}),
                                          Tensor()); })
                .find("Conv2d: input [1, 4, 5, 5] has 4 channels but weight [2, 3, 3, 3]"),
            std::string::npos);
}

}  // namespace
}  // namespace gw::nn
