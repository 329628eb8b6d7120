// What the zoo's image models share: their input, Fashion-MNIST-sized images.
//
// Contract
//   - AsImages(x, model) takes a batch of images as [N, C, H, W] or flattened as [N, C*H*W]
//     (what gw::data's loaders give) and returns [N, C, H, W] (a view when possible).
//   - Any other shape is a gw::Error naming the model and both shapes, e.g.
//     "TutorialCnn: expected input [N, 1, 28, 28] or [N, 784], got [64, 28]".
#ifndef GRADWIRE_MODELS_IMAGES_H_
#define GRADWIRE_MODELS_IMAGES_H_

#include <cstdint>
#include <string_view>

#include "gradwire/tensor/tensor.h"

namespace gw::models {

struct ImageShape {
  int64_t channels = 1, height = 28, width = 28;
};

Tensor AsImages(const Tensor& x, std::string_view model, ImageShape shape = {});

}  // namespace gw::models

#endif  // GRADWIRE_MODELS_IMAGES_H_
