// Loss functions, as functions and as modules, with PyTorch's semantics.
//
// Contract
//   - NllLoss(log_probs, targets, options) is PyTorch's nll_loss: log_probs [N, C] or
//     [N, C, d1, ...] (or [C] with a 0-d target), targets int64 [N] or [N, d1, ...]; the loss
//     of position i is -weight[t_i] * log_probs[i, t_i] (weight all ones when undefined), 0
//     where t_i == ignore_index. Reduction kNone returns the losses [N, d1, ...]; kSum their
//     sum; kMean their sum divided by the sum of weight[t_i] over the positions not
//     ignored (NaN when every position is ignored, as in PyTorch).
//   - CrossEntropyLoss(logits, targets, options) is PyTorch's cross_entropy with class-index
//     targets: NllLoss of log_softmax(logits) over C, with label smoothing e: position i
//     loses (1 - e) * nll_i + e / C * sum_c -weight[c] * log_softmax[i, c] (0 where ignored),
//     reduced as NllLoss reduces (the mean divides both parts by the same weight sum).
//     It is one fused, numerically stable pass (log-sum-exp with the row maximum
//     subtracted); its backward recomputes the softmax from the saved log-sum-exp.
//     CrossEntropyLoss(logits, targets, reduction) is the same with default options.
//   - MseLoss(input, target, reduction) = (input - target)^2, averaged, summed or per element
//     (kNone: input's shape); shapes and dtypes must match. Fused: one pass forward, one
//     backward; gradients flow to both arguments, each computed only when needed.
//   - float32 and float64, contiguous or strided inputs; gradients only for the inputs that
//     need them (NllLoss and CrossEntropyLoss: the input only, as in PyTorch; weight and
//     targets are constants). Errors are gw::Error naming the loss and the shapes: targets
//     outside [0, C) other than ignore_index, shapes or dtypes that do not fit, a weight
//     other than [C] of the input's dtype, label_smoothing outside [0, 1] (or given to
//     NllLoss).
//   - Modules: NllLossModule, CrossEntropyLossModule and MseLossModule are PyTorch's
//     nn.NLLLoss, nn.CrossEntropyLoss and nn.MSELoss (their type_name() and ToString() say
//     so; a weight is the buffer "weight", as in PyTorch's state dict). They are not named
//     NLLLoss/CrossEntropyLoss/MSELoss because the function CrossEntropyLoss exists already
//     under PyTorch's module name and is used throughout; all three take a "Module" suffix.
//   - Thread safety: the functions are pure; the modules hold only their options.
#ifndef GRADWIRE_NN_LOSS_H_
#define GRADWIRE_NN_LOSS_H_

#include <cstdint>

#include "gradwire/nn/module.h"
#include "gradwire/tensor/tensor.h"

namespace gw::nn {

enum class Reduction { kMean, kSum, kNone };

// Options of NllLoss and CrossEntropyLoss, with PyTorch's defaults.
struct ClassLossOptions {
  Tensor weight;                 // [C], the input's dtype; undefined: every class weighs 1
  int64_t ignore_index = -100;   // targets equal to it add nothing, not even to the mean's divisor
  Reduction reduction = Reduction::kMean;
  double label_smoothing = 0.0;  // CrossEntropyLoss only; in [0, 1]
};

Tensor NllLoss(const Tensor& log_probs, const Tensor& targets, const ClassLossOptions& options = {});
Tensor CrossEntropyLoss(const Tensor& logits, const Tensor& targets, Reduction reduction = Reduction::kMean);
Tensor CrossEntropyLoss(const Tensor& logits, const Tensor& targets, const ClassLossOptions& options);
Tensor MseLoss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);

// Fraction of rows whose argmax equals the target (no gradient).
double Accuracy(const Tensor& logits, const Tensor& targets);

// PyTorch's nn.NLLLoss.
class NllLossModule : public Module {
 public:
  explicit NllLossModule(ClassLossOptions options = {});
  Tensor Forward(const Tensor& log_probs, const Tensor& targets);
  using Module::Forward;
  const ClassLossOptions& options() const { return options_; }

 private:
  ClassLossOptions options_;
};

// PyTorch's nn.CrossEntropyLoss (class-index targets).
class CrossEntropyLossModule : public Module {
 public:
  explicit CrossEntropyLossModule(ClassLossOptions options = {});
  Tensor Forward(const Tensor& logits, const Tensor& targets);
  using Module::Forward;
  const ClassLossOptions& options() const { return options_; }

 private:
  ClassLossOptions options_;
};

// PyTorch's nn.MSELoss.
class MseLossModule : public Module {
 public:
  explicit MseLossModule(Reduction reduction = Reduction::kMean);
  Tensor Forward(const Tensor& input, const Tensor& target);
  using Module::Forward;

 private:
  Reduction reduction_;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_LOSS_H_
