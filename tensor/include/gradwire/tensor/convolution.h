// gw::kernels convolution: Conv2d (Conv1d is Conv2d with H = 1) and ConvTranspose2d,
// forward and backward, never recording autograd (see gradwire/autograd/convolution.h).
//
// Contract
//   - Shapes follow PyTorch. Conv2d: input [N, C_in, H, W], weight [C_out, C_in / groups,
//     kH, kW], bias [C_out] or undefined; output [N, C_out, H_out, W_out] with
//     H_out = (H + 2 * padding - dilation * (kH - 1) - 1) / stride + 1.
//     ConvTranspose2d: weight [C_in, C_out / groups, kH, kW]; output H_out =
//     (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1.
//     ConvTranspose2d is the adjoint of the Conv2d with the same weight and arguments.
//   - Inputs may be strided views (a permuted channels-last tensor, a narrowed batch).
//     Outputs and gradients are new tensors laid out as PyTorch's: float32 channels-last
//     (see ToChannelsLast) when the input (ConvTranspose2d: its input) is channels-last,
//     else contiguous (NCHW); the weight and bias gradients are always contiguous.
//   - float32 runs on oneDNN's convolution primitives. Plain inputs: algorithm "auto"
//     (Winograd where oneDNN finds it faster, e.g. 3x3 stride-1 layers of 16 channels or
//     more, else direct), activations reordered into the blocked layout the primitive
//     prefers and back. Channels-last inputs: oneDNN's nhwc kernels on the tensors in
//     place, except 3x3 stride-1 layers of 16 channels or more, which take Winograd in the
//     blocked layout (it saves more than the reorders cost). The weight gradient of such
//     layers is Winograd too. Primitives are built once per geometry and layout and cached
//     (thread-safe). float64 runs on gradwire's own im2col + GEMM, templated so it also
//     serves as a float32 reference.
//   - Conv2dBackward computes only the gradients asked for in `need` (undefined otherwise).
//   - Errors: gw::Error naming the op and the shapes (rank, channel count, groups,
//     non-positive sizes, a kernel larger than the padded input, dtype mismatch).
//   - Thread safety: all functions may be called concurrently.
#ifndef GRADWIRE_TENSOR_CONVOLUTION_H_
#define GRADWIRE_TENSOR_CONVOLUTION_H_

#include <cstdint>
#include <string>

#include "gradwire/tensor/tensor.h"

namespace gw {

// Argument types live in namespace gw (not gw::kernels) so that an unqualified call such
// as Conv2d(x, w, b, args) finds only the differentiable gw::Conv2d by argument lookup.

// A (height, width) pair that a single integer converts to, as PyTorch's int-or-tuple
// arguments: Size2(3) == Size2(3, 3).
struct Size2 {
  int64_t h = 0, w = 0;
  constexpr Size2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit, like PyTorch's ints
  constexpr Size2(int64_t height, int64_t width) : h(height), w(width) {}
  constexpr bool operator==(const Size2&) const = default;
  std::string ToString() const;  // "(3, 3)"
};

struct Conv2dArgs {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;
  Size2 output_padding = 0;  // ConvTranspose2d only; REQUIRES < stride or < dilation
};

// The gradients of a convolution; undefined where not asked for.
struct ConvGrads {
  Tensor input, weight, bias;
};

struct ConvGradMask {
  bool input = true, weight = true, bias = true;
};

namespace kernels {

// `x` [N, C, H, W] stored channels-last ([N, H, W, C] in memory: strides [H*W*C, 1, W*C, C],
// PyTorch's x.contiguous(memory_format=torch.channels_last)): x itself when it already is,
// a view when C == 1 and x is contiguous, else a copy. Any dtype. Convolutions, batch norm,
// pooling and element-wise ops on channels-last inputs return channels-last outputs, so a
// network converts its input once and runs oneDNN's nhwc kernels without reorders.
// Errors: gw::Error unless x is 4-D.
Tensor ToChannelsLast(const Tensor& x);
// Whether `x` is stored so: 4-D with channel stride 1 and the other strides as above
// (dims of size 1 excepted; a contiguous [N, 1, H, W] image is not).
bool IsChannelsLast(const Tensor& x);

Tensor Conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              const Conv2dArgs& args = {});
ConvGrads Conv2dBackward(const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                         const Conv2dArgs& args, ConvGradMask need = {});

Tensor ConvTranspose2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                       const Conv2dArgs& args = {});
ConvGrads ConvTranspose2dBackward(const Tensor& grad_output, const Tensor& input,
                                  const Tensor& weight, const Conv2dArgs& args,
                                  ConvGradMask need = {});

}  // namespace kernels
}  // namespace gw

#endif  // GRADWIRE_TENSOR_CONVOLUTION_H_
