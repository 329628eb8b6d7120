// Functional optimizers: fused single-pass update loops, one per (dtype, option set).
//
// Each loop body follows the order of operations of torch/optim/*.py
// (_single_tensor_*) in PyTorch 1.13, with scalars converted to the element type as
// PyTorch's CPU kernels do, so float64 results agree to rounding. Boolean options are
// template parameters (see WithBools) so the loops carry no branches and vectorise.
#include "gradwire/optim/functional.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "composed_step.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/kernels.h"

namespace gw::optim {
namespace {

template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;  // clang 14 does not deduce aggregates yet

constexpr std::string_view kMomentumBuffer = "momentum_buffer";
constexpr std::string_view kExpAvg = "exp_avg";
constexpr std::string_view kExpAvgSq = "exp_avg_sq";
constexpr std::string_view kMaxExpAvgSq = "max_exp_avg_sq";
constexpr std::string_view kSum = "sum";

// Calls f.template operator()<T>() with T the element type of a floating dtype.
template <typename F>
void WithFloatType(std::string_view op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: f.template operator()<float>(); return;
    case DType::kFloat64: f.template operator()<double>(); return;
    default:
      gw::internal::Fail(op, "expected a float32 or float64 parameter, got ", DTypeName(dtype));
  }
}

// Calls f.template operator()<b0, b1, ...>() with the runtime bools as template
// arguments, turning option flags into compile-time constants.
template <bool... kKnown, typename F>
void WithBools(F&& f) {
  f.template operator()<kKnown...>();
}
template <bool... kKnown, typename F, typename... Rest>
void WithBools(F&& f, bool next, Rest... rest) {
  if (next) {
    WithBools<kKnown..., true>(std::forward<F>(f), rest...);
  } else {
    WithBools<kKnown..., false>(std::forward<F>(f), rest...);
  }
}

// torch.maximum semantics: NaN in either operand propagates.
template <typename T>
inline T NanMax(T a, T b) {
  return (b > a || b != b) ? b : a;
}

// ---- fused loops (n elements, all pointers contiguous and non-overlapping) ----

// SGD. kFirst: the momentum buffer does not exist yet and is set to the gradient.
template <typename T, bool kWeightDecay, bool kMomentum, bool kFirst, bool kNesterov>
void SgdLoop(int64_t n, T* __restrict p, const T* __restrict g, T* __restrict buf, T grad_sign,
             T lr, T weight_decay, T momentum, T one_minus_dampening) {
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i] * grad_sign;
    if constexpr (kWeightDecay) d = d + weight_decay * p[i];
    if constexpr (kMomentum) {
      T b;
      if constexpr (kFirst) {
        b = d;
      } else {
        b = buf[i] * momentum + one_minus_dampening * d;
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        d = d + momentum * b;
      } else {
        d = b;
      }
    }
    p[i] = p[i] - lr * d;
  }
}

// Adam and AdamW. param_scale is 1 - lr * weight_decay for AdamW and 1 for Adam
// (multiplying by 1 is exact); kWeightDecay is Adam's L2 term on the gradient.
template <typename T, bool kWeightDecay, bool kAmsgrad>
void AdamLoop(int64_t n, T* __restrict p, const T* __restrict g, T* __restrict exp_avg,
              T* __restrict exp_avg_sq, T* __restrict max_exp_avg_sq, T grad_sign, T weight_decay,
              T param_scale, T beta1, T one_minus_beta1, T beta2, T one_minus_beta2,
              T bias_correction2_sqrt, T eps, T neg_step_size) {
  for (int64_t i = 0; i < n; ++i) {
    T param = p[i];
    T grad = g[i] * grad_sign;
    if constexpr (kWeightDecay) grad = grad + weight_decay * param;
    param = param * param_scale;
    const T m = exp_avg[i] * beta1 + one_minus_beta1 * grad;
    const T v = exp_avg_sq[i] * beta2 + one_minus_beta2 * grad * grad;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    T denom;
    if constexpr (kAmsgrad) {
      const T v_max = NanMax(max_exp_avg_sq[i], v);
      max_exp_avg_sq[i] = v_max;
      denom = std::sqrt(v_max) / bias_correction2_sqrt + eps;
    } else {
      denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    }
    p[i] = param + neg_step_size * (m / denom);
  }
}

