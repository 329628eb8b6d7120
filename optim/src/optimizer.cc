#include "gradwire/optim/optimizer.h"

#include <set>
#include <string>
#include <utility>

namespace gw::optim {

Optimizer::Optimizer(std::vector<Tensor> params, OptimizerConfig config)
    : params_(std::move(params)), config_(std::move(config)), states_(params_.size()) {
  Validate(config_);
  const std::string op = Name(config_);
  std::set<const TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    GW_CHECK(p.defined(), op, "parameter ", i, " is undefined");
    GW_CHECK(IsFloating(p.dtype()), op, "parameter ", i, " must be float32 or float64, got ",
             DTypeName(p.dtype()), " ", ShapeToString(p.sizes()));
    GW_CHECK(p.device().type == DeviceType::kCPU, op, "parameter ", i, " is on ",
             p.device().ToString(), " but the optimizer runs on the CPU");
    GW_CHECK(seen.insert(p.unsafe_impl()).second, op, "parameter ", i, " ",
             ShapeToString(p.sizes()), " appears more than once");
  }
}

void Optimizer::ZeroGrad() {
  for (const Tensor& p : params_) {
    if (p.grad().defined()) p.set_grad(Tensor());
  }
}

void Optimizer::Step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor grad = params_[i].grad();
    if (!grad.defined()) continue;
    Update(config_, params_[i], grad, states_[i]);
  }
}

const ParamState& Optimizer::state(size_t i) const {
  GW_CHECK(i < states_.size(), "Optimizer::state", "index ", i, " out of range for ",
           states_.size(), " parameters");
  return states_[i];
}

void Optimizer::set_lr(double lr) {
  GW_CHECK(lr >= 0, Name(config_), "invalid lr ", lr, " (must be >= 0)");
  SetLearningRate(config_, lr);
}

}  // namespace gw::optim
