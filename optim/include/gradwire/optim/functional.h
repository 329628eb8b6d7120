// Functional optimizers: one update of one parameter as a pure function of
// (parameter, gradient, per-parameter state, hyper-parameters).
//
// Contract
//   - What it is: the update rules of PyTorch 1.13's torch.optim (single-tensor
//     implementation) for SGD, Adam, AdamW and Adagrad, written so that anything that owns
//     a parameter (the local Optimizer, a parameter server holding a shard, the
//     DistributedOptimizer's owners) can apply them without an optimizer object.
//   - Update() writes the new value into `param` in place (bumping its storage version)
//     and updates `state`; it records no autograd history (it runs under NoGradGuard).
//     It is deterministic: the same inputs give bit-identical outputs.
//   - State: ParamState::buffers is created lazily by the first Update() and uses the
//     names of PyTorch's state_dict: "momentum_buffer" (SGD with momentum), "exp_avg",
//     "exp_avg_sq", "max_exp_avg_sq" (Adam/AdamW; the last only with amsgrad), "sum"
//     (Adagrad). Buffers are contiguous and have the parameter's shape and dtype.
//     ParamState::step counts the updates applied (for SGD too, which PyTorch does not
//     store). A fresh (default) ParamState means "no update applied yet".
//   - Performance: contiguous float32/float64 tensors are updated by one fused pass
//     over raw pointers per step (param, grad and the buffers are each read and written
//     at most once). Non-contiguous params and grads are handled through contiguous
//     copies, which costs extra passes. Parameters on a GPU are updated by the same
//     arithmetic composed of element-wise kernels (a pass each), their state buffers on
//     the parameter's device; a gradient on another device than its parameter is an error.
//   - Thread safety: Update() touches only its arguments. Concurrent calls on distinct
//     (param, state) pairs are safe; the same param or state needs external
//     synchronisation. No global state.
//   - REQUIRES (checked, gw::Error whose message starts with the optimizer's Name()):
//       * param and grad are defined CPU tensors with a floating dtype;
//       * grad has param's shape and dtype (the message names both shapes/dtypes);
//       * buffers already in `state` have param's shape and dtype;
//       * hyper-parameters are in PyTorch's valid ranges (see Validate()).
#ifndef GRADWIRE_OPTIM_FUNCTIONAL_H_
#define GRADWIRE_OPTIM_FUNCTIONAL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gw::optim {

// torch.optim.SGD. The first step with momentum initialises the buffer to the
// (maximize-negated, weight-decayed) gradient itself, without dampening.
// Nesterov requires momentum > 0 and dampening == 0.
struct Sgd {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  static constexpr auto Fields() {
    return std::make_tuple(std::pair{"lr", &Sgd::lr}, std::pair{"momentum", &Sgd::momentum},
                           std::pair{"dampening", &Sgd::dampening}, std::pair{"weight_decay", &Sgd::weight_decay},
                           std::pair{"nesterov", &Sgd::nesterov}, std::pair{"maximize", &Sgd::maximize});
  }
};

// torch.optim.Adam: weight_decay is L2 regularisation added to the gradient.
struct Adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
  static constexpr auto Fields() {
    return std::make_tuple(std::pair{"lr", &Adam::lr}, std::pair{"beta1", &Adam::beta1},
                           std::pair{"beta2", &Adam::beta2}, std::pair{"eps", &Adam::eps},
                           std::pair{"weight_decay", &Adam::weight_decay}, std::pair{"amsgrad", &Adam::amsgrad},
                           std::pair{"maximize", &Adam::maximize});
  }
};

// torch.optim.AdamW: decoupled weight decay, param *= 1 - lr * weight_decay.
struct AdamW {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
  static constexpr auto Fields() {
    return std::make_tuple(std::pair{"lr", &AdamW::lr}, std::pair{"beta1", &AdamW::beta1},
                           std::pair{"beta2", &AdamW::beta2}, std::pair{"eps", &AdamW::eps},
                           std::pair{"weight_decay", &AdamW::weight_decay}, std::pair{"amsgrad", &AdamW::amsgrad},
                           std::pair{"maximize", &AdamW::maximize});
  }
};

// torch.optim.Adagrad: lr / (1 + (step - 1) * lr_decay), accumulator starting at
// initial_accumulator_value.
struct Adagrad {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  bool maximize = false;
  static constexpr auto Fields() {
    return std::make_tuple(std::pair{"lr", &Adagrad::lr}, std::pair{"lr_decay", &Adagrad::lr_decay},
                           std::pair{"weight_decay", &Adagrad::weight_decay},
                           std::pair{"initial_accumulator_value", &Adagrad::initial_accumulator_value},
                           std::pair{"eps", &Adagrad::eps}, std::pair{"maximize", &Adagrad::maximize});
  }
};