template <typename T, bool kWeightDecay>
void AdagradLoop(int64_t n, T* __restrict p, const T* __restrict g, T* __restrict sum, T grad_sign,
                 T weight_decay, T eps, T neg_clr) {
  for (int64_t i = 0; i < n; ++i) {
    T grad = g[i] * grad_sign;
    if constexpr (kWeightDecay) grad = grad + weight_decay * p[i];
    const T s = sum[i] + grad * grad;
    sum[i] = s;
    const T std_dev = std::sqrt(s) + eps;
    p[i] = p[i] + neg_clr * (grad / std_dev);
  }
}

// ---- state buffers ----

// Every buffer already in `state` must match the parameter; non-contiguous ones (e.g.
// restored from elsewhere) are replaced by contiguous copies.
void CheckBuffers(const std::string& op, const Tensor& param, ParamState& state) {
  for (auto& [name, buffer] : state.buffers) {
    GW_CHECK(buffer.defined(), op, "state buffer '", name, "' is undefined");
    GW_CHECK(buffer.sizes() == param.sizes() && buffer.dtype() == param.dtype(), op,
             "state buffer '", name, "' is ", DTypeName(buffer.dtype()), " ",
             ShapeToString(buffer.sizes()), " but the param is ", DTypeName(param.dtype()), " ",
             ShapeToString(param.sizes()));
    GW_CHECK(buffer.device() == param.device(), op, "state buffer '", name, "' is on ",
             buffer.device().ToString(), " but the param is on ", param.device().ToString());
    if (!buffer.is_contiguous()) buffer = kernels::Clone(buffer);
  }
}

// Returns the buffer `name`, creating it filled with `init` when absent.
Tensor Buffer(ParamState& state, std::string_view name, const Tensor& param, double init) {
  auto it = state.buffers.find(std::string(name));
  if (it == state.buffers.end()) {
    it = state.buffers.emplace(std::string(name), Tensor::Full(param.sizes(), init, param.dtype(), param.device()))
             .first;
  }
  return it->second;
}

// ---- per-optimizer steps on contiguous `param` and `grad` ----

// ---- per-optimizer steps on raw contiguous arrays (shared by Update and UpdateRow) ----

// `first`: the momentum buffer has no value yet and is set by this step.
template <typename T>
void SgdRaw(const Sgd& c, int64_t n, T* p, const T* g, T* buf, bool first) {
  const bool use_momentum = c.momentum != 0;
  WithBools(
      [&]<bool kWeightDecay, bool kMomentum, bool kFirst, bool kNesterov>() {
        SgdLoop<T, kWeightDecay, kMomentum, kFirst, kNesterov>(
            n, p, g, buf, static_cast<T>(c.maximize ? -1 : 1), static_cast<T>(c.lr),
            static_cast<T>(c.weight_decay), static_cast<T>(c.momentum), static_cast<T>(1 - c.dampening));
      },
      c.weight_decay != 0, use_momentum, first, use_momentum && c.nesterov);
}

