// Differentiable convolutions over gw::kernels' Conv2d and ConvTranspose2d.
#include "gradwire/autograd/convolution.h"

#include "gradwire/autograd/function.h"
#include "gradwire/autograd/functions.h"

namespace gw {
namespace {

using autograd::SavedTensor;

bool Needs(const Tensor& t) { return t.defined() && t.requires_grad(); }

// Records `out` = op(input, weight, bias) with `backward` a kernels::*Backward function.
template <typename Backward>
Tensor RecordConv(const char* name, const Tensor& input, const Tensor& weight,
                  const Tensor& bias, const Conv2dArgs& args, Tensor out, Backward backward) {
  return autograd::Record(
      name, {input, weight, bias}, std::move(out),
      [name, args, backward, si = SavedTensor(input), sw = SavedTensor(weight),
       need = ConvGradMask{Needs(input), Needs(weight), Needs(bias)}](
          const Tensor& g) -> std::vector<Tensor> {
        ConvGrads grads = backward(g, si.Get(name), sw.Get(name), args, need);
        return {grads.input, grads.weight, grads.bias};
      });
}

}  // namespace

Tensor ToChannelsLast(const Tensor& input) {
  Tensor out = kernels::ToChannelsLast(input);
  if (out.is_same(input)) return input;
  return autograd::Record("ToChannelsLastBackward", {input}, std::move(out),
                          [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor Conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              const Conv2dArgs& args) {
  return RecordConv("Conv2dBackward", input, weight, bias, args,
                    kernels::Conv2d(input, weight, bias, args), kernels::Conv2dBackward);
}

Tensor ConvTranspose2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                       const Conv2dArgs& args) {
  return RecordConv("ConvTranspose2dBackward", input, weight, bias, args,
                    kernels::ConvTranspose2d(input, weight, bias, args),
                    kernels::ConvTranspose2dBackward);
}

Tensor Conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              const Conv1dArgs& args) {
  GW_CHECK(input.defined() && input.dim() == 3, "Conv1d", "expected input [N, C, L], got ",
           input.defined() ? ShapeToString(input.sizes()) : "undefined");
  GW_CHECK(weight.defined() && weight.dim() == 3, "Conv1d", "expected weight [C_out, C_in / ",
           "groups, k], got ", weight.defined() ? ShapeToString(weight.sizes()) : "undefined");
  const Conv2dArgs args2d{.stride = {1, args.stride},
                          .padding = {0, args.padding},
                          .dilation = {1, args.dilation},
                          .groups = args.groups};
  return Squeeze(Conv2d(Unsqueeze(input, 2), Unsqueeze(weight, 2), bias, args2d), 2);
}

}  // namespace gw
