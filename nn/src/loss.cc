// Losses: NllLoss and CrossEntropyLoss share one checked view of the problem ([N, C, S]) and
// one fused kernel, templated over the element type, for their forward and backward.
#include "gradwire/nn/loss.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "absl/strings/str_cat.h"

#include "gradwire/autograd/function.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/kernels.h"
#include "gradwire/tensor/vector_math.h"

namespace gw::nn {
namespace {

using autograd::Record;
using autograd::SavedTensor;
namespace k = kernels;

bool Needs(const Tensor& t) { return t.defined() && t.requires_grad(); }

std::string Describe(const Tensor& t) {
  return t.defined() ? absl::StrCat(DTypeName(t.dtype()), ShapeToString(t.sizes())) : "undefined";
}

// Calls fn.operator()<T>() for a float32 or float64 dtype.
template <typename Fn>
decltype(auto) DispatchFloat(DType dtype, Fn&& fn) {
  return dtype == DType::kFloat32 ? fn.template operator()<float>() : fn.template operator()<double>();
}

// ---------------------------------------------------------------- float32 rows

using vector_math::Exp;

// Reductions in kLanes independent partial results, which the compiler vectorises (one
// accumulator would need reassociation, which it may not do to floats).
constexpr int64_t kLanes = 16;

GW_VECTOR_CLONES float MaxFloat(const float* x, int64_t n) {
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = std::max(lanes[j], x[i + j]);
  }
  for (; i < n; ++i) lanes[0] = std::max(lanes[0], x[i]);
  return *std::max_element(lanes, lanes + kLanes);
}

// sum_i exp(x[i] - shift)
GW_VECTOR_CLONES float SumExp(const float* x, int64_t n, float shift) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += Exp(x[i + j] - shift);
  }
  for (; i < n; ++i) lanes[0] += Exp(x[i] - shift);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

// sum_i x[i] * (w ? w[i] : 1)
GW_VECTOR_CLONES float WeightedSumFloat(const float* x, const float* w, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  if (w == nullptr) {
    for (; i + kLanes <= n; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) lanes[j] += x[i + j];
    }
  } else {
    for (; i + kLanes <= n; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) lanes[j] += x[i + j] * w[i + j];
    }
  }
  for (; i < n; ++i) lanes[0] += x[i] * (w != nullptr ? w[i] : 1.0f);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

// out[i] = factor * exp(x[i] - shift) - (w ? bias * w[i] : 0)
GW_VECTOR_CLONES void ScaledExp(const float* x, int64_t n, float shift, float factor, const float* w, float bias,
                                     float* out) {
  if (w == nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = factor * Exp(x[i] - shift) - bias;
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = factor * Exp(x[i] - shift) - bias * w[i];
  }
}

// ---------------------------------------------------------------- NLL and cross-entropy

// A classification loss's arguments, checked, with the input seen as [N, C, S] (S: the
// product of the sizes after C, 1 for [N, C]).
struct ClassProblem {
  Tensor x;          // [N, C, S]: a view of the input (a copy when its strides allow none)
  Tensor targets;    // int64 [N * S], contiguous
  Tensor weight;     // [C] contiguous, the input's dtype; or undefined
  Shape loss_sizes;  // kNone's result: the input's shape without C
  int64_t n, c, s;
};

