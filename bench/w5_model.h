// W5's model (BENCHMARKS.md), shared by the benchmarks that split it: stage 1 is
// Linear(1024,1024)+ReLU+Linear(1024,1024)+ReLU, stage 2 Linear(1024,1024)+ReLU+
// Linear(1024,10); batch 128 of random inputs and labels.
#ifndef GRADWIRE_BENCH_W5_MODEL_H_
#define GRADWIRE_BENCH_W5_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "gradwire/gradwire.h"

namespace gw::bench {

inline constexpr int64_t kW5Batch = 128, kW5Width = 1024, kW5Classes = 10;

inline std::shared_ptr<nn::Module> W5Stage(bool first, uint64_t seed) {
  Generator gen(seed);
  std::vector<std::shared_ptr<nn::Module>> layers{std::make_shared<nn::Linear>(kW5Width, kW5Width, gen),
                                                  std::make_shared<nn::ReLU>()};
  layers.push_back(std::make_shared<nn::Linear>(kW5Width, first ? kW5Width : kW5Classes, gen));
  if (first) layers.push_back(std::make_shared<nn::ReLU>());
  return std::make_shared<nn::Sequential>(layers);
}

// A batch: inputs [128, 1024] and labels [128].
inline std::pair<Tensor, Tensor> W5Batch(uint64_t seed = 0) {
  Generator gen(seed);
  Tensor x = Tensor::Randn({kW5Batch, kW5Width}, gen);
  std::vector<int64_t> labels(kW5Batch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.NextBelow(kW5Classes));
  return {x, Tensor::FromVector<int64_t>(labels)};
}

}  // namespace gw::bench

#endif  // GRADWIRE_BENCH_W5_MODEL_H_
