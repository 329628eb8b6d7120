#include "gradwire/nn/layers.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/function.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen, bool bias, DType dtype)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  GW_CHECK(in_features > 0 && out_features > 0, "Linear", "features must be positive, got in=",
           in_features, " out=", out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight_ = RegisterParameter(
      "weight", Tensor::Uniform({out_features, in_features}, -bound, bound, gen, dtype));
  if (bias) {
    bias_ = RegisterParameter("bias", Tensor::Uniform({out_features}, -bound, bound, gen, dtype));
  }
}

Tensor Linear::Forward(const Tensor& input) {
  GW_CHECK(input.defined() && input.dim() >= 1 && input.sizes().back() == in_features_, "Linear",
           "expected input [..., ", in_features_, "], got ",
           input.defined() ? ShapeToString(input.sizes()) : "undefined");
  return gw::Linear(input, weight_, bias_);
}

std::string Linear::ExtraRepr() const {
  return absl::StrCat("in_features=", in_features_, ", out_features=", out_features_,
                      ", bias=", bias_.defined() ? "true" : "false");
}

Tensor ReLU::Forward(const Tensor& input) { return gw::Relu(input); }
Tensor Tanh::Forward(const Tensor& input) { return gw::Tanh(input); }
Tensor Sigmoid::Forward(const Tensor& input) { return gw::Sigmoid(input); }

GELU::GELU(GeluApproximate approximate) : Module("GELU"), approximate_(approximate) {}

GELU::GELU(const std::string& approximate)
    : GELU(approximate == "tanh" ? GeluApproximate::kTanh : GeluApproximate::kNone) {
  GW_CHECK(approximate == "none" || approximate == "tanh", "GELU",
           "approximate must be 'none' or 'tanh', got '", approximate, "'");
}

Tensor GELU::Forward(const Tensor& input) { return gw::Gelu(input, approximate_); }

std::string GELU::ExtraRepr() const {
  return absl::StrCat("approximate='", approximate_ == GeluApproximate::kTanh ? "tanh" : "none",
                      "'");
}

Tensor SiLU::Forward(const Tensor& input) { return gw::Silu(input); }

Flatten::Flatten(int64_t start_dim, int64_t end_dim)
    : Module("Flatten"), start_dim_(start_dim), end_dim_(end_dim) {}

Tensor Flatten::Forward(const Tensor& input) {
  GW_CHECK(input.defined(), "Flatten", "called with an undefined tensor");
  const int64_t nd = std::max<int64_t>(input.dim(), 1);
  const int64_t start = start_dim_ < 0 ? start_dim_ + nd : start_dim_;
  const int64_t end = end_dim_ < 0 ? end_dim_ + nd : end_dim_;
  GW_CHECK(0 <= start && start <= end && end < nd, ToString(), "cannot flatten input ",
           ShapeToString(input.sizes()));
  return gw::Flatten(input, start_dim_, end_dim_);
}

std::string Flatten::ExtraRepr() const {
  return absl::StrCat("start_dim=", start_dim_, ", end_dim=", end_dim_);
}

Dropout::Dropout(double p, Generator& gen) : Dropout("Dropout", p, gen) {}

Dropout::Dropout(std::string type_name, double p, Generator& gen)
    : Module(std::move(type_name)), p_(p), gen_(gen.Fork()) {
  GW_CHECK(p >= 0 && p < 1, this->type_name(), "p must be in [0, 1), got ", p);
}

Tensor Dropout::Forward(const Tensor& input) { return gw::Dropout(input, p_, is_training(), gen_); }

std::string Dropout::ExtraRepr() const { return absl::StrCat("p=", p_); }

Dropout2d::Dropout2d(double p, Generator& gen) : Dropout("Dropout2d", p, gen) {}

Tensor Dropout2d::Forward(const Tensor& input) {
  GW_CHECK(input.defined() && (input.dim() == 3 || input.dim() == 4), "Dropout2d",
           "expected input [N, C, H, W] (or [N, C, L]), got ",
           input.defined() ? ShapeToString(input.sizes()) : "undefined");
  return gw::FeatureDropout(input, p_, is_training(), gen_);
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (auto& m : modules) Push(std::move(m));
}

void Sequential::Push(std::shared_ptr<Module> module) {
  RegisterModule(std::to_string(children().size()), std::move(module));
}

Tensor Sequential::Forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [_, m] : children()) x = m->Forward(x);
  return x;
}

std::string Sequential::ToString() const {
  std::string out = "Sequential(\n";
  for (const auto& [name, m] : children()) absl::StrAppend(&out, "  (", name, "): ", m->ToString(), "\n");
  return out + ")";
}

}  // namespace gw::nn
