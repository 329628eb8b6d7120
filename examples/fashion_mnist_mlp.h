// The examples' models: the MLP and the model zoo chosen with a --model flag.
//
// Contract
//   - FashionMnistMlp(gen): an MLP 784-256-128-10 with ReLUs (benchmark W5's), initialised
//     from `gen`. Its parameters are named "0.weight", "0.bias", "2.weight", ... (Sequential),
//     which are also the parameter-server tables of ps_fashion_mnist, so a state dict saved
//     by any of the examples loads into any other and a served copy can follow the servers.
//   - ModelChoices(): "mlp" followed by the zoo's names (models::ModelNames(): cnn, resnet,
//     lstm, and any model added to the zoo later, e.g. vit).
//     CheckModel(name, allowed): OK, or INVALID_ARGUMENT naming --model and the choices
//     (`allowed`, or every choice when empty).
//     ExampleModel(name, gen): "mlp" is FashionMnistMlp, any other name models::Create
//     (float32); an unknown name is CheckModel's error. Train it with
//     models::Loss(name, output, targets) (NLL on the CNN's log-probabilities, else
//     cross-entropy; "mlp" gives logits).
//   - Recipe: a program's defaults per model (learning rate, epochs). ChooseRecipe(recipes,
//     name, lr, epochs) returns the row for `name` (the row named "*" for models without
//     one) with a non-zero `lr` / `epochs` (the flags as given) taking precedence.
#ifndef GRADWIRE_EXAMPLES_FASHION_MNIST_MLP_H_
#define GRADWIRE_EXAMPLES_FASHION_MNIST_MLP_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/models/zoo.h"
#include "gradwire/nn/layers.h"

namespace gw::examples {

inline std::shared_ptr<nn::Sequential> FashionMnistMlp(Generator& gen) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(784, 256, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(256, 128, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 10, gen)});
}

inline std::vector<std::string> ModelChoices() {
  std::vector<std::string> names{"mlp"};
  for (const std::string& name : models::ModelNames()) names.push_back(name);
  return names;
}

inline absl::Status CheckModel(const std::string& name, std::vector<std::string> allowed = {}) {
  if (allowed.empty()) allowed = ModelChoices();
  if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) return absl::OkStatus();
  const std::vector<std::string> all = ModelChoices();
  const bool exists = std::find(all.begin(), all.end(), name) != all.end();
  return absl::InvalidArgumentError(absl::StrCat("--model=", name, ": ",
                                                 exists ? "this program cannot train it" : "no such model",
                                                 "; choose one of ", absl::StrJoin(allowed, ", ")));
}

inline absl::StatusOr<std::shared_ptr<nn::Module>> ExampleModel(const std::string& name, Generator& gen) {
  if (absl::Status s = CheckModel(name); !s.ok()) return s;
  if (name == "mlp") return std::shared_ptr<nn::Module>(FashionMnistMlp(gen));
  return models::Create(name, gen);
}

struct Recipe {
  std::string model;  // "*": every model without a row of its own
  double lr = 0.05;
  int epochs = 1;
  std::string optimizer = "sgd";  // "sgd" (with the program's --momentum) or "adamw"
  bool cosine = false;             // the learning rate decays to 0 over the run (a half cosine)
};

// The learning rate of step `step` (0-based) of `total` under `recipe`.
inline double ScheduledLr(const Recipe& recipe, int64_t step, int64_t total) {
  if (!recipe.cosine || total <= 0) return recipe.lr;
  constexpr double kPi = 3.14159265358979323846;
  return 0.5 * recipe.lr * (1 + std::cos(kPi * static_cast<double>(step) / static_cast<double>(total)));
}

inline Recipe ChooseRecipe(const std::vector<Recipe>& recipes, const std::string& name, double lr, int epochs,
                           const std::string& optimizer = "") {
  Recipe r{name};
  auto row = std::find_if(recipes.begin(), recipes.end(), [&](const Recipe& x) { return x.model == name; });
  if (row == recipes.end()) {
    row = std::find_if(recipes.begin(), recipes.end(), [](const Recipe& x) { return x.model == "*"; });
  }
  if (row != recipes.end()) r = *row;
  r.model = name;
  if (lr > 0) r.lr = lr;
  if (epochs > 0) r.epochs = epochs;
  if (!optimizer.empty()) r.optimizer = optimizer;
  return r;
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_FASHION_MNIST_MLP_H_
