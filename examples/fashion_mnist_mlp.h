// The examples' model: an MLP 784-256-128-10 with ReLUs (benchmark W5's), initialised
// from `gen`. Its parameters are named "0.weight", "0.bias", "2.weight", ... (Sequential),
// which are also the parameter-server tables of ps_fashion_mnist, so a state dict saved by
// any of the examples loads into any other and a served copy can follow the servers.
#ifndef GRADWIRE_EXAMPLES_FASHION_MNIST_MLP_H_
#define GRADWIRE_EXAMPLES_FASHION_MNIST_MLP_H_

#include <memory>
#include <vector>

#include "gradwire/nn/layers.h"

namespace gw::examples {

inline std::shared_ptr<nn::Sequential> FashionMnistMlp(Generator& gen) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(784, 256, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(256, 128, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 10, gen)});
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_FASHION_MNIST_MLP_H_
