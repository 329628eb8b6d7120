// Normalization layers: BatchNorm1d, BatchNorm2d, LayerNorm and GroupNorm, with PyTorch's
// arguments, defaults, initialisation and state-dict keys.
//
// Contract
//   - BatchNorm1d(C) takes [N, C] or [N, C, L], BatchNorm2d(C) takes [N, C, H, W]. In
//     training mode (Module::Train) they normalise with the batch's statistics and, with
//     track_running_stats, update running_mean and running_var (the unbiased variance)
//     by `momentum`, or by the cumulative average 1 / num_batches_tracked when momentum is
//     nullopt; num_batches_tracked counts training calls. In eval mode they normalise with
//     the running statistics (the batch's own without track_running_stats).
//     Parameters: weight (ones) and bias (zeros) [C] when affine. Buffers when
//     track_running_stats: running_mean (zeros), running_var (ones) [C] and
//     num_batches_tracked (int64 scalar, 0).
//   - LayerNorm(normalized_shape) normalises over the trailing dims; parameters weight
//     (ones) and bias (zeros) shaped normalized_shape when elementwise_affine.
//   - GroupNorm(num_groups, num_channels) takes [N, C, *] and normalises each sample's
//     groups of C / num_groups channels; parameters weight (ones), bias (zeros) [C] when
//     affine. The mode does not matter to LayerNorm and GroupNorm.
//   - Errors: gw::Error naming the module, e.g. "BatchNorm2d(64): expected input
//     [N, 64, H, W], got [8, 32, 5, 5]"; a dtype other than the module's is an error too.
//   - Thread safety: Forward in training mode updates the buffers; concurrent calls need
//     external synchronisation (eval mode and LayerNorm/GroupNorm are safe).
#ifndef GRADWIRE_NN_NORMALIZATION_H_
#define GRADWIRE_NN_NORMALIZATION_H_

#include <optional>
#include <string>
#include <vector>

#include "gradwire/nn/module.h"

namespace gw::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: cumulative moving average
  bool affine = true;
  bool track_running_stats = true;
  DType dtype = DType::kFloat32;
};

// What BatchNorm1d and BatchNorm2d share; they differ in the input ranks they take.
class BatchNormBase : public Module {
 public:
  Tensor Forward(const Tensor& input) override;

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }
  const Tensor& num_batches_tracked() const { return num_batches_tracked_; }

 protected:
  // `ranks`: the input ranks taken; `expected`: their shapes for messages, with C for the
  // channel count ("[N, C, H, W]").
  BatchNormBase(std::string type_name, int64_t num_features, const BatchNormOptions& options,
                std::vector<int64_t> ranks, std::string expected);
  std::string ExtraRepr() const override;

 private:
  int64_t num_features_;
  BatchNormOptions options_;
  std::vector<int64_t> ranks_;
  std::string expected_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};

class BatchNorm1d final : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, const BatchNormOptions& options = {});
};

class BatchNorm2d final : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, const BatchNormOptions& options = {});
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;
  DType dtype = DType::kFloat32;
};

class LayerNorm final : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, const LayerNormOptions& options = {});
  Tensor Forward(const Tensor& input) override;

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 protected:
  std::string ExtraRepr() const override;

 private:
  Shape normalized_shape_;
  LayerNormOptions options_;
  Tensor weight_, bias_;
};

struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;
  DType dtype = DType::kFloat32;
};

class GroupNorm final : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, const GroupNormOptions& options = {});
  Tensor Forward(const Tensor& input) override;

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 protected:
  std::string ExtraRepr() const override;

 private:
  int64_t num_groups_, num_channels_;
  GroupNormOptions options_;
  Tensor weight_, bias_;
};

}  // namespace gw::nn

#endif  // GRADWIRE_NN_NORMALIZATION_H_