ClassProblem CheckClassProblem(const char* op, const Tensor& input, const Tensor& targets,
                               const ClassLossOptions& o) {
  GW_CHECK(input.defined() && targets.defined(), op, "input and targets must be defined, got ", Describe(input),
           " and ", Describe(targets));
  GW_CHECK(IsFloating(input.dtype()), op, "input must be float32 or float64, got ", Describe(input));
  GW_CHECK(targets.dtype() == DType::kInt64, op, "targets must be int64 class indices, got ", Describe(targets));
  ClassProblem p;
  const bool unbatched = input.dim() == 1;
  if (unbatched) {
    p.loss_sizes = {};
  } else {
    p.loss_sizes = input.sizes();
    if (input.dim() >= 2) p.loss_sizes.erase(p.loss_sizes.begin() + 1);
  }
  GW_CHECK(input.dim() >= 1 && targets.sizes() == p.loss_sizes, op,
           "expected input [N, C] or [N, C, d1, ...] and targets [N] or [N, d1, ...] (or input [C] and a 0-d "
           "target), got ",
           ShapeToString(input.sizes()), " and ", ShapeToString(targets.sizes()));
  p.n = unbatched ? 1 : input.size(0);
  p.c = unbatched ? input.size(0) : input.size(1);
  p.s = unbatched ? 1 : input.numel() / std::max<int64_t>(p.n * p.c, 1);
  if (p.n * p.c == 0) p.s = NumElements(p.loss_sizes) / std::max<int64_t>(p.n, 1);
  p.x = k::Reshape(input, {p.n, p.c, p.s});
  p.targets = k::Contiguous(k::Reshape(targets, {p.n * p.s}));
  if (o.weight.defined()) {
    GW_CHECK(o.weight.dim() == 1 && o.weight.size(0) == p.c && o.weight.dtype() == input.dtype(), op,
             "weight must be ", DTypeName(input.dtype()), "[", p.c, "] (one per class of input ",
             ShapeToString(input.sizes()), "), got ", Describe(o.weight));
    p.weight = k::Contiguous(o.weight.detach());
  }
  const int64_t* t = p.targets.data<int64_t>();
  for (int64_t i = 0; i < p.n * p.s; ++i) {
    GW_CHECK(t[i] == o.ignore_index || (t[i] >= 0 && t[i] < p.c), op, "target ", t[i], " at position ", i,
             " is out of range for ", p.c, " classes (input ", ShapeToString(input.sizes()), ", ignore_index ",
             o.ignore_index, ")");
  }
  return p;
}

// The fused kernel of both losses. With `softmax` (cross-entropy) the input holds logits and
// each position's log-sum-exp is computed (and kept for the backward); without, it holds
// log-probabilities.
template <typename T>
class ClassLossKernel {
 public:
  ClassLossKernel(const ClassProblem& p, const ClassLossOptions& o, bool softmax)
      : p_(p),
        x_(p.x.data<T>()),
        t_(p.targets.data<int64_t>()),
        w_(p.weight.defined() ? p.weight.data<T>() : nullptr),
        sn_(p.x.stride(0)),
        sc_(p.x.stride(1)),
        ss_(p.x.stride(2)),
        ignore_(o.ignore_index),
        softmax_(softmax),
        eps_(static_cast<T>(o.label_smoothing)) {
    weight_sum_ = static_cast<T>(p.c);
    if (w_ != nullptr) {
      weight_sum_ = 0;
      for (int64_t c = 0; c < p.c; ++c) weight_sum_ += w_[c];
    }
  }

  // Writes each position's loss (0 where ignored) and, with softmax, its log-sum-exp; returns
  // the sum of the weights of the targets not ignored (the mean's divisor).
  double Forward(T* losses, T* lse) const {
    double divisor = 0;
    for (int64_t i = 0; i < p_.n * p_.s; ++i) {
      const int64_t t = t_[i];
      if (t == ignore_) {
        losses[i] = 0;
        if (softmax_) lse[i] = 0;
        continue;
      }
      const T* row = Row(i);
      const T wt = Weight(t);
      divisor += wt;
      if (!softmax_) {
        losses[i] = -wt * row[t * sc_];
        continue;
      }
      const T l = LogSumExp(row);
      lse[i] = l;
      T loss = -wt * (row[t * sc_] - l);
      if (eps_ != 0) {
        // -sum_c w_c (x_c - l) = l * sum_c w_c - sum_c w_c x_c
        T wx = 0;
        if constexpr (std::is_same_v<T, float>) {
          if (sc_ == 1) wx = WeightedSumFloat(row, w_, p_.c);
        }
        if (sc_ != 1 || !std::is_same_v<T, float>) {
          for (int64_t c = 0; c < p_.c; ++c) wx += Weight(c) * row[c * sc_];
        }
        loss = (1 - eps_) * loss + eps_ / static_cast<T>(p_.c) * (l * weight_sum_ - wx);
      }
      losses[i] = loss;
    }
    return divisor;
  }

