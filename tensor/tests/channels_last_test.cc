// Unit: channels-last layout propagation (ToChannelsLast in tensor/convolution.h): float32
// convolutions (oneDNN nhwc, Winograd in the blocked layout, 16-channel blocked = nhwc),
// poolings and element-wise ops on channels-last inputs return channels-last results with
// the values of the float64 kernels on plain inputs, forward and every gradient.
#include <gtest/gtest.h>

#include <array>

#include "gradwire/tensor/convolution.h"
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
Tensor Rounded(const Tensor& t) { return ToDType(F32(t), DType::kFloat64); }

TEST(ChannelsLastTest, ToChannelsLast) {
  Generator gen(1);
  const Tensor x = Tensor::Randn({2, 3, 4, 5}, gen);
  const Tensor cl = ToChannelsLast(x);
  EXPECT_TRUE(IsChannelsLast(cl));
  EXPECT_FALSE(IsChannelsLast(x));
  EXPECT_EQ(cl.strides(), Shape({60, 1, 15, 3}));
  EXPECT_EQ(MaxAbsDiff(cl, x), 0.0);
  EXPECT_TRUE(ToChannelsLast(cl).is_same(cl));
  // One channel: a view of the same memory with the channel stride 1.
  const Tensor image = Tensor::Randn({2, 1, 4, 5}, gen, DType::kFloat64);
  const Tensor view = ToChannelsLast(image);
  EXPECT_TRUE(IsChannelsLast(view));
  EXPECT_EQ(view.raw_data(), image.raw_data());
  EXPECT_EQ(MaxAbsDiff(view, image), 0.0);
  EXPECT_THROW(ToChannelsLast(Tensor::Zeros({2, 3})), Error);
}

// (Sizes as arrays: GCC 12 warns wrongly about destroying Shape members of constant cases.)
struct ClCase {
  const char* name;
  std::array<int64_t, 4> input, weight;
  Conv2dArgs args;
};

Shape ToShape(const std::array<int64_t, 4>& a) { return Shape(a.begin(), a.end()); }

class ChannelsLastConvTest : public ::testing::TestWithParam<ClCase> {};

