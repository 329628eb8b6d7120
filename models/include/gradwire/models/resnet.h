// SmallResNet: a residual network of basic blocks with batch normalization, for small
// images (Fashion-MNIST's 28x28), and BasicBlock, its unit.
//
// Contract
//   - BasicBlock(in, out, stride): conv1 3x3 (stride) -> bn1 -> ReLU -> conv2 3x3 -> bn2,
//     plus the input (or downsample: a 1x1 conv with the stride and a BatchNorm2d, named
//     "downsample.0" / "downsample.1", when the stride or width changes), then ReLU.
//     Convolutions have no bias, as in torchvision's ResNets.
//   - SmallResNet: conv1 3x3 (in_channels -> widths[0]) -> bn1 -> ReLU -> `layers`
//     (blocks_per_stage blocks per width, stride 2 entering each stage after the first)
//     -> adaptive average pooling to 1x1 -> fc Linear(widths.back(), num_classes). The
//     defaults (16, 32, 64 channels, 2 blocks each) give 28x28 -> 28, 14, 7. Output:
//     logits [N, num_classes].
//   - State-dict keys are those of the same model written in PyTorch (bench/pytorch/zoo.py):
//     conv1.weight, bn1.*, layers.<i>.conv1.weight, layers.<i>.bn1.running_mean, ...,
//     fc.*. Initialisation: PyTorch's module defaults, drawn from `gen`.
//   - Pieces() lists the model in order as modules that share its parameters and buffers:
//     the stem (conv1, bn1, ReLU), each block, and the head (pooling, flatten, fc); running
//     them one after another is Forward. Pipelines cut the model between pieces.
//   - Input [N, C, H, W] or flattened [N, C*H*W] (models/images.h).
#ifndef GRADWIRE_MODELS_RESNET_H_
#define GRADWIRE_MODELS_RESNET_H_

#include <memory>
#include <vector>

#include "gradwire/models/images.h"
#include "gradwire/nn/conv.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/module.h"
#include "gradwire/nn/normalization.h"

namespace gw::models {

class BasicBlock final : public nn::Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Generator& gen,
             DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& x) override;

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<nn::Sequential> downsample_;  // null: the identity
};

struct ResNetOptions {
  ImageShape input{};
  std::vector<int64_t> widths = {16, 32, 64};
  int64_t blocks_per_stage = 2;
  int64_t num_classes = 10;
  DType dtype = DType::kFloat32;
};

class SmallResNet final : public nn::Module {
 public:
  explicit SmallResNet(Generator& gen, const ResNetOptions& options = {});
  Tensor Forward(const Tensor& images) override;
  std::vector<std::shared_ptr<nn::Module>> Pieces() const;

 protected:
  std::string ExtraRepr() const override;

 private:
  ResNetOptions options_;
  std::shared_ptr<nn::Sequential> stem_, head_;  // not children: views over conv1/bn1 and pool/fc
  std::shared_ptr<nn::Sequential> layers_;
};

}  // namespace gw::models

#endif  // GRADWIRE_MODELS_RESNET_H_
