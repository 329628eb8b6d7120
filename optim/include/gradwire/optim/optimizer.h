// Optimizer: a local optimizer over a fixed list of parameter tensors.
//
// Contract
//   - What it is: the equivalent of a single-param-group torch.optim optimizer. It holds
//     the parameters (handles that alias the caller's tensors, e.g. a module's
//     parameters), one OptimizerConfig and one ParamState per parameter, and applies
//     optim::Update (functional.h) to every parameter that has a gradient.
//   - ZeroGrad() sets every parameter's .grad() to undefined (PyTorch's
//     zero_grad(set_to_none=True)); the next backward pass allocates fresh gradients.
//   - Step() updates, in order, every parameter whose .grad() is defined, in place and
//     under NoGradGuard; parameters without a gradient are skipped and keep their state.
//     If an update throws (gw::Error), parameters before it have already been updated.
//   - Thread safety: not thread-safe. Step()/ZeroGrad() write the parameters and their
//     gradients; do not run them concurrently with each other or with a forward/backward
//     pass over the same parameters.
//   - REQUIRES (checked in the constructor, gw::Error naming the optimizer): every
//     parameter is a defined floating-point CPU tensor, no parameter is listed twice,
//     and the config passes optim::Validate(). set_lr REQUIRES lr >= 0.
#ifndef GRADWIRE_OPTIM_OPTIMIZER_H_
#define GRADWIRE_OPTIM_OPTIMIZER_H_

#include <cstddef>
#include <vector>

#include "gradwire/optim/functional.h"
#include "gradwire/tensor/tensor.h"

namespace gw::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, OptimizerConfig config);

  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;

  // Sets every parameter's gradient to undefined.
  void ZeroGrad();
  // Applies one update to every parameter with a defined gradient.
  void Step();

  // The state of parameter i (in constructor order). REQUIRES: i < size() (checked).
  const ParamState& state(size_t i) const;
  const OptimizerConfig& config() const { return config_; }
  const std::vector<Tensor>& params() const { return params_; }
  size_t size() const { return params_.size(); }

  double lr() const { return LearningRate(config_); }
  // Changes the learning rate used by later Step() calls (e.g. from a schedule).
  void set_lr(double lr);

 private:
  std::vector<Tensor> params_;
  OptimizerConfig config_;
  std::vector<ParamState> states_;  // parallel to params_
};

}  // namespace gw::optim

#endif  // GRADWIRE_OPTIM_OPTIMIZER_H_