  // d loss / d input as a contiguous [N, C, S], given position i's incoming gradient
  // g[i * g_step] times `scale`.
  void Backward(const T* lse, const T* g, int64_t g_step, T scale, T* out) const {
    const int64_t cs = p_.c * p_.s;
    for (int64_t i = 0; i < p_.n * p_.s; ++i) {
      T* o = out + (i / p_.s) * cs + i % p_.s;  // class c at o[c * S]
      const int64_t t = t_[i];
      if (t == ignore_) {
        for (int64_t c = 0; c < p_.c; ++c) o[c * p_.s] = 0;
        continue;
      }
      const T gi = g[i * g_step] * scale;
      const T wt = Weight(t);
      if (!softmax_) {
        for (int64_t c = 0; c < p_.c; ++c) o[c * p_.s] = 0;
        o[t * p_.s] = -wt * gi;
        continue;
      }
      // (1 - e) w_t (p_c - [c == t]) + e / C (p_c sum_k w_k - w_c), p_c = exp(x_c - lse)
      const T* row = Row(i);
      const T l = lse[i];
      const T a = gi * (1 - eps_) * wt;
      if constexpr (std::is_same_v<T, float>) {
        if (sc_ == 1 && p_.s == 1) {
          const float b = eps_ == 0 ? 0.0f : gi * eps_ / static_cast<float>(p_.c);
          ScaledExp(row, p_.c, l, a + b * weight_sum_, w_, b, o);
          o[t] -= a;
          continue;
        }
      }
      if (eps_ == 0 && w_ == nullptr) {
        for (int64_t c = 0; c < p_.c; ++c) o[c * p_.s] = a * std::exp(row[c * sc_] - l);
      } else {
        const T b = gi * eps_ / static_cast<T>(p_.c);
        const T p_factor = a + b * weight_sum_;
        for (int64_t c = 0; c < p_.c; ++c) o[c * p_.s] = p_factor * std::exp(row[c * sc_] - l) - b * Weight(c);
      }
      o[t * p_.s] -= a;
    }
  }

 private:
  const T* Row(int64_t i) const { return x_ + (i / p_.s) * sn_ + (i % p_.s) * ss_; }
  T Weight(int64_t c) const { return w_ != nullptr ? w_[c] : T{1}; }

  T LogSumExp(const T* row) const {
    if constexpr (std::is_same_v<T, float>) {
      if (sc_ == 1) {
        const float m = MaxFloat(row, p_.c);
        return std::isinf(m) ? m : m + std::log(SumExp(row, p_.c, m));
      }
    }
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t c = 0; c < p_.c; ++c) m = std::max(m, row[c * sc_]);
    if (std::isinf(m)) return m;  // all -inf (or +inf): as log_softmax, without inf - inf
    T sum = 0;
    for (int64_t c = 0; c < p_.c; ++c) sum += std::exp(row[c * sc_] - m);
    return m + std::log(sum);
  }

  const ClassProblem& p_;
  const T* x_;
  const int64_t* t_;
  const T* w_;
  int64_t sn_, sc_, ss_, ignore_;
  bool softmax_;
  T eps_;
  T weight_sum_;
};

// On a GPU: composed of its kernels (autograd records them): log-softmax, a one-hot mask
// of the targets, a row sum. [N, C] input and [N] targets; class weights and label
// smoothing run on the CPU so far. The targets are checked on the host first (N values), so
// a bad one is an error naming it, never a silent zero.
Tensor ClassLossOnDevice(const char* op, bool softmax, const Tensor& input, const Tensor& targets,
                         const ClassLossOptions& o) {
  GW_CHECK(input.defined() && targets.defined() && input.device() == targets.device(), op, "input ", Describe(input),
           " on ", input.defined() ? input.device().ToString() : "-", " and targets ", Describe(targets), " on ",
           targets.defined() ? targets.device().ToString() : "-", ": put them on one device");
  GW_CHECK(input.dim() == 2 && IsFloating(input.dtype()) && targets.dim() == 1 && targets.dtype() == DType::kInt64 &&
               targets.size(0) == input.size(0),
           op, "on a GPU expects input [N, C] (float32 or float64) and targets [N] (int64), got ", Describe(input),
           " and ", Describe(targets));
  GW_CHECK(!o.weight.defined() && o.label_smoothing == 0, op,
           "class weights and label smoothing run on the CPU so far (move the input and targets there)");
  const int64_t c = input.size(1);
  const std::vector<int64_t> host = targets.ToVector<int64_t>();
  int64_t counted = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] == o.ignore_index) continue;
    GW_CHECK(host[i] >= 0 && host[i] < c, op, "target ", host[i], " at position ", i, " is not a class in [0, ", c,
             ")");
    ++counted;
  }
  const Device device = input.device();
  const Tensor classes = k::Reshape(k::ToDevice(Tensor::Arange(0, static_cast<double>(c)), device), {1, c});
  Tensor onehot = k::ToDType(k::Eq(classes, k::Unsqueeze(targets, 1)), input.dtype());
  if (o.ignore_index >= 0 && o.ignore_index < c) {  // rows of the ignored class count nothing
    const Tensor ignored = k::ToDType(
        k::Eq(targets, Tensor::Full({}, static_cast<double>(o.ignore_index), DType::kInt64, device)), input.dtype());
    onehot = k::Mul(onehot, k::Unsqueeze(k::AddScalar(k::MulScalar(ignored, -1), 1), 1));
  }
  const Tensor log_probs = softmax ? LogSoftmax(input, 1) : input;
  const Tensor per_row = Neg(Sum(Mul(log_probs, onehot), {1}));
  switch (o.reduction) {
    case Reduction::kNone:
      return per_row;
    case Reduction::kSum:
      return Sum(per_row);
    case Reduction::kMean:
      break;
  }
  return MulScalar(Sum(per_row), 1.0 / static_cast<double>(counted));
}

