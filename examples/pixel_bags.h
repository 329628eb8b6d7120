// Fashion-MNIST images as bags of sparse feature ids, the input of the examples with an
// embedding table on the parameter servers: one id per lit pixel, id = pixel * 8 + its
// intensity in eighths (6,272 possible ids, about 380 per image); the table of their rows
// on the servers and the dense head on top of the bags. Header-only, no flags.
#ifndef GRADWIRE_EXAMPLES_PIXEL_BAGS_H_
#define GRADWIRE_EXAMPLES_PIXEL_BAGS_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gradwire/nn/layers.h"
#include "gradwire/param_server/client.h"
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

// Creates the synchronous sparse table "pixels" of `dim`-wide rows (normal init from
// `seed`, Adagrad with `lr`) on the servers; every trainer calls it.
inline absl::Status CreatePixelTable(param_server::Client& ps, int64_t dim, uint64_t seed, double lr) {
  const param_server::SparseOptions rows{param_server::RowInit{param_server::RowInit::Kind::kNormal, 0, 1, seed}};
  return ps.CreateSparse("pixels", dim, rows, optim::Adagrad{.lr = lr}, param_server::Consistency::kSync);
}

// The dense layers on top of a `dim`-wide bag: Linear(dim, 128) + ReLU + Linear(128, 10).
inline std::shared_ptr<nn::Sequential> PixelHead(int64_t dim, Generator& gen) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(dim, 128, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 10, gen)});
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_PIXEL_BAGS_H_
