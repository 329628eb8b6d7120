// Convolution layers with PyTorch's names, arguments, initialisation and state-dict keys:
// Conv1d, Conv2d, ConvTranspose2d.
//
// Contract
//   - Parameters "weight" ([out, in / groups, k...], for ConvTranspose2d [in, out / groups,
//     k...]) and "bias" ([out], absent with .bias = false), both ~ U(-b, b) with
//     b = 1 / sqrt(weight.size(1) * prod(kernel_size)) (PyTorch's kaiming_uniform with
//     a = sqrt(5)), drawn from the given Generator, weight first.
//   - Forward takes a batched ([N, C, ...]) or unbatched ([C, ...]) input, as PyTorch does,
//     and computes with gradwire/autograd/convolution.h (float32 on oneDNN).
//   - ToString is PyTorch's repr, e.g. "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))";
//     errors are gw::Error naming the layer that way and the shapes, e.g.
//     "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1)): expected input [N, 1, H, W] or
//     [1, H, W], got [64, 784]". Invalid arguments throw from the constructor.
//   - Thread safety: concurrent Forward calls are safe (no mutable state).
#ifndef GRADWIRE_NN_CONV_H_
#define GRADWIRE_NN_CONV_H_

#include <cstdint>
#include <string>

#include "gradwire/nn/module.h"
#include "gradwire/tensor/convolution.h"

namespace gw::nn {

struct Conv1dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

struct Conv2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

// PyTorch's argument order: stride, padding, output_padding, groups, bias, dilation.
struct ConvTranspose2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Size2 dilation = 1;
};

// What the three layers share: arguments, parameters, initialisation and repr. Conv1d is
// stored as a 2-D convolution of height 1 (its weight keeps PyTorch's 3-D shape).
class ConvLayer : public Module {
 public:
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 protected:
  enum class Kind { k1d, k2d, kTranspose2d };
  ConvLayer(Kind kind, int64_t in_channels, int64_t out_channels, Size2 kernel_size,
            const Conv2dArgs& args, bool bias, Generator& gen, DType dtype);
  std::string ExtraRepr() const override;
  // Checks that `input` has the layer's channels and rank (batched or not).
  void CheckInput(const Tensor& input) const;

  Kind kind_;
  int64_t in_channels_, out_channels_;
  Size2 kernel_size_;
  Conv2dArgs args_;
  Tensor weight_, bias_;
};

class Conv1d : public ConvLayer {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Generator& gen,
         const Conv1dOptions& options = {}, DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& input) override;
};

class Conv2d : public ConvLayer {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Generator& gen,
         const Conv2dOptions& options = {}, DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& input) override;
};

class ConvTranspose2d : public ConvLayer {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Generator& gen,
                  const ConvTranspose2dOptions& options = {}, DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& input) override;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_CONV_H_
