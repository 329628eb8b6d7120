// Differentiable pooling over gw::kernels' MaxPool2d, AvgPool2d and AdaptiveAvgPool2d.
#include "gradwire/autograd/pooling.h"

#include "gradwire/autograd/function.h"

namespace gw {

Tensor MaxPool2d(const Tensor& input, const Pool2dArgs& args) {
  MaxPool2dResult r = kernels::MaxPool2d(input, args);
  return autograd::Record("MaxPool2dBackward", {input}, r.output,
                          [sizes = input.sizes(), indices = r.indices,
                           args](const Tensor& g) -> std::vector<Tensor> {
                            return {kernels::MaxPool2dBackward(g, sizes, indices, args)};
                          });
}

Tensor AvgPool2d(const Tensor& input, const Pool2dArgs& args) {
  return autograd::Record("AvgPool2dBackward", {input}, kernels::AvgPool2d(input, args),
                          [sizes = input.sizes(), args, cl = kernels::IsChannelsLast(input)](
                              const Tensor& g) -> std::vector<Tensor> {
                            return {kernels::AvgPool2dBackward(g, sizes, args, cl)};
                          });
}

Tensor AdaptiveAvgPool2d(const Tensor& input, Size2 output_size) {
  return autograd::Record("AdaptiveAvgPool2dBackward", {input},
                          kernels::AdaptiveAvgPool2d(input, output_size),
                          [sizes = input.sizes(), cl = kernels::IsChannelsLast(input)](
                              const Tensor& g) -> std::vector<Tensor> {
                            return {kernels::AdaptiveAvgPool2dBackward(g, sizes, cl)};
                          });
}

}  // namespace gw