TEST_P(ChannelsLastConvTest, MatchesFloat64AndKeepsTheLayout) {
  const ClCase& c = GetParam();
  Generator gen(5);
  const Tensor x = Rounded(Tensor::Randn(ToShape(c.input), gen, DType::kFloat64));
  const Tensor w = Rounded(Tensor::Randn(ToShape(c.weight), gen, DType::kFloat64));
  const Tensor b = Rounded(Tensor::Randn({c.weight[0]}, gen, DType::kFloat64));
  const Tensor x32 = ToChannelsLast(F32(x));
  const Tensor y64 = Conv2d(x, w, b, c.args);
  const Tensor y32 = Conv2d(x32, F32(w), F32(b), c.args);
  EXPECT_TRUE(IsChannelsLast(y32));
  ExpectClose(y32, y64, 1e-5, "output");
  const Tensor g = Rounded(Tensor::Randn(y64.sizes(), gen, DType::kFloat64));
  const ConvGrads g64 = Conv2dBackward(g, x, w, c.args, {});
  // The gradient arrives channels-last (as from a following channels-last layer) or plain.
  for (const Tensor& g32 : {ToChannelsLast(F32(g)), F32(g)}) {
    const ConvGrads r = Conv2dBackward(g32, x32, F32(w), c.args, {});
    EXPECT_TRUE(IsChannelsLast(r.input));
    EXPECT_TRUE(r.weight.is_contiguous());
    ExpectClose(r.input, g64.input, 1e-5, "input gradient");
    ExpectClose(r.weight, g64.weight, 1e-5, "weight gradient");
    ExpectClose(r.bias, g64.bias, 1e-5, "bias gradient");
  }
  const ConvGrads only_weight = Conv2dBackward(ToChannelsLast(F32(g)), x32, F32(w), c.args,
                                               {.input = false, .weight = true, .bias = false});
  EXPECT_FALSE(only_weight.input.defined());
  ExpectClose(only_weight.weight, g64.weight, 1e-5, "weight gradient alone");
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, ChannelsLastConvTest,
    ::testing::Values(
        // One channel: the image's channels-last view, oneDNN's nhwc kernel.
        ClCase{"OneChannel", {4, 1, 9, 9}, {16, 1, 3, 3}, {.padding = 1}},
        // 16 -> 16, 3x3: Winograd in nChw16c, which is nhwc for 16 channels.
        ClCase{"Sixteen", {8, 16, 10, 10}, {16, 16, 3, 3}, {.padding = 1}},
        // 32 -> 32, 3x3: Winograd (and its weight gradient), reordered from and to nhwc.
        ClCase{"ThirtyTwo", {8, 32, 8, 8}, {32, 32, 3, 3}, {.padding = 1}},
        // Stride 2 and 1x1 shortcuts: nhwc in place.
        ClCase{"StrideTwo", {4, 16, 9, 9}, {32, 16, 3, 3}, {.stride = 2, .padding = 1}},
        ClCase{"OneByOne", {4, 16, 8, 8}, {32, 16, 1, 1}, {.stride = 2}},
        ClCase{"GroupsDilation", {2, 6, 9, 8}, {9, 2, 3, 2},
               {.stride = {1, 2}, .padding = {2, 1}, .dilation = {2, 1}, .groups = 3}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ChannelsLastTest, TransposedConvolutionFollowsItsInput) {
  Generator gen(6);
  const Tensor x = Rounded(Tensor::Randn({2, 4, 5, 4}, gen, DType::kFloat64));
  const Tensor w = Rounded(Tensor::Randn({4, 6, 3, 3}, gen, DType::kFloat64));
  const Conv2dArgs args{.stride = 2, .padding = 1, .output_padding = 1};
  const Tensor y32 = ConvTranspose2d(ToChannelsLast(F32(x)), F32(w), Tensor(), args);
  EXPECT_TRUE(IsChannelsLast(y32));
  ExpectClose(y32, ConvTranspose2d(x, w, Tensor(), args), 1e-5, "output");
}

TEST(ChannelsLastTest, Pooling) {
  Generator gen(7);
  const Tensor x = Rounded(Tensor::Randn({2, 16, 8, 6}, gen, DType::kFloat64));
  const Tensor x32 = ToChannelsLast(F32(x));
  const Pool2dArgs a{.kernel_size = 2};
  const MaxPool2dResult m64 = MaxPool2d(x, a), m32 = MaxPool2d(x32, a);
  EXPECT_TRUE(IsChannelsLast(m32.output));
  ExpectClose(m32.output, m64.output, 1e-6, "max output");
  const Tensor g = Rounded(Tensor::Randn(m64.output.sizes(), gen, DType::kFloat64));
  const Tensor gx64 = MaxPool2dBackward(g, x.sizes(), m64.indices, a);
  // The workspace remembers the layout: a plain gradient is read as well.
  for (const Tensor& g32 : {ToChannelsLast(F32(g)), F32(g)}) {
    const Tensor gx = MaxPool2dBackward(g32, x.sizes(), m32.indices, a);
    EXPECT_TRUE(IsChannelsLast(gx));
    ExpectClose(gx, gx64, 1e-6, "max gradient");
  }
  const Tensor avg = AvgPool2d(x32, a);
  EXPECT_TRUE(IsChannelsLast(avg));
  ExpectClose(avg, AvgPool2d(x, a), 1e-6, "avg output");
  const Tensor ga = AvgPool2dBackward(ToChannelsLast(F32(g)), x.sizes(), a, /*channels_last=*/true);
  EXPECT_TRUE(IsChannelsLast(ga));
  ExpectClose(ga, AvgPool2dBackward(g, x.sizes(), a), 1e-6, "avg gradient");
  EXPECT_TRUE(AvgPool2dBackward(F32(g), x.sizes(), a).is_contiguous());
  // Global average pooling, as a ResNet's head: [N, C, 1, 1] gradients are both layouts.
  const Tensor pooled = AdaptiveAvgPool2d(x32, Size2(1));
  ExpectClose(pooled, AdaptiveAvgPool2d(x, Size2(1)), 1e-6, "adaptive output");
  const Tensor gp = Rounded(Tensor::Randn({2, 16, 1, 1}, gen, DType::kFloat64));
  const Tensor gpx = AdaptiveAvgPool2dBackward(F32(gp), x.sizes(), /*channels_last=*/true);
  EXPECT_TRUE(IsChannelsLast(gpx));
  ExpectClose(gpx, AdaptiveAvgPool2dBackward(gp, x.sizes()), 1e-6, "adaptive gradient");
}

TEST(ChannelsLastTest, ElementwiseResultsKeepTheLayout) {
  Generator gen(8);
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Tensor a = Tensor::Randn({2, 5, 3, 4}, gen, dtype);
    const Tensor b = Tensor::Randn({2, 5, 3, 4}, gen, dtype);
    const Tensor acl = ToChannelsLast(a), bcl = ToChannelsLast(b);
    const Tensor sum = Add(acl, bcl);
    EXPECT_TRUE(IsChannelsLast(sum));
    EXPECT_EQ(MaxAbsDiff(sum, Add(a, b)), 0.0);
    const Tensor relu = Relu(acl);
    EXPECT_TRUE(IsChannelsLast(relu));
    EXPECT_EQ(MaxAbsDiff(relu, Relu(a)), 0.0);
    const Tensor back = ReluBackward(bcl, relu);
    EXPECT_TRUE(IsChannelsLast(back));
    EXPECT_EQ(MaxAbsDiff(back, ReluBackward(b, Relu(a))), 0.0);
    // Mixed layouts: the first operand's layout, the same values.
    EXPECT_TRUE(IsChannelsLast(Mul(acl, b)));
    EXPECT_TRUE(Mul(a, bcl).is_contiguous());
    EXPECT_EQ(MaxAbsDiff(Mul(a, bcl), Mul(a, b)), 0.0);
    // Other layouts give contiguous results.
    EXPECT_TRUE(Add(Transpose(a, 2, 3), Transpose(b, 2, 3)).is_contiguous());
    // Broadcasting a per-channel scale keeps the layout of the full-size operand.
    const Tensor scale = Tensor::Randn({1, 5, 1, 1}, gen, dtype);
    EXPECT_TRUE(IsChannelsLast(Mul(acl, scale)));
    EXPECT_EQ(MaxAbsDiff(Mul(acl, scale), Mul(a, scale)), 0.0);
  }
}

}  // namespace
}  // namespace gw::kernels
