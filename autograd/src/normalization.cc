// Differentiable batch, layer and group normalization over gradwire/tensor/normalization.h.
#include "gradwire/autograd/normalization.h"

#include <string>
#include <utility>

#include "gradwire/autograd/function.h"
#include "gradwire/tensor/kernels.h"
#include "gradwire/tensor/normalization.h"

namespace gw {
namespace {

using autograd::SavedTensor;
namespace k = kernels;

bool Needs(const Tensor& t) { return t.defined() && t.requires_grad(); }

// What every normalization's backward reads: the input, its statistics and the weight.
struct Saved {
  Saved(const Tensor& input, const Tensor& mean, const Tensor& var, const Tensor& weight)
      : input(input), mean(mean), var(var), weight(weight) {}
  SavedTensor input, mean, var, weight;
};

// Records `grads(g, saved, mask) -> NormGrads` as the backward of `out` with respect to
// input, weight and bias; `mask` asks only for the gradients some input needs.
template <typename Grads>
Tensor RecordNorm(const char* name, const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Tensor& mean, const Tensor& var, Tensor out, Grads grads) {
  if (!autograd::AnyRequiresGrad({input, weight, bias})) return out;
  const k::NormGradMask mask{Needs(input), Needs(weight), Needs(bias)};
  return autograd::Record(
      name, {input, weight, bias}, std::move(out),
      [name, mask, saved = Saved(input, mean, var, weight),
       grads = std::move(grads)](const Tensor& g) -> std::vector<Tensor> {
        k::NormGrads r = grads(g, saved.input.Get(name), saved.mean.Get(name),
                               saved.var.Get(name), saved.weight.Get(name), mask);
        return {std::move(r.input), std::move(r.weight), std::move(r.bias)};
      });
}

// running = (1 - momentum) * running + momentum * scale * batch, in place.
void UpdateRunning(const Tensor& running, const Tensor& batch, double momentum, double scale) {
  k::ScaleInPlace(running, 1.0 - momentum);
  k::AddInPlace(running, batch, momentum * scale);
}

}  // namespace

Tensor BatchNorm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                 const Tensor& weight, const Tensor& bias, bool training, double momentum,
                 double eps) {
  constexpr const char* op = "BatchNorm";
  GW_CHECK(input.defined() && input.dim() >= 2, op, "expected input [N, C, *], got ",
           input.defined() ? ShapeToString(input.sizes()) : "undefined");
  GW_CHECK(running_mean.defined() == running_var.defined(), op,
           "running_mean and running_var must be given together");
  const int64_t channels = input.size(1);
  Tensor out, mean, var;
  if (training) {
    const int64_t per_channel = channels == 0 ? 0 : input.numel() / channels;
    GW_CHECK(per_channel > 1, op, "expected more than 1 value per channel when training, got input ",
             ShapeToString(input.sizes()));
    k::NormResult r = k::BatchNormForward(input, weight, bias, eps);
    if (running_mean.defined()) {
      for (const Tensor* t : {&running_mean, &running_var}) {
        GW_CHECK(t->sizes() == Shape{channels} && t->dtype() == input.dtype(), op,
                 "running statistics must be ", DTypeName(input.dtype()), " [", channels,
                 "] for input ", ShapeToString(input.sizes()), ", got ", DTypeName(t->dtype()),
                 " ", ShapeToString(t->sizes()));
      }
      const double n = static_cast<double>(per_channel);
      UpdateRunning(running_mean, r.mean, momentum, 1.0);
      UpdateRunning(running_var, r.var, momentum, n / (n - 1));  // unbiased
    }
    out = std::move(r.out);
    mean = std::move(r.mean);
    var = std::move(r.var);
  } else {
    GW_CHECK(running_mean.defined(), op,
             "running_mean and running_var are required when not training");
    out = k::BatchNormInference(input, running_mean, running_var, weight, bias, eps);
    mean = running_mean;
    var = running_var;
  }
  return RecordNorm("BatchNormBackward", input, weight, bias, mean, var, std::move(out),
                    [eps, training](const Tensor& g, const Tensor& x, const Tensor& m,
                                    const Tensor& v, const Tensor& w, k::NormGradMask mask) {
                      return k::BatchNormBackward(g, x, m, v, w, eps, training, mask);
                    });
}

Tensor LayerNorm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight,
                 const Tensor& bias, double eps) {
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  const bool matches = input.defined() && nd >= 1 && input.dim() >= nd &&
                       Shape(input.sizes().end() - nd, input.sizes().end()) == normalized_shape;
  GW_CHECK(matches, "LayerNorm", "given normalized_shape=", ShapeToString(normalized_shape),
           ", expected input [*, ", ShapeToString(normalized_shape).substr(1), ", got ",
           input.defined() ? ShapeToString(input.sizes()) : "undefined");
  k::NormResult r = k::LayerNormForward(input, nd, weight, bias, eps);
  return RecordNorm("LayerNormBackward", input, weight, bias, r.mean, r.var, std::move(r.out),
                    [eps, nd](const Tensor& g, const Tensor& x, const Tensor& m, const Tensor& v,
                              const Tensor& w, k::NormGradMask mask) {
                      return k::LayerNormBackward(g, x, m, v, w, nd, eps, mask);
                    });
}

Tensor GroupNorm(const Tensor& input, int64_t num_groups, const Tensor& weight,
                 const Tensor& bias, double eps) {
  k::NormResult r = k::GroupNormForward(input, num_groups, weight, bias, eps);
  return RecordNorm("GroupNormBackward", input, weight, bias, r.mean, r.var, std::move(r.out),
                    [eps, num_groups](const Tensor& g, const Tensor& x, const Tensor& m,
                                      const Tensor& v, const Tensor& w, k::NormGradMask mask) {
                      return k::GroupNormBackward(g, x, m, v, w, num_groups, eps, mask);
                    });
}

}  // namespace gw
