#include "gradwire/nn/normalization.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/normalization.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {
namespace {

std::string Shown(const Tensor& t) { return t.defined() ? ShapeToString(t.sizes()) : "undefined"; }

// `shape_ok` says whether a defined input has the shape `expected` describes.
void CheckInput(const std::string& module, const Tensor& input, bool shape_ok,
                const std::string& expected, DType dtype) {
  GW_CHECK(input.defined() && shape_ok, module, "expected input ", expected, ", got ",
           Shown(input));
  GW_CHECK(input.dtype() == dtype, module, "expected ", DTypeName(dtype), " input, got ",
           DTypeName(input.dtype()), " ", ShapeToString(input.sizes()));
}

const char* Bool(bool b) { return b ? "true" : "false"; }

}  // namespace

// ---------------------------------------------------------------- batch norm

BatchNormBase::BatchNormBase(std::string type_name, int64_t num_features,
                             const BatchNormOptions& options, std::vector<int64_t> ranks,
                             std::string expected)
    : Module(std::move(type_name)),
      num_features_(num_features),
      options_(options),
      ranks_(std::move(ranks)),
      expected_(std::move(expected)) {
  GW_CHECK(num_features > 0, this->type_name(), "num_features must be positive, got ",
           num_features);
  GW_CHECK(!options.momentum || (*options.momentum >= 0 && *options.momentum <= 1),
           this->type_name(), "momentum must be in [0, 1], got ", *options.momentum);
  if (options.affine) {
    weight_ = RegisterParameter("weight", Tensor::Ones({num_features}, options.dtype));
    bias_ = RegisterParameter("bias", Tensor::Zeros({num_features}, options.dtype));
  }
  if (options.track_running_stats) {
    running_mean_ = RegisterBuffer("running_mean", Tensor::Zeros({num_features}, options.dtype));
    running_var_ = RegisterBuffer("running_var", Tensor::Ones({num_features}, options.dtype));
    num_batches_tracked_ = RegisterBuffer("num_batches_tracked", Tensor::Scalar(0, DType::kInt64));
  }
}

Tensor BatchNormBase::Forward(const Tensor& input) {
  const bool rank_ok = input.defined() &&
                       std::find(ranks_.begin(), ranks_.end(), input.dim()) != ranks_.end();
  CheckInput(absl::StrCat(type_name(), "(", num_features_, ")"), input,
             rank_ok && input.size(1) == num_features_, expected_, options_.dtype);
  const bool tracking = is_training() && options_.track_running_stats;
  double momentum = options_.momentum.value_or(0.0);
  if (tracking && !options_.momentum) {
    momentum = 1.0 / static_cast<double>(num_batches_tracked_.item<int64_t>() + 1);
  }
  // Without running statistics, eval mode normalises with the batch's own too.
  Tensor out = gw::BatchNorm(input, running_mean_, running_var_, weight_, bias_,
                             is_training() || !options_.track_running_stats, momentum,
                             options_.eps);
  if (tracking) kernels::AddInPlace(num_batches_tracked_, Tensor::Scalar(1, DType::kInt64));
  return out;
}

std::string BatchNormBase::ExtraRepr() const {
  return absl::StrCat(num_features_, ", eps=", options_.eps, ", momentum=",
                      options_.momentum ? absl::StrCat(*options_.momentum) : "none",
                      ", affine=", Bool(options_.affine),
                      ", track_running_stats=", Bool(options_.track_running_stats));
}

BatchNorm1d::BatchNorm1d(int64_t num_features, const BatchNormOptions& options)
    : BatchNormBase("BatchNorm1d", num_features, options, {2, 3},
                    absl::StrCat("[N, ", num_features, "] or [N, ", num_features, ", L]")) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, const BatchNormOptions& options)
    : BatchNormBase("BatchNorm2d", num_features, options, {4},
                    absl::StrCat("[N, ", num_features, ", H, W]")) {}

// ---------------------------------------------------------------- layer norm

LayerNorm::LayerNorm(Shape normalized_shape, const LayerNormOptions& options)
    : Module("LayerNorm"), normalized_shape_(std::move(normalized_shape)), options_(options) {
  GW_CHECK(!normalized_shape_.empty() && NumElements(normalized_shape_) > 0, "LayerNorm",
           "normalized_shape must be non-empty with positive sizes, got ",
           ShapeToString(normalized_shape_));
  if (options.elementwise_affine) {
    weight_ = RegisterParameter("weight", Tensor::Ones(normalized_shape_, options.dtype));
    bias_ = RegisterParameter("bias", Tensor::Zeros(normalized_shape_, options.dtype));
  }
}

Tensor LayerNorm::Forward(const Tensor& input) {
  const int64_t nd = static_cast<int64_t>(normalized_shape_.size());
  const bool shape_ok = input.defined() && input.dim() >= nd &&
                        Shape(input.sizes().end() - nd, input.sizes().end()) == normalized_shape_;
  CheckInput(absl::StrCat("LayerNorm(", ShapeToString(normalized_shape_), ")"), input, shape_ok,
             absl::StrCat("[*, ", ShapeToString(normalized_shape_).substr(1)), options_.dtype);
  return gw::LayerNorm(input, normalized_shape_, weight_, bias_, options_.eps);
}

std::string LayerNorm::ExtraRepr() const {
  return absl::StrCat(ShapeToString(normalized_shape_), ", eps=", options_.eps,
                      ", elementwise_affine=", Bool(options_.elementwise_affine));
}

// ---------------------------------------------------------------- group norm

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, const GroupNormOptions& options)
    : Module("GroupNorm"), num_groups_(num_groups), num_channels_(num_channels), options_(options) {
  GW_CHECK(num_groups > 0 && num_channels > 0 && num_channels % num_groups == 0, "GroupNorm",
           "num_channels=", num_channels, " must be a positive multiple of num_groups=",
           num_groups);
  if (options.affine) {
    weight_ = RegisterParameter("weight", Tensor::Ones({num_channels}, options.dtype));
    bias_ = RegisterParameter("bias", Tensor::Zeros({num_channels}, options.dtype));
  }
}

Tensor GroupNorm::Forward(const Tensor& input) {
  CheckInput(absl::StrCat("GroupNorm(", num_groups_, ", ", num_channels_, ")"), input,
             input.defined() && input.dim() >= 2 && input.size(1) == num_channels_,
             absl::StrCat("[N, ", num_channels_, ", *]"), options_.dtype);
  return gw::GroupNorm(input, num_groups_, weight_, bias_, options_.eps);
}

std::string GroupNorm::ExtraRepr() const {
  return absl::StrCat(num_groups_, ", ", num_channels_, ", eps=", options_.eps,
                      ", affine=", Bool(options_.affine));
}

}  // namespace gw::nn
