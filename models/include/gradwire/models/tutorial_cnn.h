// TutorialCnn: the network of PyTorch's parameter-server tutorial (and of its MNIST example),
// for 28x28 single-channel images.
//
// Contract
//   - conv1 Conv2d(1, 32, 3) -> ReLU -> conv2 Conv2d(32, 64, 3) -> MaxPool2d(2) ->
//     dropout1 Dropout2d(0.25) -> Flatten -> fc1 Linear(9216, 128) -> ReLU ->
//     dropout2 Dropout(0.5) -> fc2 Linear(128, 10) -> log_softmax: the output is
//     log-probabilities [N, 10], trained with NLL loss (nn::NllLoss).
//   - Parameter names and state-dict keys are PyTorch's (conv1.weight, ..., fc2.bias), so a
//     state dict saved by the tutorial loads as it is. (The tutorial's dropout2 is a
//     Dropout2d on [N, 128], which drops single elements: a Dropout here.)
//   - Input [N, 1, 28, 28] or [N, 784] (models/images.h). Default initialisation is
//     PyTorch's, drawn from `gen`. Dropout draws from generators forked from `gen`, so
//     Forward in training mode is not safe to call concurrently; in eval mode it is.
#ifndef GRADWIRE_MODELS_TUTORIAL_CNN_H_
#define GRADWIRE_MODELS_TUTORIAL_CNN_H_

#include <memory>

#include "gradwire/nn/conv.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/module.h"

namespace gw::models {

class TutorialCnn final : public nn::Module {
 public:
  explicit TutorialCnn(Generator& gen, DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& images) override;

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::Dropout2d> dropout1_;
  std::shared_ptr<nn::Dropout> dropout2_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

}  // namespace gw::models

#endif  // GRADWIRE_MODELS_TUTORIAL_CNN_H_