Tensor ClassLoss(const char* op, const char* backward_name, bool softmax, const Tensor& input,
                 const Tensor& targets, const ClassLossOptions& o) {
  GW_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1 && (softmax || o.label_smoothing == 0), op,
           "label_smoothing must be in [0, 1]", softmax ? "" : " and is CrossEntropyLoss's only", ", got ",
           o.label_smoothing);
  if (!input.device().is_cpu() || !targets.device().is_cpu()) return ClassLossOnDevice(op, softmax, input, targets, o);
  auto p = std::make_shared<const ClassProblem>(CheckClassProblem(op, input, targets, o));
  const DType dtype = input.dtype();
  const int64_t positions = p->n * p->s;
  Tensor losses = Tensor::Empty({positions}, dtype);
  Tensor lse = softmax ? Tensor::Empty({positions}, dtype) : Tensor();
  double divisor = 0, total = 0;
  DispatchFloat(dtype, [&]<typename T>() {
    divisor = ClassLossKernel<T>(*p, o, softmax).Forward(losses.data<T>(), softmax ? lse.data<T>() : nullptr);
    if (o.reduction != Reduction::kNone) {
      const T* l = losses.data<T>();
      for (int64_t i = 0; i < positions; ++i) total += l[i];
    }
  });
  Tensor out;
  double scale = 1;  // d out / d (sum of the losses)
  switch (o.reduction) {
    case Reduction::kNone: out = k::Reshape(losses, p->loss_sizes); break;
    case Reduction::kSum: out = Tensor::Scalar(total, dtype); break;
    case Reduction::kMean:
      scale = 1 / divisor;  // inf when everything is ignored: the loss is NaN, its gradient 0
      out = Tensor::Scalar(total / divisor, dtype);
      break;
  }
  ClassLossOptions kept = o;
  kept.weight = Tensor();  // p holds the weight, detached
  return Record(backward_name, {input}, out,
                [p, kept, softmax, saved_x = SavedTensor(p->x), lse, scale, backward_name,
                 input_sizes = input.sizes()](const Tensor& g) -> std::vector<Tensor> {
                  saved_x.Get(backward_name);  // checks the input was not modified in place
                  Tensor grad = Tensor::Empty({p->n, p->c, p->s}, p->x.dtype());
                  const Tensor gc = k::Contiguous(g);
                  DispatchFloat(grad.dtype(), [&]<typename T>() {
                    const bool per_position = kept.reduction == Reduction::kNone;
                    ClassLossKernel<T>(*p, kept, softmax)
                        .Backward(softmax ? lse.data<T>() : nullptr, gc.data<T>(), per_position ? 1 : 0,
                                  static_cast<T>(scale), grad.data<T>());
                  });
                  return {k::Reshape(grad, input_sizes)};
                });
}

}  // namespace

Tensor NllLoss(const Tensor& log_probs, const Tensor& targets, const ClassLossOptions& options) {
  return ClassLoss("NllLoss", "NllLossBackward", /*softmax=*/false, log_probs, targets, options);
}

Tensor CrossEntropyLoss(const Tensor& logits, const Tensor& targets, const ClassLossOptions& options) {
  return ClassLoss("CrossEntropyLoss", "CrossEntropyBackward", /*softmax=*/true, logits, targets, options);
}

Tensor CrossEntropyLoss(const Tensor& logits, const Tensor& targets, Reduction reduction) {
  ClassLossOptions options;
  options.reduction = reduction;
  return CrossEntropyLoss(logits, targets, options);
}

// ---------------------------------------------------------------- MSE

