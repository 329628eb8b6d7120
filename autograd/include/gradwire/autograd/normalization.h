// Differentiable normalization: PyTorch's torch.nn.functional.batch_norm, layer_norm and
// group_norm, on the kernels of gradwire/tensor/normalization.h.
//
// Contract
//   - BatchNorm(input [N, C, *], ...): with `training`, normalises with the batch's own
//     statistics (biased variance) and, when running_mean and running_var are given,
//     updates them in place: running = (1 - momentum) * running + momentum * batch, with
//     the unbiased batch variance for running_var. Without `training` it normalises with
//     running_mean and running_var, which are then required.
//   - LayerNorm(input [..., *normalized_shape], normalized_shape, ...) normalises over the
//     trailing dims; weight and bias are shaped normalized_shape.
//   - GroupNorm(input [N, C, *], num_groups, ...) normalises each sample's groups of
//     C / num_groups channels; weight and bias are [C].
//   - weight and bias may be undefined (no affine). Gradients flow to input, weight and
//     bias; the backward computes only those some input needs (no double backward).
//     Saved tensors, running statistics included, are checked for in-place changes.
//   - Errors: gw::Error naming the op and the shapes, e.g. "BatchNorm: expected more than
//     1 value per channel when training, got input [1, 4]".
//   - Thread safety: as the kernels; concurrent training calls sharing running statistics
//     need external synchronisation.
#ifndef GRADWIRE_AUTOGRAD_NORMALIZATION_H_
#define GRADWIRE_AUTOGRAD_NORMALIZATION_H_

#include <cstdint>

#include "gradwire/tensor/tensor.h"

namespace gw {

Tensor BatchNorm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                 const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                 double eps = 1e-5);

Tensor LayerNorm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {},
                 const Tensor& bias = {}, double eps = 1e-5);

Tensor GroupNorm(const Tensor& input, int64_t num_groups, const Tensor& weight = {},
                 const Tensor& bias = {}, double eps = 1e-5);

}  // namespace gw

#endif  // GRADWIRE_AUTOGRAD_NORMALIZATION_H_
