// The model zoo by name: what examples and benchmarks build from a flag (--model=cnn).
//
// Contract
//   - Create(name, gen, dtype) builds a model for Fashion-MNIST-sized input (images
//     [N, 1, 28, 28] or flattened [N, 784]) with 10 classes, initialised from `gen`:
//       "cnn"     TutorialCnn (models/tutorial_cnn.h): log-probabilities, NLL loss
//       "resnet"  SmallResNet (models/resnet.h)
//       "lstm"    LstmClassifier (models/lstm_classifier.h)
//       "vit"     SmallViT (models/vit.h)
//     the others give logits for cross-entropy. An unknown name is INVALID_ARGUMENT
//     listing the names there are.
//   - OutputsLogProbabilities(name): whether the model ends in log_softmax (train it with
//     NLL loss; Loss() picks the right one).
#ifndef GRADWIRE_MODELS_ZOO_H_
#define GRADWIRE_MODELS_ZOO_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/nn/module.h"

namespace gw::models {

std::vector<std::string> ModelNames();
absl::StatusOr<std::shared_ptr<nn::Module>> Create(std::string_view name, Generator& gen,
                                                   DType dtype = DType::kFloat32);
bool OutputsLogProbabilities(std::string_view name);
// The training loss of model `name` on its output: NLL for log-probabilities, else
// cross-entropy.
Tensor Loss(std::string_view name, const Tensor& output, const Tensor& targets);

}  // namespace gw::models

#endif  // GRADWIRE_MODELS_ZOO_H_