Tensor MseLoss(const Tensor& input, const Tensor& target, Reduction reduction) {
  GW_CHECK(input.defined() && target.defined() && input.sizes() == target.sizes() &&
               input.dtype() == target.dtype() && IsFloating(input.dtype()),
           "MseLoss", "input ", Describe(input), " and target ", Describe(target),
           " must have the same shape and floating dtype");
  if (!input.device().is_cpu()) {  // on a GPU: composed of its kernels (autograd records them)
    const Tensor diff = Sub(input, target);
    const Tensor squares = Mul(diff, diff);
    switch (reduction) {
      case Reduction::kNone:
        return squares;
      case Reduction::kSum:
        return Sum(squares);
      case Reduction::kMean:
        return Mean(squares);
    }
  }
  const Tensor diff = k::Sub(input, target);  // contiguous
  const int64_t n = diff.numel();
  Tensor out;
  double scale = 1;
  if (reduction == Reduction::kNone) {
    out = k::Mul(diff, diff);
  } else {
    double total = 0;
    DispatchFloat(diff.dtype(), [&]<typename T>() {
      const T* d = diff.data<T>();
      T sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += d[i] * d[i];
      total = sum;
    });
    if (reduction == Reduction::kMean) scale = 1.0 / static_cast<double>(n);
    out = Tensor::Scalar(total * scale, diff.dtype());
  }
  return Record("MseLossBackward", {input, target}, out,
                [diff, scale, ni = Needs(input), nt = Needs(target),
                 per_element = reduction == Reduction::kNone](const Tensor& g) -> std::vector<Tensor> {
                  // d/d input = 2 g scale (input - target) = -d/d target
                  const Tensor gc = k::Contiguous(g);
                  const Tensor grad_input = Tensor::Empty(diff.sizes(), diff.dtype());
                  DispatchFloat(diff.dtype(), [&]<typename T>() {
                    const T* d = diff.data<T>();
                    const T* gp = gc.data<T>();
                    T* o = grad_input.data<T>();
                    const T factor = static_cast<T>(2 * scale) * (ni ? 1 : -1);
                    const int64_t n = diff.numel();
                    if (per_element) {
                      for (int64_t i = 0; i < n; ++i) o[i] = factor * gp[i] * d[i];
                    } else {
                      const T f = factor * gp[0];
                      for (int64_t i = 0; i < n; ++i) o[i] = f * d[i];
                    }
                  });
                  // Computed for the input when it needs it, else for the target.
                  if (!ni) return {Tensor(), grad_input};
                  return {grad_input, nt ? k::Neg(grad_input) : Tensor()};
                });
}

double Accuracy(const Tensor& logits, const Tensor& targets) {
  GW_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
           "Accuracy", "expected logits [N, C] and targets [N], got ",
           ShapeToString(logits.sizes()), " and ", ShapeToString(targets.sizes()));
  if (!logits.device().is_cpu() || !targets.device().is_cpu()) {
    return Accuracy(k::ToDevice(logits, kCPU), k::ToDevice(targets, kCPU));
  }
  if (logits.size(0) == 0) return 0.0;
  Tensor hits = kernels::Eq(kernels::Argmax(logits, 1), targets);
  return kernels::Sum(kernels::ToDType(hits, DType::kFloat64)).item() /
         static_cast<double>(logits.size(0));
}

// ---------------------------------------------------------------- modules

// A weight given to a loss module is its buffer "weight", as in PyTorch's state dict.
NllLossModule::NllLossModule(ClassLossOptions options) : Module("NLLLoss"), options_(std::move(options)) {
  if (options_.weight.defined()) RegisterBuffer("weight", options_.weight);
}

Tensor NllLossModule::Forward(const Tensor& log_probs, const Tensor& targets) {
  return NllLoss(log_probs, targets, options_);
}

CrossEntropyLossModule::CrossEntropyLossModule(ClassLossOptions options)
    : Module("CrossEntropyLoss"), options_(std::move(options)) {
  if (options_.weight.defined()) RegisterBuffer("weight", options_.weight);
}

Tensor CrossEntropyLossModule::Forward(const Tensor& logits, const Tensor& targets) {
  return CrossEntropyLoss(logits, targets, options_);
}

MseLossModule::MseLossModule(Reduction reduction) : Module("MSELoss"), reduction_(reduction) {}

Tensor MseLossModule::Forward(const Tensor& input, const Tensor& target) {
  return MseLoss(input, target, reduction_);
}

}  // namespace gw::nn
