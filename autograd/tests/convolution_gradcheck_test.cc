// Unit: the differentiable convolutions and poolings (autograd/convolution.h, pooling.h)
// against central finite differences in float64, on contiguous and strided inputs.
#include <gtest/gtest.h>

#include "gradwire/autograd/convolution.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/gradcheck.h"
#include "gradwire/autograd/pooling.h"

namespace gw {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

std::vector<Tensor> Leaves(const std::vector<Shape>& shapes, uint64_t seed) {
  Generator gen(seed);
  std::vector<Tensor> out;
  for (const Shape& s : shapes) {
    out.push_back(Tensor::Randn(s, gen, DType::kFloat64));
    out.back().set_requires_grad(true);
  }
  return out;
}

void ExpectGradCheck(const std::vector<Shape>& shapes, const Fn& fn) {
  auto r = autograd::GradCheck(fn, Leaves(shapes, 7));
  EXPECT_TRUE(r.ok) << r.message;
}

// [N, H, W, C] data seen as [N, C, H, W]: a channels-last strided input.
Tensor ChannelsLast(const Tensor& nhwc) { return Permute(nhwc, {0, 3, 1, 2}); }

TEST(ConvGradCheckTest, Conv2dStridePaddingDilationGroups) {
  ExpectGradCheck({{2, 4, 7, 6}, {6, 2, 3, 2}, {6}}, [](auto& x) {
    return Conv2d(x[0], x[1], x[2],
                  {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}, .groups = 2});
  });
}

TEST(ConvGradCheckTest, Conv2dChannelsLastInputNoBias) {
  ExpectGradCheck({{2, 5, 6, 3}, {4, 3, 3, 3}},
                  [](auto& x) { return Conv2d(ChannelsLast(x[0]), x[1], Tensor(), {.padding = 1}); });
}

TEST(ConvGradCheckTest, Conv2dTransposedWeightView) {
  // The weight is a transposed view of a [C_in, C_out, kH, kW] leaf.
  ExpectGradCheck({{1, 3, 5, 5}, {3, 2, 3, 3}, {2}}, [](auto& x) {
    return Conv2d(x[0], Transpose(x[1], 0, 1), x[2], {.stride = 2});
  });
}

TEST(ConvGradCheckTest, ConvTranspose2dOutputPaddingGroupsDilation) {
  ExpectGradCheck({{2, 4, 3, 4}, {4, 3, 3, 2}, {6}}, [](auto& x) {
    return ConvTranspose2d(x[0], x[1], x[2],
                           {.stride = 2, .padding = 1, .dilation = {1, 2}, .groups = 2,
                            .output_padding = 1});
  });
}

TEST(ConvGradCheckTest, ConvTranspose2dChannelsLast) {
  ExpectGradCheck({{2, 4, 3, 3}, {3, 2, 2, 2}}, [](auto& x) {
    return ConvTranspose2d(ChannelsLast(x[0]), x[1], Tensor(), {.stride = 2});
  });
}

TEST(ConvGradCheckTest, Conv1d) {
  ExpectGradCheck({{2, 4, 9}, {2, 2, 3}, {2}}, [](auto& x) {
    return Conv1d(x[0], x[1], x[2], {.stride = 2, .padding = 1, .dilation = 2, .groups = 2});
  });
}

TEST(PoolGradCheckTest, MaxPool2dPaddingDilationCeilMode) {
  ExpectGradCheck({{2, 3, 7, 8}}, [](auto& x) {
    return MaxPool2d(x[0], {.kernel_size = 3, .stride = 2, .padding = 1, .dilation = {1, 2},
                            .ceil_mode = true});
  });
}

TEST(PoolGradCheckTest, MaxPool2dChannelsLastUnbatched) {
  ExpectGradCheck({{2, 6, 6, 3}}, [](auto& x) {
    return Cat({MaxPool2d(ChannelsLast(x[0]), {.kernel_size = 2}),
                Unsqueeze(MaxPool2d(Select(ChannelsLast(x[0]), 0, 1), {.kernel_size = 2}), 0)},
               0);
  });
}

TEST(PoolGradCheckTest, AvgPool2dCeilModeBothDivisors) {
  for (bool include : {true, false}) {
    ExpectGradCheck({{2, 2, 7, 6}}, [include](auto& x) {
      return AvgPool2d(x[0], {.kernel_size = {3, 2}, .stride = 2, .padding = 1,
                              .ceil_mode = true, .count_include_pad = include});
    });
  }
}

TEST(PoolGradCheckTest, AdaptiveAvgPool2dUnevenAndEven) {
  ExpectGradCheck({{2, 3, 7, 5}}, [](auto& x) { return AdaptiveAvgPool2d(ChannelsLast(
      Permute(x[0], {0, 2, 3, 1})), {3, 2}); });
  ExpectGradCheck({{2, 3, 6, 4}}, [](auto& x) { return AdaptiveAvgPool2d(x[0], {3, 1}); });
}

}  // namespace
}  // namespace gw
