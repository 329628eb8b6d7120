#include "gradwire/nn/loss.h"

#include "gradwire/autograd/function.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/kernels.h"

namespace gw::nn {

Tensor CrossEntropyLoss(const Tensor& logits, const Tensor& targets, Reduction reduction) {
  GW_CHECK(logits.defined() && targets.defined() && logits.dim() == 2 && targets.dim() == 1 &&
               targets.size(0) == logits.size(0),
           "CrossEntropyLoss", "expected logits [N, C] and targets [N], got ",
           logits.defined() ? ShapeToString(logits.sizes()) : "undefined", " and ",
           targets.defined() ? ShapeToString(targets.sizes()) : "undefined");
  GW_CHECK(targets.dtype() == DType::kInt64, "CrossEntropyLoss",
           "targets must be int64 class indices, got ", DTypeName(targets.dtype()));
  const int64_t n = logits.size(0), c = logits.size(1);
  const Tensor t = kernels::Contiguous(targets);
  const int64_t* pt = t.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    GW_CHECK(pt[i] >= 0 && pt[i] < c, "CrossEntropyLoss", "target ", pt[i], " at position ", i,
             " is out of range for ", c, " classes (logits ", ShapeToString(logits.sizes()), ")");
  }
  const Tensor lsm = kernels::LogSoftmax(logits, 1);
  const double scale = reduction == Reduction::kMean ? 1.0 / static_cast<double>(n) : 1.0;
  double total = 0;
  if (lsm.dtype() == DType::kFloat32) {
    const float* p = lsm.data<float>();
    for (int64_t i = 0; i < n; ++i) total -= p[i * c + pt[i]];
  } else {
    const double* p = lsm.data<double>();
    for (int64_t i = 0; i < n; ++i) total -= p[i * c + pt[i]];
  }
  Tensor loss = Tensor::Scalar(total * scale, logits.dtype());
  return autograd::Record(
      "CrossEntropyBackward", {logits}, loss,
      [lsm, saved_targets = autograd::SavedTensor(t), scale, n, c](const Tensor& g) -> std::vector<Tensor> {
        const Tensor& t = saved_targets.Get("CrossEntropyBackward");
        // d/dlogits = (softmax - onehot) * g * scale
        Tensor grad = kernels::Exp(lsm);
        const double gs = g.item() * scale;
        const int64_t* pt = t.data<int64_t>();
        auto finish = [&]<typename T>() {
          T* p = grad.data<T>();
          for (int64_t i = 0; i < n; ++i) p[i * c + pt[i]] -= T{1};
          for (int64_t i = 0; i < n * c; ++i) p[i] *= static_cast<T>(gs);
        };
        if (grad.dtype() == DType::kFloat32) {
          finish.operator()<float>();
        } else {
          finish.operator()<double>();
        }
        return {grad};
      });
}

Tensor MseLoss(const Tensor& input, const Tensor& target, Reduction reduction) {
  GW_CHECK(input.defined() && target.defined() && input.sizes() == target.sizes(), "MseLoss",
           "input ", input.defined() ? ShapeToString(input.sizes()) : "undefined",
           " and target ", target.defined() ? ShapeToString(target.sizes()) : "undefined",
           " must have the same shape");
  Tensor diff = gw::Sub(input, target);
  Tensor sq = gw::Mul(diff, diff);
  return reduction == Reduction::kMean ? gw::Mean(sq) : gw::Sum(sq);
}

double Accuracy(const Tensor& logits, const Tensor& targets) {
  GW_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
           "Accuracy", "expected logits [N, C] and targets [N], got ",
           ShapeToString(logits.sizes()), " and ", ShapeToString(targets.sizes()));
  if (logits.size(0) == 0) return 0.0;
  Tensor hits = kernels::Eq(kernels::Argmax(logits, 1), targets);
  return kernels::Sum(kernels::ToDType(hits, DType::kFloat64)).item() /
         static_cast<double>(logits.size(0));
}

}  // namespace gw::nn