// Adam (decoupled = false) and AdamW (decoupled = true); `step` counts this update.
template <typename T, typename Config>
void AdamRaw(const Config& c, bool decoupled, int64_t n, T* p, const T* g, T* m, T* v, T* v_max, int64_t step) {
  const double bias_correction1 = 1 - std::pow(c.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(c.beta2, static_cast<double>(step));
  const double step_size = c.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  const double param_scale = decoupled ? 1 - c.lr * c.weight_decay : 1;
  const bool l2 = !decoupled && c.weight_decay != 0;
  WithBools(
      [&]<bool kWeightDecay, bool kAmsgrad>() {
        AdamLoop<T, kWeightDecay, kAmsgrad>(
            n, p, g, m, v, v_max, static_cast<T>(c.maximize ? -1 : 1), static_cast<T>(c.weight_decay),
            static_cast<T>(param_scale), static_cast<T>(c.beta1), static_cast<T>(1 - c.beta1),
            static_cast<T>(c.beta2), static_cast<T>(1 - c.beta2), static_cast<T>(bias_correction2_sqrt),
            static_cast<T>(c.eps), static_cast<T>(-step_size));
      },
      l2, c.amsgrad);
}

template <typename T>
void AdagradRaw(const Adagrad& c, int64_t n, T* p, const T* g, T* sum, int64_t step) {
  const double clr = c.lr / (1 + static_cast<double>(step - 1) * c.lr_decay);
  WithBools(
      [&]<bool kWeightDecay>() {
        AdagradLoop<T, kWeightDecay>(n, p, g, sum, static_cast<T>(c.maximize ? -1 : 1),
                                     static_cast<T>(c.weight_decay), static_cast<T>(c.eps), static_cast<T>(-clr));
      },
      c.weight_decay != 0);
}

// ---- per-optimizer steps on contiguous `param` ----
// Prepare(config, param, state) creates the state buffers a step needs and advances the
// step count, then returns run(begin, n, g): the update of param[begin, begin + n) with
// gradient values g[0, n). Update calls it once over the whole tensor; UpdateWithAverage
// block by block, with the average of its gradients formed per block.

template <typename T>
using RangeStep = std::function<void(int64_t, int64_t, const T*)>;

template <typename T>
RangeStep<T> Prepare(const Sgd& c, const Tensor& param, ParamState& state) {
  const bool use_momentum = c.momentum != 0;
  T* buf = nullptr;
  bool first = false;
  if (use_momentum) {
    auto it = state.buffers.find(std::string(kMomentumBuffer));
    first = it == state.buffers.end();
    if (first) {
      // Written by the loop (buf = gradient) before it is read.
      it = state.buffers.emplace(std::string(kMomentumBuffer), Tensor::Empty(param.sizes(), param.dtype())).first;
    }
    buf = it->second.data<T>();
  }
  ++state.step;
  T* p = param.data<T>();
  return [c, p, buf, first](int64_t begin, int64_t n, const T* g) {
    SgdRaw<T>(c, n, p + begin, g, buf != nullptr ? buf + begin : nullptr, first);
  };
}

// Shared by Adam (decoupled = false) and AdamW (decoupled = true).
template <typename T, typename Config>
RangeStep<T> PrepareAdam(const Config& c, bool decoupled, const Tensor& param, ParamState& state) {
  T* m = Buffer(state, kExpAvg, param, 0).template data<T>();
  T* v = Buffer(state, kExpAvgSq, param, 0).template data<T>();
  T* v_max = c.amsgrad ? Buffer(state, kMaxExpAvgSq, param, 0).template data<T>() : nullptr;
  const int64_t step = ++state.step;
  T* p = param.data<T>();
  return [c, decoupled, p, m, v, v_max, step](int64_t begin, int64_t n, const T* g) {
    AdamRaw<T>(c, decoupled, n, p + begin, g, m + begin, v + begin, v_max != nullptr ? v_max + begin : nullptr, step);
  };
}

template <typename T>
RangeStep<T> Prepare(const Adam& c, const Tensor& param, ParamState& state) {
  return PrepareAdam<T>(c, /*decoupled=*/false, param, state);
}

template <typename T>
RangeStep<T> Prepare(const AdamW& c, const Tensor& param, ParamState& state) {
  return PrepareAdam<T>(c, /*decoupled=*/true, param, state);
}

template <typename T>
RangeStep<T> Prepare(const Adagrad& c, const Tensor& param, ParamState& state) {
  T* sum = Buffer(state, kSum, param, c.initial_accumulator_value).template data<T>();
  const int64_t step = ++state.step;
  T* p = param.data<T>();
  return [c, p, sum, step](int64_t begin, int64_t n, const T* g) { AdagradRaw<T>(c, n, p + begin, g, sum + begin, step); };
}

// One step of `config` on contiguous `param` with the gradient
// (grads[0] + ... + grads[k-1]) * (1 / count), or grads[0] itself when k = count = 1.
// REQUIRES: contiguous grads of param's shape and dtype, none sharing storage with param
// or a state buffer.
template <typename T>
void Apply(const OptimizerConfig& config, const Tensor& param, const std::vector<Tensor>& grads, int64_t count,
           ParamState& state, const ParallelFor& parallel) {
  const RangeStep<T> run = std::visit([&](const auto& c) { return Prepare<T>(c, param, state); }, config);
  const int64_t n = param.numel();
  if (grads.size() == 1 && count == 1) {
    run(0, n, grads[0].data<T>());
    return;
  }
  // The average stays in this block (L1) between being formed and being used: every
  // operand is read once, and nothing of the size of the parameter is written but it.
  constexpr int64_t kBlock = 2048;
  const T scale = static_cast<T>(1) / static_cast<T>(count);
  std::vector<const T*> in;
  for (const Tensor& g : grads) in.push_back(g.data<T>());
  auto range = [&](int64_t first, int64_t last) {
    T average[kBlock];
    for (int64_t begin = first; begin < last; begin += kBlock) {
      const int64_t m = std::min(kBlock, last - begin);
      std::copy(in[0] + begin, in[0] + begin + m, average);
      for (size_t k = 1; k < in.size(); ++k) {
        const T* x = in[k] + begin;
        for (int64_t i = 0; i < m; ++i) average[i] += x[i];
      }
      for (int64_t i = 0; i < m; ++i) average[i] *= scale;
      run(begin, m, average);
    }
  };
  // Ranges of at least 32 blocks (256 KiB of float32), at most 8 of them.
  constexpr int64_t kMinRange = 32 * kBlock, kMaxRanges = 8;
  const int64_t ranges = parallel ? std::min(kMaxRanges, n / kMinRange) : 1;
  if (ranges < 2) return range(0, n);
  const int64_t per = (n + ranges - 1) / ranges / kBlock * kBlock + kBlock;
  parallel(ranges, [&](int64_t r) { range(std::min(n, r * per), std::min(n, (r + 1) * per)); });
}

bool SharesStorage(const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }

}  // namespace

