#include "gradwire/models/resnet.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/autograd/convolution.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/nn/pooling.h"

namespace gw::models {
namespace {

nn::BatchNormOptions Bn(DType dtype) { return nn::BatchNormOptions{.dtype = dtype}; }

nn::Conv2dOptions NoBias(int64_t stride, int64_t padding) {
  return nn::Conv2dOptions{.stride = stride, .padding = padding, .bias = false};
}

// The stem's first step: the images in channels-last memory, which every later layer keeps
// (convolutions, batch norm, ReLU and the additions run in place on nhwc data: the W17
// training step went from 0.7-0.8x to 0.50-0.54x of PyTorch's, measured side by side). A
// view for one-channel images. (TutorialCnn stays plain: its flattening would copy.)
class ChannelsLast : public nn::Module {
 public:
  ChannelsLast() : Module("ChannelsLast") {}
  Tensor Forward(const Tensor& input) override { return ToChannelsLast(input); }
};

}  // namespace

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Generator& gen,
                       DType dtype)
    : Module("BasicBlock") {
  conv1_ = RegisterModule("conv1", std::make_shared<nn::Conv2d>(in_channels, out_channels, 3, gen,
                                                                NoBias(stride, 1), dtype));
  bn1_ = RegisterModule("bn1", std::make_shared<nn::BatchNorm2d>(out_channels, Bn(dtype)));
  conv2_ = RegisterModule("conv2", std::make_shared<nn::Conv2d>(out_channels, out_channels, 3, gen,
                                                                NoBias(1, 1), dtype));
  bn2_ = RegisterModule("bn2", std::make_shared<nn::BatchNorm2d>(out_channels, Bn(dtype)));
  if (stride != 1 || in_channels != out_channels) {
    downsample_ = RegisterModule(
        "downsample", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                          std::make_shared<nn::Conv2d>(in_channels, out_channels, 1, gen,
                                                       NoBias(stride, 0), dtype),
                          std::make_shared<nn::BatchNorm2d>(out_channels, Bn(dtype))}));
  }
}

Tensor BasicBlock::Forward(const Tensor& x) {
  Tensor out = bn2_->Forward(conv2_->Forward(Relu(bn1_->Forward(conv1_->Forward(x)))));
  return Relu(out + (downsample_ ? downsample_->Forward(x) : x));
}

SmallResNet::SmallResNet(Generator& gen, const ResNetOptions& options)
    : Module("SmallResNet"), options_(options) {
  GW_CHECK(!options.widths.empty() && options.blocks_per_stage >= 1, "SmallResNet",
           "needs at least one stage of at least one block");
  auto conv1 = RegisterModule("conv1", std::make_shared<nn::Conv2d>(options.input.channels, options.widths[0], 3,
                                                                    gen, NoBias(1, 1), options.dtype));
  auto bn1 = RegisterModule("bn1", std::make_shared<nn::BatchNorm2d>(options.widths[0], Bn(options.dtype)));
  stem_ = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{std::make_shared<ChannelsLast>(), conv1, bn1,
                                               std::make_shared<nn::ReLU>()});
  layers_ = RegisterModule("layers", std::make_shared<nn::Sequential>());
  int64_t in = options.widths[0];
  for (size_t stage = 0; stage < options.widths.size(); ++stage) {
    for (int64_t b = 0; b < options.blocks_per_stage; ++b) {
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      layers_->Push(std::make_shared<BasicBlock>(in, options.widths[stage], stride, gen, options.dtype));
      in = options.widths[stage];
    }
  }
  auto pool = RegisterModule("pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  auto fc = RegisterModule("fc", std::make_shared<nn::Linear>(in, options.num_classes, gen, true, options.dtype));
  head_ = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{pool, std::make_shared<nn::Flatten>(1), fc});
}

Tensor SmallResNet::Forward(const Tensor& images) {
  Tensor x = stem_->Forward(AsImages(images, "SmallResNet", options_.input));
  return head_->Forward(layers_->Forward(x));
}

std::vector<std::shared_ptr<nn::Module>> SmallResNet::Pieces() const {
  std::vector<std::shared_ptr<nn::Module>> pieces{stem_};
  for (const auto& [_, block] : layers_->children()) pieces.push_back(block);
  pieces.push_back(head_);
  return pieces;
}

std::string SmallResNet::ExtraRepr() const {
  return absl::StrCat("widths=[", absl::StrJoin(options_.widths, ", "),
                      "], blocks_per_stage=", options_.blocks_per_stage,
                      ", num_classes=", options_.num_classes);
}

}  // namespace gw::models
