// Differentiable pooling (PyTorch's F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d).
//
// Contract
//   - Shapes, arguments and errors are those of gradwire/tensor/pooling.h: input
//     [N, C, H, W] or [C, H, W], output of the same rank.
//   - MaxPool2d's gradient flows to the (first) maximum of each window, through the indices
//     or oneDNN workspace its forward saved; the average poolings' gradients spread evenly
//     over each window with the forward's divisor.
//   - Thread safety: as the kernels (any number of concurrent calls).
#ifndef GRADWIRE_AUTOGRAD_POOLING_H_
#define GRADWIRE_AUTOGRAD_POOLING_H_

#include "gradwire/tensor/pooling.h"
#include "gradwire/tensor/tensor.h"

namespace gw {

Tensor MaxPool2d(const Tensor& input, const Pool2dArgs& args);
Tensor AvgPool2d(const Tensor& input, const Pool2dArgs& args);
Tensor AdaptiveAvgPool2d(const Tensor& input, Size2 output_size);

}  // namespace gw

#endif  // GRADWIRE_AUTOGRAD_POOLING_H_
