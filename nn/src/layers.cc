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

Dropout::Dropout(double p, Generator& gen) : Module("Dropout"), p_(p), gen_(gen.Fork()) {
  GW_CHECK(p >= 0 && p < 1, "Dropout", "p must be in [0, 1), got ", p);
}

Tensor Dropout::Forward(const Tensor& input) {
  if (!is_training() || p_ == 0) return input;
  // mask[i] = 1/(1-p) with probability 1-p, else 0.
  Tensor mask = Tensor::Empty(input.sizes(), input.dtype());
  const double scale = 1.0 / (1.0 - p_);
  Tensor u = Tensor::Rand(input.sizes(), gen_, DType::kFloat64);
  const double* pu = u.data<double>();
  if (input.dtype() == DType::kFloat32) {
    float* pm = mask.data<float>();
    for (int64_t i = 0; i < mask.numel(); ++i) pm[i] = pu[i] < p_ ? 0.f : static_cast<float>(scale);
  } else {
    double* pm = mask.data<double>();
    for (int64_t i = 0; i < mask.numel(); ++i) pm[i] = pu[i] < p_ ? 0.0 : scale;
  }
  return gw::Mul(input, mask);
}

std::string Dropout::ExtraRepr() const { return absl::StrCat("p=", p_); }

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