using OptimizerConfig = std::variant<Sgd, Adam, AdamW, Adagrad>;

// The configs' wire form. Each config names its hyper-parameters once, in Fields()
// ((name, member) pairs): messages between workers (rpc's records, message.h) and
// parameter-server checkpoints encode a config field by field through that table, so a
// new hyper-parameter travels and persists without another line of code.
//
// ForEachField(config, fn) calls fn(name, field) for each, field a double& or bool&.
template <typename F>
void ForEachField(OptimizerConfig& config, F&& fn) {
  std::visit([&](auto& c) { std::apply([&](auto... f) { (fn(f.first, c.*(f.second)), ...); }, c.Fields()); },
             config);
}
// The default config of the optimizer called `name` (Name()'s spelling), if there is one.
std::optional<OptimizerConfig> DefaultConfig(const std::string& name);

// "SGD", "Adam", "AdamW" or "Adagrad" (PyTorch's class names).
std::string Name(const OptimizerConfig& config);

// The learning rate of any config; SetLearningRate replaces it in place.
double LearningRate(const OptimizerConfig& config);
void SetLearningRate(OptimizerConfig& config, double lr);

// Throws gw::Error (naming the optimizer and the field) when a hyper-parameter is out
// of the range PyTorch accepts: negative lr/momentum/weight_decay/eps/lr_decay/
// initial_accumulator_value, betas outside [0, 1), Nesterov without momentum or with
// dampening.
void Validate(const OptimizerConfig& config);

// Per-parameter state; buffers named as in PyTorch's state_dict ("momentum_buffer",
// "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "sum").
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;
};

// Applies one update in place to `param` (bumping its storage version), under
// NoGradGuard, and advances `state`.
// REQUIRES: grad has param's shape and dtype (checked, gw::Error naming the optimizer
// and both shapes); see the Contract above for the rest.
void Update(const OptimizerConfig& config, const Tensor& param, const Tensor& grad,
            ParamState& state);

// Runs task(0) ... task(n - 1), possibly concurrently, and returns when all are done
// (e.g. rpc::ParallelFor on a worker pool). Empty: run them one after the other.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t)>& task)>;

// Update with the average of several gradients, (grads[0] + ... + grads[k-1]) * (1 / count)
// in param's dtype: bit-identical to forming that average as a tensor and calling Update,
// but in one pass (the average is formed block by block and used while it is in L1; no
// parameter-sized temporary). For a parameter server averaging its trainers' gradients.
// With `parallel`, a large parameter is updated in disjoint ranges through it (the
// elements are independent, so the result is the same bit for bit).
// REQUIRES: k >= 1, count >= 1, every grad of param's shape and dtype (checked, gw::Error).
void UpdateWithAverage(const OptimizerConfig& config, const Tensor& param, const std::vector<Tensor>& grads,
                       int64_t count, ParamState& state, const ParallelFor& parallel = nullptr);

// ---- row-wise (sparse) updates ----
// A sparse table (an embedding held by a parameter server) updates only the rows a
// gradient touches, each with its own state and step count. For SGD and Adagrad this is
// PyTorch's sparse-gradient semantics; for Adam/AdamW each row's bias correction uses its
// own step ("lazy Adam": PyTorch's SparseAdam counts steps per tensor instead).
//
// RowStateSize(config): state floats per parameter element (SGD 0 or 1 with momentum,
// Adam/AdamW 2 or 3 with amsgrad, Adagrad 1).
// UpdateRow: one update of a float32 row of `dim` values in place. `state` holds
// RowStateSize(config) * dim floats, buffer k at state + k * dim in the order momentum_buffer
// | exp_avg, exp_avg_sq, max_exp_avg_sq | sum; `step` is the row's update count, 0 meaning
// fresh (the state is initialised here), and is incremented. Bit-identical to Update() on
// a tensor holding the row with a ParamState of the same step and buffers.
// REQUIRES: Validate(config) passed (not re-checked per row); non-overlapping arrays.
int RowStateSize(const OptimizerConfig& config);
void UpdateRow(const OptimizerConfig& config, int64_t dim, float* param, const float* grad, float* state,
               int64_t& step);

}  // namespace gw::optim

#endif  // GRADWIRE_OPTIM_FUNCTIONAL_H_
