// Unit: convolution and pooling kernels (tensor/convolution.h, pooling.h): the float32
// oneDNN path (direct, Winograd, strided inputs) against gradwire's own float64 loops,
// forward and every gradient, and the argument errors.
#include "gradwire/tensor/convolution.h"

#include <gtest/gtest.h>

#include <functional>

#include "gradwire/tensor/kernels.h"
#include "gradwire/tensor/pooling.h"

namespace gw::kernels {
namespace {

// max |f32 - f64| <= rtol * max |f64|.
void ExpectClose(const Tensor& f32, const Tensor& f64, double rtol, const std::string& what) {
  ASSERT_TRUE(f32.defined() && f64.defined()) << what;
  ASSERT_EQ(f32.sizes(), f64.sizes()) << what;
  const double scale = MaxAll(Abs(f64)).item();
  EXPECT_LE(MaxAbsDiff(ToDType(f32, DType::kFloat64), f64), rtol * scale) << what;
}

Tensor F32(const Tensor& t) { return ToDType(t, DType::kFloat32); }
// The float32 copy of t rounded back, so both paths see the same inputs.
Tensor Rounded(const Tensor& t) { return ToDType(F32(t), DType::kFloat64); }

struct ConvCase {
  const char* name;
  Shape input, weight;
  Conv2dArgs args;
  bool transposed = false;
};

class ConvKernelTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvKernelTest, Float32MatchesFloat64) {
  const ConvCase& c = GetParam();
  Generator gen(3);
  const Tensor x = Rounded(Tensor::Randn(c.input, gen, DType::kFloat64));
  const Tensor w = Rounded(Tensor::Randn(c.weight, gen, DType::kFloat64));
  const int64_t out_channels = c.transposed ? c.weight[1] * c.args.groups : c.weight[0];
  const Tensor b = Rounded(Tensor::Randn({out_channels}, gen, DType::kFloat64));
  auto forward = c.transposed ? ConvTranspose2d : Conv2d;
  auto backward = c.transposed ? ConvTranspose2dBackward : Conv2dBackward;
  const Tensor y64 = forward(x, w, b, c.args);
  const Tensor y32 = forward(F32(x), F32(w), F32(b), c.args);
  ExpectClose(y32, y64, 1e-5, "output");
  const Tensor g = Rounded(Tensor::Randn(y64.sizes(), gen, DType::kFloat64));
  const ConvGrads g64 = backward(g, x, w, c.args, {});
  // A channels-last float32 input: the same values through strides.
  const Tensor x_nhwc = Permute(Contiguous(Permute(F32(x), {0, 2, 3, 1})), {0, 3, 1, 2});
  const ConvGrads g32 = backward(F32(g), x_nhwc, F32(w), c.args, {});
  ExpectClose(g32.input, g64.input, 1e-5, "input gradient");
  ExpectClose(g32.weight, g64.weight, 1e-5, "weight gradient");
  ExpectClose(g32.bias, g64.bias, 1e-5, "bias gradient");
  const ConvGrads only_weight = backward(F32(g), F32(x), F32(w), c.args,
                                         {.input = false, .weight = true, .bias = false});
  EXPECT_FALSE(only_weight.input.defined());
  EXPECT_FALSE(only_weight.bias.defined());
  ExpectClose(only_weight.weight, g64.weight, 1e-5, "weight gradient alone");
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, ConvKernelTest,
    ::testing::Values(
        ConvCase{"FirstLayer", {4, 1, 10, 10}, {8, 1, 3, 3}, {}},
        // 32 -> 32 channels, 3x3, batch 32: oneDNN picks Winograd.
        ConvCase{"Winograd", {32, 32, 12, 12}, {32, 32, 3, 3}, {.padding = 1}},
        ConvCase{"StrideTwoDownsample", {4, 16, 9, 9}, {32, 16, 3, 3}, {.stride = 2, .padding = 1}},
        ConvCase{"GroupsDilation", {2, 6, 9, 8}, {9, 2, 3, 2},
                 {.stride = {1, 2}, .padding = {2, 1}, .dilation = {2, 1}, .groups = 3}},
        ConvCase{"Transposed", {2, 4, 5, 4}, {4, 6, 3, 3},
                 {.stride = 2, .padding = 1, .groups = 2, .output_padding = 1}, true},
        ConvCase{"TransposedDilated", {2, 3, 4, 4}, {3, 2, 2, 3},
                 {.stride = {1, 2}, .dilation = {2, 1}}, true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(PoolKernelTest, Float32MatchesFloat64) {
  Generator gen(4);
  const Tensor x = Rounded(Tensor::Randn({2, 3, 9, 8}, gen, DType::kFloat64));
  const Tensor x32 = Permute(Contiguous(Permute(F32(x), {0, 2, 3, 1})), {0, 3, 1, 2});
  const std::vector<Pool2dArgs> cases = {
      {.kernel_size = 2},
      {.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true},
      {.kernel_size = {3, 2}, .stride = Size2(2, 1), .padding = 1, .dilation = {1, 2}},
      {.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false},
  };
  for (const Pool2dArgs& a : cases) {
    const MaxPool2dResult m64 = MaxPool2d(x, a), m32 = MaxPool2d(x32, a);
    ExpectClose(m32.output, m64.output, 1e-6, "max output");
    const Tensor g = Rounded(Tensor::Randn(m64.output.sizes(), gen, DType::kFloat64));
    ExpectClose(MaxPool2dBackward(F32(g), x.sizes(), m32.indices, a),
                MaxPool2dBackward(g, x.sizes(), m64.indices, a), 1e-6, "max gradient");
    if (a.dilation != Size2(1)) continue;
    const Tensor a64 = AvgPool2d(x, a);
    ExpectClose(AvgPool2d(x32, a), a64, 1e-6, "avg output");
    ExpectClose(AvgPool2dBackward(F32(g), x.sizes(), a), AvgPool2dBackward(g, x.sizes(), a),
                1e-6, "avg gradient");
  }
  for (Size2 out : {Size2(3), Size2(4, 1), Size2(1)}) {
    const Tensor y64 = AdaptiveAvgPool2d(x, out);
    ExpectClose(AdaptiveAvgPool2d(x32, out), y64, 1e-6, "adaptive output");
    const Tensor g = Rounded(Tensor::Randn(y64.sizes(), gen, DType::kFloat64));
    ExpectClose(AdaptiveAvgPool2dBackward(F32(g), x.sizes()),
                AdaptiveAvgPool2dBackward(g, x.sizes()), 1e-6, "adaptive gradient");
  }
  // Unbatched [C, H, W] keeps its rank.
  EXPECT_EQ(MaxPool2d(Select(x32, 0, 0), {.kernel_size = 2}).output.sizes(), Shape({3, 4, 4}));
  EXPECT_EQ(AdaptiveAvgPool2d(Select(x, 0, 0), Size2(2)).sizes(), Shape({3, 2, 2}));
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ConvKernelTest, ErrorsNameTheOpAndShapes) {
  const Tensor x = Tensor::Zeros({2, 4, 5, 5});
  EXPECT_EQ(ErrorOf([&] { Conv2d(Tensor::Zeros({4, 5, 5}), Tensor::Zeros({2, 4, 3, 3}), Tensor()); }),
            "Conv2d: expected input [N, 4, H, W], got [4, 5, 5]");
  EXPECT_EQ(ErrorOf([&] { Conv2d(x, Tensor::Zeros({6, 2, 3, 3}), Tensor(), {.groups = 3}); }),
            "Conv2d: input [2, 4, 5, 5] has 4 channels but weight [6, 2, 3, 3] with groups=3 "
            "expects 6");
  EXPECT_EQ(ErrorOf([&] { Conv2d(x, Tensor::Zeros({2, 4, 3, 3}), Tensor::Zeros({3})); }),
            "Conv2d: bias [3] does not match 2 output channels of weight [2, 4, 3, 3]");
  EXPECT_EQ(ErrorOf([&] { Conv2d(x, Tensor::Zeros({2, 4, 7, 3}), Tensor()); }),
            "Conv2d: input [2, 4, 5, 5] padded by (0, 0) is smaller than the dilated kernel "
            "(7, 3) of weight [2, 4, 7, 3]");
  EXPECT_NE(ErrorOf([&] { Conv2d(x, Tensor::Zeros({2, 4, 3, 3}, DType::kFloat64), Tensor()); })
                .find("dtype mismatch"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              ConvTranspose2d(x, Tensor::Zeros({4, 2, 3, 3}), Tensor(),
                              {.stride = 2, .output_padding = 2});
            }).find("output_padding (2, 2) must be smaller than stride (2, 2)"),
            std::string::npos);
  EXPECT_EQ(ErrorOf([&] { MaxPool2d(Tensor::Zeros({5, 5}), {.kernel_size = 2}); }),
            "MaxPool2d: expected input [N, C, H, W] or [C, H, W], got [5, 5]");
  EXPECT_NE(ErrorOf([&] { MaxPool2d(x, {.kernel_size = 2, .padding = 2}); })
                .find("padding 2 must be at most half the kernel span 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { AvgPool2d(x, {.kernel_size = 6}); }).find("smaller than the kernel"),
            std::string::npos);
}

}  // namespace
}  // namespace gw::kernels