std::string Name(const OptimizerConfig& config) {
  return std::visit(Overloaded{
                        [](const Sgd&) { return std::string("SGD"); },
                        [](const Adam&) { return std::string("Adam"); },
                        [](const AdamW&) { return std::string("AdamW"); },
                        [](const Adagrad&) { return std::string("Adagrad"); },
                    },
                    config);
}

std::optional<OptimizerConfig> DefaultConfig(const std::string& name) {
  for (OptimizerConfig c : {OptimizerConfig(Sgd{}), OptimizerConfig(Adam{}), OptimizerConfig(AdamW{}),
                            OptimizerConfig(Adagrad{})}) {
    if (Name(c) == name) return c;
  }
  return std::nullopt;
}

double LearningRate(const OptimizerConfig& config) {
  return std::visit([](const auto& c) { return c.lr; }, config);
}

void SetLearningRate(OptimizerConfig& config, double lr) {
  std::visit([lr](auto& c) { c.lr = lr; }, config);
}

void Validate(const OptimizerConfig& config) {
  const std::string op = Name(config);
  // Written as !(x >= 0) so NaN is rejected too.
  auto non_negative = [&op](double value, std::string_view field) {
    GW_CHECK(value >= 0, op, "invalid ", field, " ", value, " (must be >= 0)");
  };
  auto beta = [&op](double value, std::string_view field) {
    GW_CHECK(value >= 0 && value < 1, op, "invalid ", field, " ", value, " (must be in [0, 1))");
  };
  auto adam_like = [&](const auto& c) {
    non_negative(c.lr, "lr");
    non_negative(c.eps, "eps");
    beta(c.beta1, "beta1");
    beta(c.beta2, "beta2");
    non_negative(c.weight_decay, "weight_decay");
  };
  std::visit(Overloaded{
                 [&](const Sgd& c) {
                   non_negative(c.lr, "lr");
                   non_negative(c.momentum, "momentum");
                   non_negative(c.weight_decay, "weight_decay");
                   GW_CHECK(!std::isnan(c.dampening), op, "invalid dampening nan");
                   GW_CHECK(!c.nesterov || (c.momentum > 0 && c.dampening == 0), op,
                            "Nesterov momentum requires a momentum and zero dampening (momentum ",
                            c.momentum, ", dampening ", c.dampening, ")");
                 },
                 [&](const Adam& c) { adam_like(c); },
                 [&](const AdamW& c) { adam_like(c); },
                 [&](const Adagrad& c) {
                   non_negative(c.lr, "lr");
                   non_negative(c.lr_decay, "lr_decay");
                   non_negative(c.weight_decay, "weight_decay");
                   non_negative(c.initial_accumulator_value, "initial_accumulator_value");
                   non_negative(c.eps, "eps");
                 },
             },
             config);
}

