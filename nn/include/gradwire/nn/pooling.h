// Pooling layers with PyTorch's names, arguments and repr: MaxPool2d, AvgPool2d,
// AdaptiveAvgPool2d.
//
// Contract
//   - No parameters or buffers. Forward takes [N, C, H, W] or [C, H, W] and computes with
//     gradwire/autograd/pooling.h (float32 on oneDNN); stride defaults to kernel_size.
//   - ToString is PyTorch's repr for integer arguments, e.g. "MaxPool2d(kernel_size=2,
//     stride=2, padding=0, dilation=1, ceil_mode=False)" (a pair prints as "(2, 3)");
//     errors are gw::Error naming the layer that way and the input's shape.
//   - Thread safety: concurrent Forward calls are safe (no mutable state).
#ifndef GRADWIRE_NN_POOLING_H_
#define GRADWIRE_NN_POOLING_H_

#include <optional>
#include <string>

#include "gradwire/nn/module.h"
#include "gradwire/tensor/pooling.h"

namespace gw::nn {

struct MaxPool2dOptions {
  std::optional<Size2> stride = std::nullopt;
  Size2 padding = 0;
  Size2 dilation = 1;
  bool ceil_mode = false;
};

struct AvgPool2dOptions {
  std::optional<Size2> stride = std::nullopt;
  Size2 padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, const MaxPool2dOptions& options = {});
  Tensor Forward(const Tensor& input) override;

 protected:
  std::string ExtraRepr() const override;

 private:
  Pool2dArgs args_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, const AvgPool2dOptions& options = {});
  Tensor Forward(const Tensor& input) override;

 protected:
  std::string ExtraRepr() const override;

 private:
  Pool2dArgs args_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor Forward(const Tensor& input) override;

 protected:
  std::string ExtraRepr() const override;

 private:
  Size2 output_size_;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_POOLING_H_
