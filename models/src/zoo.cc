#include "gradwire/models/zoo.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/models/lstm_classifier.h"
#include "gradwire/models/resnet.h"
#include "gradwire/models/tutorial_cnn.h"
#include "gradwire/models/vit.h"
#include "gradwire/nn/loss.h"

namespace gw::models {

std::vector<std::string> ModelNames() { return {"cnn", "resnet", "lstm", "vit"}; }

absl::StatusOr<std::shared_ptr<nn::Module>> Create(std::string_view name, Generator& gen, DType dtype) {
  if (name == "cnn") return std::make_shared<TutorialCnn>(gen, dtype);
  if (name == "resnet") return std::make_shared<SmallResNet>(gen, ResNetOptions{.dtype = dtype});
  if (name == "lstm") return std::make_shared<LstmClassifier>(gen, LstmClassifierOptions{.dtype = dtype});
  if (name == "vit") return std::make_shared<SmallViT>(gen, VitOptions{.dtype = dtype});
  return absl::InvalidArgumentError(
      absl::StrCat("no model named '", std::string(name), "' in the zoo; there are: ", absl::StrJoin(ModelNames(), ", ")));
}

bool OutputsLogProbabilities(std::string_view name) { return name == "cnn"; }

Tensor Loss(std::string_view name, const Tensor& output, const Tensor& targets) {
  return OutputsLogProbabilities(name) ? nn::NllLoss(output, targets) : nn::CrossEntropyLoss(output, targets);
}

}  // namespace gw::models
