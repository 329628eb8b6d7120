// Fashion-MNIST images as bags of sparse feature ids, the input of the examples with an
// embedding table on the parameter servers: one id per lit pixel, id = pixel * 8 + its
// intensity in eighths (6,272 possible ids, about 380 per image). Header-only, no flags.
#ifndef GRADWIRE_EXAMPLES_PIXEL_BAGS_H_
#define GRADWIRE_EXAMPLES_PIXEL_BAGS_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gw::examples {

inline constexpr int64_t kIntensityLevels = 8;  // intensity buckets per pixel
inline constexpr int64_t kPixelIds = 784 * kIntensityLevels;

// Bags of feature ids of images [B, 784] in [0, 1]: ids [N] and offsets [B].
inline std::pair<Tensor, Tensor> PixelBags(const Tensor& images) {
  const int64_t b = images.size(0), pixels = images.size(1);
  const float* x = images.data<float>();
  std::vector<int64_t> ids, offsets;
  for (int64_t i = 0; i < b; ++i) {
    offsets.push_back(static_cast<int64_t>(ids.size()));
    for (int64_t p = 0; p < pixels; ++p) {
      const float v = x[i * pixels + p];
      if (v > 0) {
        ids.push_back(p * kIntensityLevels +
                      std::min<int64_t>(kIntensityLevels - 1, static_cast<int64_t>(v * kIntensityLevels)));
      }
    }
  }
  return {Tensor::FromVector(ids, {static_cast<int64_t>(ids.size())}),
          Tensor::FromVector(offsets, {static_cast<int64_t>(offsets.size())})};
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_PIXEL_BAGS_H_
