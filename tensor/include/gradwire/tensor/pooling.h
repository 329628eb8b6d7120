// gw::kernels pooling: MaxPool2d, AvgPool2d and AdaptiveAvgPool2d, forward and backward,
// never recording autograd (see gradwire/autograd/pooling.h).
//
// Contract
//   - Input [N, C, H, W] or [C, H, W] (any strides); outputs are new tensors of the same
//     rank. Output size per axis, as PyTorch's:
//       out = floor((H + 2 * padding - dilation * (k - 1) - 1) / stride) + 1 (ceil with
//       ceil_mode, minus one when the last window would start past the padded input).
//   - Max pooling ignores padding; ties go to the first maximum. AvgPool2d divides by the
//     window clipped to the padded input (count_include_pad) or to the input; the part of
//     a ceil_mode window past the padding never counts (PyTorch's rule).
//     AdaptiveAvgPool2d averages rows floor(i * H / out) .. ceil((i + 1) * H / out) - 1.
//   - float32 runs on oneDNN's pooling primitives (cached per shape); float64, and the
//     average windows oneDNN cannot express (uneven adaptive windows, count_include_pad
//     windows cut by ceil_mode), run on gradwire's own loops, templated over the dtype.
//   - Layouts: outputs are contiguous, except that a float32 channels-last input
//     (ToChannelsLast in convolution.h) gives a channels-last output, pooled in place by
//     oneDNN's nhwc kernels. The gradient of a float32 MaxPool2d has its input's layout; the
//     average poolings' gradients are channels-last when `channels_last` says their
//     input was (no copy of a channels-last gradient then), else contiguous.
//   - MaxPool2d's `indices` is what MaxPool2dBackward needs: for float64 the flat index
//     h * W + w of each maximum in its input plane (PyTorch's return_indices), for float32
//     oneDNN's workspace and the layout it was made in (an opaque int64 buffer). Pass it
//     back unchanged.
//   - Errors: gw::Error naming the op and the shapes (rank, non-positive kernel or stride,
//     padding over half the kernel, an empty output).
//   - Thread safety: all functions may be called concurrently.
#ifndef GRADWIRE_TENSOR_POOLING_H_
#define GRADWIRE_TENSOR_POOLING_H_

#include <optional>

#include "gradwire/tensor/convolution.h"  // Size2
#include "gradwire/tensor/tensor.h"

namespace gw {

struct Pool2dArgs {
  Size2 kernel_size;
  std::optional<Size2> stride = std::nullopt;  // default: kernel_size
  Size2 padding = 0;
  Size2 dilation = 1;            // max pooling only
  bool ceil_mode = false;
  bool count_include_pad = true;  // average pooling only
};

struct MaxPool2dResult {
  Tensor output;
  Tensor indices;  // see the contract above
};

namespace kernels {

MaxPool2dResult MaxPool2d(const Tensor& input, const Pool2dArgs& args);
Tensor MaxPool2dBackward(const Tensor& grad_output, const Shape& input_sizes,
                         const Tensor& indices, const Pool2dArgs& args);

Tensor AvgPool2d(const Tensor& input, const Pool2dArgs& args);
Tensor AvgPool2dBackward(const Tensor& grad_output, const Shape& input_sizes,
                         const Pool2dArgs& args, bool channels_last = false);

Tensor AdaptiveAvgPool2d(const Tensor& input, Size2 output_size);
Tensor AdaptiveAvgPool2dBackward(const Tensor& grad_output, const Shape& input_sizes,
                                 bool channels_last = false);

}  // namespace kernels
}  // namespace gw

#endif  // GRADWIRE_TENSOR_POOLING_H_
