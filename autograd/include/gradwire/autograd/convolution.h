// Differentiable convolutions (PyTorch's F.conv1d, F.conv2d, F.conv_transpose2d).
//
// Contract
//   - Shapes, arguments and errors are those of gradwire/tensor/convolution.h; Conv1d maps
//     input [N, C_in, L] and weight [C_out, C_in / groups, k] to [N, C_out, L_out] as a
//     Conv2d over a height of one (views, no copies).
//   - bias may be undefined. Backward computes only the gradients an input requires
//     (input, weight, bias), in one pass over the output gradient.
//   - Thread safety: as the kernels (any number of concurrent calls).
#ifndef GRADWIRE_AUTOGRAD_CONVOLUTION_H_
#define GRADWIRE_AUTOGRAD_CONVOLUTION_H_

#include <cstdint>

#include "gradwire/tensor/convolution.h"
#include "gradwire/tensor/tensor.h"

namespace gw {

struct Conv1dArgs {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
};

// kernels::ToChannelsLast, differentiable (the gradient passes through unchanged).
Tensor ToChannelsLast(const Tensor& input);

Tensor Conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv1dArgs& args = {});
Tensor Conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dArgs& args = {});
// weight [C_in, C_out / groups, kH, kW]; args.output_padding adds rows and columns at the
// high end of the output.
Tensor ConvTranspose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                       const Conv2dArgs& args = {});

}  // namespace gw

#endif  // GRADWIRE_AUTOGRAD_CONVOLUTION_H_
