#include "gradwire/models/lstm_classifier.h"

#include "gradwire/autograd/functions.h"

namespace gw::models {

LstmClassifier::LstmClassifier(Generator& gen, const LstmClassifierOptions& options)
    : Module("LstmClassifier"), options_(options) {
  GW_CHECK(options.input.channels == 1, "LstmClassifier", "reads single-channel images, got ",
           options.input.channels, " channels");
  lstm_ = RegisterModule(
      "lstm", std::make_shared<nn::LSTM>(options.input.width, options.hidden_size, gen,
                                         nn::RnnOptions{.num_layers = options.num_layers, .batch_first = true},
                                         options.dtype));
  fc_ = RegisterModule("fc", std::make_shared<nn::Linear>(options.hidden_size, options.num_classes, gen, true,
                                                          options.dtype));
}

Tensor LstmClassifier::Forward(const Tensor& images) {
  const Tensor x = AsImages(images, "LstmClassifier", options_.input);
  const Tensor rows = Reshape(x, {x.size(0), options_.input.height, options_.input.width});
  const Tensor out = lstm_->Forward(rows);  // [N, rows, hidden]
  return fc_->Forward(Select(out, 1, out.size(1) - 1));
}

}  // namespace gw::models
