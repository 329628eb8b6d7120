// LstmClassifier: an LSTM that reads an image row by row and classifies it from its last
// output, the recurrent model of the zoo.
//
// Contract
//   - lstm LSTM(input = image width, hidden_size, num_layers, batch_first) over the
//     image's rows (28 steps of 28 pixels for Fashion-MNIST), then fc Linear(hidden_size,
//     num_classes) on the last step's output: logits [N, num_classes].
//   - State-dict keys are PyTorch's (lstm.weight_ih_l0, ..., fc.bias; bench/pytorch/zoo.py).
//   - Input [N, 1, H, W] or flattened [N, H*W] (models/images.h).
#ifndef GRADWIRE_MODELS_LSTM_CLASSIFIER_H_
#define GRADWIRE_MODELS_LSTM_CLASSIFIER_H_

#include <memory>

#include "gradwire/models/images.h"
#include "gradwire/nn/layers.h"
#include "gradwire/nn/module.h"
#include "gradwire/nn/recurrent.h"

namespace gw::models {

struct LstmClassifierOptions {
  ImageShape input{};
  int64_t hidden_size = 128;
  int64_t num_layers = 2;
  int64_t num_classes = 10;
  DType dtype = DType::kFloat32;
};

class LstmClassifier final : public nn::Module {
 public:
  explicit LstmClassifier(Generator& gen, const LstmClassifierOptions& options = {});
  Tensor Forward(const Tensor& images) override;

 private:
  LstmClassifierOptions options_;
  std::shared_ptr<nn::LSTM> lstm_;
  std::shared_ptr<nn::Linear> fc_;
};

}  // namespace gw::models

#endif  // GRADWIRE_MODELS_LSTM_CLASSIFIER_H_
