// Unit: ToChannelsLast (autograd/convolution.h) and the layers after it in float64 against
// central finite differences: the gradient passes through the layout change unchanged,
// and convolutions, poolings and element-wise ops take channels-last inputs.
#include <gtest/gtest.h>

#include "gradwire/autograd/convolution.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/gradcheck.h"
#include "gradwire/autograd/pooling.h"

namespace gw {
namespace {

std::vector<Tensor> Leaves(const std::vector<Shape>& shapes) {
  Generator gen(11);
  std::vector<Tensor> out;
  for (const Shape& s : shapes) {
    out.push_back(Tensor::Randn(s, gen, DType::kFloat64));
    out.back().set_requires_grad(true);
  }
  return out;
}

void ExpectGradCheck(const std::vector<Shape>& shapes,
                     const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  auto r = autograd::GradCheck(fn, Leaves(shapes));
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(ChannelsLastGradCheckTest, ToChannelsLast) {
  ExpectGradCheck({{2, 3, 4, 5}}, [](auto& x) { return Mul(ToChannelsLast(x[0]), x[0]); });
  // One channel (a view), and a transposed input (a copy).
  ExpectGradCheck({{2, 1, 4, 5}}, [](auto& x) { return Relu(ToChannelsLast(x[0])); });
  ExpectGradCheck({{2, 3, 5, 4}},
                  [](auto& x) { return ToChannelsLast(Transpose(x[0], 2, 3)); });
}

TEST(ChannelsLastGradCheckTest, ConvBlockOnChannelsLast) {
  // conv -> relu -> + shortcut -> max pool -> global average, all from a channels-last input.
  ExpectGradCheck({{2, 3, 6, 6}, {4, 3, 3, 3}, {4, 3, 1, 1}}, [](auto& x) {
    const Tensor in = ToChannelsLast(x[0]);
    const Tensor y = Relu(Conv2d(in, x[1], Tensor(), {.padding = 1})) + Conv2d(in, x[2]);
    return AdaptiveAvgPool2d(MaxPool2d(y, {.kernel_size = 2}), Size2(1));
  });
}

}  // namespace
}  // namespace gw
