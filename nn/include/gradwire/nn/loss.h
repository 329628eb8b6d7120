// Loss functions.
//
// Contract
//   - CrossEntropyLoss(logits [N, C], targets int64 [N]) = mean (or sum) over the batch of
//     -log_softmax(logits)[i, targets[i]], computed in one fused, numerically stable
//     pass; its backward is (softmax - onehot) / N.
//   - MseLoss(input, target) = mean (or sum) of (input - target)^2; shapes must match.
//   - Targets outside [0, C) and shape mismatches are gw::Error naming the loss and shapes.
#ifndef GRADWIRE_NN_LOSS_H_
#define GRADWIRE_NN_LOSS_H_

#include "gradwire/tensor/tensor.h"

namespace gw::nn {

enum class Reduction { kMean, kSum };

Tensor CrossEntropyLoss(const Tensor& logits, const Tensor& targets,
                        Reduction reduction = Reduction::kMean);
Tensor MseLoss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);

// Fraction of rows whose argmax equals the target (no gradient).
double Accuracy(const Tensor& logits, const Tensor& targets);

}  // namespace gw::nn

#endif  // GRADWIRE_NN_LOSS_H_
