// Normalization kernels (gw::kernels, no autograd): batch, layer and group normalization,
// forward and backward.
//
// Contract
//   - Each op normalises the elements a statistic covers to (x - mean) / sqrt(var + eps),
//     var being the biased variance, then applies the optional affine weight * x_hat + bias
//     (weight and bias may each be undefined):
//       BatchNorm  x [N, C, *]: one statistic per channel, over N and *; weight, bias [C].
//       LayerNorm  x [..., D1..Dk]: one statistic per leading index, over the trailing k =
//                  normalized_ndim dims; weight, bias [D1..Dk].
//       GroupNorm  x [N, C, *]: one statistic per (sample, group of C / num_groups
//                  channels); weight, bias [C].
//   - *Forward returns the output and the statistics (mean and biased variance, float64
//     or float32 like x, contiguous): [C] for BatchNorm, [N * num_groups] for GroupNorm,
//     [D0 * ... * Dn-k-1] for LayerNorm. BatchNormInference normalises with given
//     statistics (a BatchNorm's running statistics in eval mode).
//   - *Backward takes the forward's input and statistics and returns only the gradients
//     `mask` asks for (the others undefined). BatchNormBackward's `batch_stats` says the
//     statistics were x's own (training: their gradient flows back to x) rather than
//     fixed ones (eval).
//   - float32 BatchNorm and LayerNorm run on oneDNN's primitives, whose descriptors are
//     cached per shape; float64, GroupNorm in both dtypes, and parameter-only gradients run
//     gradwire's own kernel (statistics accumulated in double, in two passes).
//   - Any strides are accepted; a non-contiguous input or gradient is copied once.
//     Results are contiguous.
//   - Errors: gw::Error naming the op and the shapes (wrong rank, channel counts, weight
//     or statistic shapes, dtype mismatches, a group count that does not divide C).
//   - Thread safety: all functions may be called concurrently.
#ifndef GRADWIRE_TENSOR_NORMALIZATION_H_
#define GRADWIRE_TENSOR_NORMALIZATION_H_

#include <cstdint>

#include "gradwire/tensor/tensor.h"

namespace gw::kernels {

struct NormResult {
  Tensor out;
  Tensor mean;
  Tensor var;  // biased
};

struct NormGrads {
  Tensor input, weight, bias;
};

// Which gradients a backward computes.
struct NormGradMask {
  bool input = true;
  bool weight = true;
  bool bias = true;
};

NormResult BatchNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
Tensor BatchNormInference(const Tensor& x, const Tensor& mean, const Tensor& var,
                          const Tensor& weight, const Tensor& bias, double eps);
NormGrads BatchNormBackward(const Tensor& grad, const Tensor& x, const Tensor& mean,
                            const Tensor& var, const Tensor& weight, double eps, bool batch_stats,
                            NormGradMask mask = {});

NormResult LayerNormForward(const Tensor& x, int64_t normalized_ndim, const Tensor& weight,
                            const Tensor& bias, double eps);
NormGrads LayerNormBackward(const Tensor& grad, const Tensor& x, const Tensor& mean,
                            const Tensor& var, const Tensor& weight, int64_t normalized_ndim,
                            double eps, NormGradMask mask = {});

NormResult GroupNormForward(const Tensor& x, int64_t num_groups, const Tensor& weight,
                            const Tensor& bias, double eps);
NormGrads GroupNormBackward(const Tensor& grad, const Tensor& x, const Tensor& mean,
                            const Tensor& var, const Tensor& weight, int64_t num_groups,
                            double eps, NormGradMask mask = {});

}  // namespace gw::kernels

#endif  // GRADWIRE_TENSOR_NORMALIZATION_H_