namespace {

// Update and UpdateWithAverage: the checks, contiguous and unaliased operands, the
// version bumps around the write.
void UpdateWith(const OptimizerConfig& config, const Tensor& param, const std::vector<Tensor>& grads, int64_t count,
                ParamState& state, const ParallelFor& parallel) {
  Validate(config);
  const std::string op = Name(config);
  GW_CHECK(param.defined(), op, "param is undefined");
  GW_CHECK(!grads.empty() && count >= 1, op, "needs at least one gradient and a count >= 1, got ", grads.size(),
           " and ", count);
  for (const Tensor& grad : grads) {
    GW_CHECK(grad.defined(), op, "grad is undefined for param ", DTypeName(param.dtype()), " ",
             ShapeToString(param.sizes()));
    GW_CHECK(param.device() == grad.device(), op, "param on ", param.device().ToString(), " and grad on ",
             grad.device().ToString(), ": move the gradient to the parameter's device first");
    GW_CHECK(IsFloating(param.dtype()), op, "param must be float32 or float64, got ",
             DTypeName(param.dtype()), " ", ShapeToString(param.sizes()));
    GW_CHECK(grad.sizes() == param.sizes(), op, "grad shape ", ShapeToString(grad.sizes()),
             " does not match param shape ", ShapeToString(param.sizes()));
    GW_CHECK(grad.dtype() == param.dtype(), op, "grad dtype ", DTypeName(grad.dtype()), " ",
             ShapeToString(grad.sizes()), " does not match param dtype ", DTypeName(param.dtype()),
             " ", ShapeToString(param.sizes()));
  }
  CheckBuffers(op, param, state);

  autograd::NoGradGuard no_grad;
  if (!param.device().is_cpu()) {  // the fused loops read host memory: composed kernels there
    internal::ComposedStep(config, param, grads, count, state);
    return;
  }
  // The loops need contiguous operands that do not overlap each other.
  const bool in_place = param.is_contiguous();
  const Tensor work = in_place ? param : kernels::Clone(param);
  std::vector<Tensor> g;
  for (const Tensor& grad : grads) {
    Tensor c = kernels::Contiguous(grad);
    bool aliased = SharesStorage(c, work);
    for (const auto& [name, buffer] : state.buffers) aliased = aliased || SharesStorage(c, buffer);
    g.push_back(aliased ? kernels::Clone(c) : c);
  }

  if (in_place) param.storage()->BumpVersion();  // a write starts (see storage.h)
  WithFloatType(op, param.dtype(), [&]<typename T>() { Apply<T>(config, work, g, count, state, parallel); });

  if (in_place) {
    param.storage()->BumpVersion();
  } else {
    kernels::CopyInPlace(param, work);  // bumps the version
  }
}

}  // namespace

void internal::ComposedStep(const OptimizerConfig& config, const Tensor& param, const std::vector<Tensor>& grads,
                            int64_t count, ParamState& state) {
  namespace k = kernels;
  Tensor g = grads[0];
  if (grads.size() > 1 || count != 1) {
    g = k::Clone(grads[0]);
    for (size_t i = 1; i < grads.size(); ++i) k::AddInPlace(g, grads[i]);
    k::ScaleInPlace(g, 1.0 / static_cast<double>(count));
  }
  // The signed gradient, plus the L2 term where the optimizer adds one: a fresh tensor.
  auto signed_grad = [&](bool maximize, double l2) {
    Tensor d = k::MulScalar(g, maximize ? -1 : 1);
    if (l2 != 0) k::AddInPlace(d, param, l2);
    return d;
  };
  auto adam = [&](const auto& c, bool decoupled) {
    const int64_t step = ++state.step;
    const double bias_correction1 = 1 - std::pow(c.beta1, static_cast<double>(step));
    const double bias_correction2_sqrt = std::sqrt(1 - std::pow(c.beta2, static_cast<double>(step)));
    const Tensor grad = signed_grad(c.maximize, decoupled ? 0 : c.weight_decay);
    if (decoupled && c.weight_decay != 0) k::ScaleInPlace(param, 1 - c.lr * c.weight_decay);
    Tensor m = Buffer(state, kExpAvg, param, 0), v = Buffer(state, kExpAvgSq, param, 0);
    k::ScaleInPlace(m, c.beta1);
    k::AddInPlace(m, grad, 1 - c.beta1);
    k::ScaleInPlace(v, c.beta2);
    k::AddInPlace(v, k::Mul(grad, grad), 1 - c.beta2);
    Tensor second = v;
    if (c.amsgrad) {
      Tensor v_max = Buffer(state, kMaxExpAvgSq, param, 0);
      k::CopyInPlace(v_max, k::Maximum(v, v_max));  // NaN in v propagates, as in the loop
      second = v_max;
    }
    const Tensor denom = k::AddScalar(k::MulScalar(k::Sqrt(second), 1 / bias_correction2_sqrt), c.eps);
    k::AddInPlace(param, k::Div(m, denom), -c.lr / bias_correction1);
  };
  std::visit(Overloaded{
                 [&](const Sgd& c) {
                   Tensor d = signed_grad(c.maximize, c.weight_decay);
                   if (c.momentum != 0) {
                     auto it = state.buffers.find(std::string(kMomentumBuffer));
                     if (it == state.buffers.end()) {
                       it = state.buffers.emplace(std::string(kMomentumBuffer), k::Clone(d)).first;
                     } else {
                       k::ScaleInPlace(it->second, c.momentum);
                       k::AddInPlace(it->second, d, 1 - c.dampening);
                     }
                     if (c.nesterov) {
                       k::AddInPlace(d, it->second, c.momentum);
                     } else {
                       d = it->second;
                     }
                   }
                   ++state.step;
                   k::AddInPlace(param, d, -c.lr);
                 },
                 [&](const Adam& c) { adam(c, /*decoupled=*/false); },
                 [&](const AdamW& c) { adam(c, /*decoupled=*/true); },
                 [&](const Adagrad& c) {
                   const int64_t step = ++state.step;
                   const double clr = c.lr / (1 + static_cast<double>(step - 1) * c.lr_decay);
                   const Tensor grad = signed_grad(c.maximize, c.weight_decay);
                   Tensor sum = Buffer(state, kSum, param, c.initial_accumulator_value);
                   k::AddInPlace(sum, k::Mul(grad, grad));
                   k::AddInPlace(param, k::Div(grad, k::AddScalar(k::Sqrt(sum), c.eps)), -clr);
                 },
             },
             config);
}

void Update(const OptimizerConfig& config, const Tensor& param, const Tensor& grad, ParamState& state) {
  UpdateWith(config, param, {grad}, 1, state, nullptr);
}

void UpdateWithAverage(const OptimizerConfig& config, const Tensor& param, const std::vector<Tensor>& grads,
                       int64_t count, ParamState& state, const ParallelFor& parallel) {
  UpdateWith(config, param, grads, count, state, parallel);
}

int RowStateSize(const OptimizerConfig& config) {
  return std::visit(Overloaded{
                        [](const Sgd& c) { return c.momentum != 0 ? 1 : 0; },
                        [](const Adam& c) { return c.amsgrad ? 3 : 2; },
                        [](const AdamW& c) { return c.amsgrad ? 3 : 2; },
                        [](const Adagrad&) { return 1; },
                    },
                    config);
}

void UpdateRow(const OptimizerConfig& config, int64_t dim, float* param, const float* grad, float* state,
               int64_t& step) {
  const bool fresh = step == 0;
  ++step;
  std::visit(Overloaded{
                 [&](const Sgd& c) { SgdRaw<float>(c, dim, param, grad, c.momentum != 0 ? state : nullptr, fresh); },
                 [&](const Adam& c) {
                   if (fresh) std::fill(state, state + RowStateSize(c) * dim, 0.0f);
                   AdamRaw<float>(c, false, dim, param, grad, state, state + dim, c.amsgrad ? state + 2 * dim : nullptr,
                                  step);
                 },
                 [&](const AdamW& c) {
                   if (fresh) std::fill(state, state + RowStateSize(c) * dim, 0.0f);
                   AdamRaw<float>(c, true, dim, param, grad, state, state + dim, c.amsgrad ? state + 2 * dim : nullptr,
                                  step);
                 },
                 [&](const Adagrad& c) {
                   if (fresh) std::fill(state, state + dim, static_cast<float>(c.initial_accumulator_value));
                   AdagradRaw<float>(c, dim, param, grad, state, step);
                 },
             },
             config);
}

}  // namespace gw::optim
