// Element-wise kernels: arithmetic, comparisons, unary math, in-place updates, dropout
// masks. GELU and SiLU run in float32 on oneDNN's eltwise primitives (JIT-vectorised, with
// their own erf/exp); float64 and Erf use the templated loops here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <numbers>
#include <optional>
#include <utility>
#include <vector>

#include "cuda/cuda_kernels.h"
#include "dispatch.h"
#include "dnnl_util.h"
#include "dropout.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

using internal::BinaryLoop;
using internal::CheckDefined;
using internal::UnaryLoop;

// True when t's elements fill one block of numel() consecutive elements in some order of
// its dims (contiguous, or a permutation of it such as a transpose): element-wise ops then
// run on the flat block, and their result keeps t's strides (as PyTorch's do).
bool IsDense(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.sizes()[d] == 1) continue;
    if (t.strides()[d] <= 0) return false;
    dims.emplace_back(t.strides()[d], t.sizes()[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// A new tensor with dense t's sizes and strides.
Tensor EmptyLike(const Tensor& t) {
  Tensor block = Tensor::Empty({t.numel()}, t.dtype());
  return Tensor::FromStorage(block.storage(), t.dtype(), t.sizes(), t.strides(), 0);
}

// The result of an element-wise op of shape `sizes` over `operands`: channels-last when
// the first operand of that shape is (PyTorch's channels_last propagation: the layers of a
// channels-last network stay so), else contiguous (callers may rely on that).
Tensor EmptyResult(const Shape& sizes, DType dtype, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands) {
    if (t->sizes() != sizes) continue;
    if (internal::IsChannelsLast(*t) && !t->is_contiguous()) {
      return internal::EmptyChannelsLast(sizes, dtype);
    }
    break;
  }
  return Tensor::Empty(sizes, dtype);
}

// `t` (dense) as the 1-D block of its elements in memory order.
Tensor Flat(const Tensor& t) {
  return Tensor::FromStorage(t.storage(), t.dtype(), {t.numel()}, {1}, t.storage_offset());
}

// Runs `loop(out, operands...)` on flat views when the operands share out's dense layout
// (one contiguous row instead of a strided walk over a permuted layout), else as given.
template <typename Loop, typename... Operands>
void RunElementwise(const Tensor& out, Loop&& loop, const Operands&... operands) {
  const bool shared = out.numel() > 0 && !out.is_contiguous() && IsDense(out) &&
                      ((operands.sizes() == out.sizes() && operands.strides() == out.strides()) &&
                       ...);
  if (shared) {
    loop(Flat(out), Flat(operands)...);
  } else {
    loop(out, operands...);
  }
}

namespace cu = internal::cuda;

// The GPU twins of the helpers below: a new (contiguous) result on the operands' GPU.
Tensor CudaBinary(std::string_view name, cu::BinaryOp op, const Tensor& a, const Tensor& b, DType out_dtype,
                  bool floating_only = false) {
  internal::CheckSameDType(name, a, b);
  GW_CHECK(!floating_only || a.dtype() == DType::kFloat32 || a.dtype() == DType::kFloat64, name,
           "expected a floating tensor (float32 or float64), got ", DTypeName(a.dtype()));
  GW_CHECK(a.dtype() != DType::kBool, name, "expected a numeric tensor, got bool");
  Tensor out = Tensor::Empty(BroadcastShapes(name, a.sizes(), b.sizes()), out_dtype, a.device());
  cu::Binary(op, out, a, b);
  return out;
}

Tensor CudaUnary(std::string_view name, cu::UnaryOp op, const Tensor& a, bool floating_only, double alpha = 0) {
  GW_CHECK(!floating_only || a.dtype() == DType::kFloat32 || a.dtype() == DType::kFloat64, name,
           "expected a floating tensor (float32 or float64), got ", DTypeName(a.dtype()));
  GW_CHECK(a.dtype() != DType::kBool, name, "expected a numeric tensor, got bool");
  Tensor out = Tensor::Empty(a.sizes(), a.dtype(), a.device());
  cu::Unary(op, out, a, alpha);
  return out;
}

// Each helper takes the op's GPU kernel, if it has one (without, a GPU tensor fails the CPU
// kernel's device check).
using CudaBinaryOp = std::optional<cu::BinaryOp>;
using CudaUnaryOp = std::optional<cu::UnaryOp>;

template <typename Op>
Tensor Arith(std::string_view name, const Tensor& a, const Tensor& b, Op op, CudaBinaryOp gpu = {}) {
  if (gpu && cu::OnCuda(name, a, {&b})) return CudaBinary(name, *gpu, a, b, a.dtype());
  CheckDefined(name, a);
  CheckDefined(name, b);
  internal::CheckSameDType(name, a, b);
  Tensor out = EmptyResult(BroadcastShapes(name, a.sizes(), b.sizes()), a.dtype(), {&a, &b});
  internal::DispatchNumeric(name, a.dtype(), [&]<typename T>() {
    RunElementwise(out, [&](const Tensor& o, const Tensor& x, const Tensor& y) {
      BinaryLoop<T, T, T>(o, x, y, [&](T u, T v) { return op(u, v); });
    }, a, b);
  });
  return out;
}

template <typename Op>
Tensor Compare(std::string_view name, const Tensor& a, const Tensor& b, Op op, CudaBinaryOp gpu = {}) {
  if (gpu && cu::OnCuda(name, a, {&b})) return CudaBinary(name, *gpu, a, b, DType::kBool);
  CheckDefined(name, a);
  CheckDefined(name, b);
  internal::CheckSameDType(name, a, b);
  Tensor out = EmptyResult(BroadcastShapes(name, a.sizes(), b.sizes()), DType::kBool, {&a, &b});
  internal::DispatchAll(a.dtype(), [&]<typename T>() {
    RunElementwise(out, [&](const Tensor& o, const Tensor& x, const Tensor& y) {
      BinaryLoop<bool, T, T>(o, x, y, [&](T u, T v) { return op(u, v); });
    }, a, b);
  });
  return out;
}

template <typename Op>
Tensor FloatUnary(std::string_view name, const Tensor& a, Op op, CudaUnaryOp gpu = {}) {
  if (gpu && cu::OnCuda(name, a)) return CudaUnary(name, *gpu, a, /*floating_only=*/true);
  CheckDefined(name, a);
  Tensor out = EmptyResult(a.sizes(), a.dtype(), {&a});
  internal::DispatchFloating(name, a.dtype(), [&]<typename T>() {
    RunElementwise(out, [&](const Tensor& o, const Tensor& x) {
      UnaryLoop<T, T>(o, x, [&](T v) { return static_cast<T>(op(v)); });
    }, a);
  });
  return out;
}

template <typename Op>
Tensor NumericUnary(std::string_view name, const Tensor& a, Op op, CudaUnaryOp gpu = {}, double alpha = 0) {
  if (gpu && cu::OnCuda(name, a)) return CudaUnary(name, *gpu, a, /*floating_only=*/false, alpha);
  CheckDefined(name, a);
  Tensor out = EmptyResult(a.sizes(), a.dtype(), {&a});
  internal::DispatchNumeric(name, a.dtype(), [&]<typename T>() {
    RunElementwise(out, [&](const Tensor& o, const Tensor& x) {
      UnaryLoop<T, T>(o, x, [&](T v) { return static_cast<T>(op(v)); });
    }, a);
  });
  return out;
}

// grad * f(out), both shaped like out.
template <typename Op>
Tensor BackwardFromOutput(std::string_view name, const Tensor& grad, const Tensor& out, Op op, CudaBinaryOp gpu = {}) {
  if (gpu && cu::OnCuda(name, grad, {&out})) {
    return CudaBinary(name, *gpu, grad, out, out.dtype(), /*floating_only=*/true);
  }
  CheckDefined(name, grad);
  CheckDefined(name, out);
  internal::CheckSameDType(name, grad, out);
  Tensor result =
      EmptyResult(BroadcastShapes(name, grad.sizes(), out.sizes()), out.dtype(), {&grad, &out});
  internal::DispatchFloating(name, out.dtype(), [&]<typename T>() {
    RunElementwise(result, [&](const Tensor& r, const Tensor& x, const Tensor& y) {
      BinaryLoop<T, T, T>(r, x, y, [&](T g, T v) { return static_cast<T>(op(g, v)); });
    }, grad, out);
  });
  return result;
}

// m ? x : y without a branch: the mask selects bits (floats of any value, NaN included).
template <typename T>
T Select(bool m, T x, T y) {
  if constexpr (std::is_same_v<T, bool>) {
    return m ? x : y;
  } else {
    using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    const Bits all = Bits{0} - static_cast<Bits>(m);
    Bits bx, by;
    std::memcpy(&bx, &x, sizeof(T));
    std::memcpy(&by, &y, sizeof(T));
    const Bits r = (bx & all) | (by & ~all);
    T out;
    std::memcpy(&out, &r, sizeof(T));
    return out;
  }
}

template <typename T>
T CheckedIntDiv(T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    GW_CHECK(y != 0, "Div", "integer division by zero");
    return x / y;
  } else {
    return x / y;
  }
}

// ---- oneDNN eltwise (float32) ----

// The algorithm and alpha of a oneDNN eltwise primitive.
struct DnnlEltwiseOp {
  dnnl::algorithm algorithm;
  float alpha;
};

dnnl::memory::desc FlatDesc(int64_t n) {
  return dnnl::memory::desc({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
}

dnnl::eltwise_forward::primitive_desc EltwiseForwardPd(DnnlEltwiseOp op, int64_t n) {
  return dnnl::eltwise_forward::primitive_desc(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, op.algorithm, FlatDesc(n),
                                  op.alpha, 0.f),
      internal::UserScratchpad(), internal::CpuEngine());
}

std::vector<int64_t> EltwiseKey(DnnlEltwiseOp op, int64_t n) {
  return {static_cast<int64_t>(op.algorithm), static_cast<int64_t>(op.alpha * 1e6), n};
}

// y = f(x) for a float32 x, on a cached primitive of x's element count.
Tensor DnnlEltwise(std::string_view name, DnnlEltwiseOp op, const Tensor& x_in) {
  static internal::PrimitiveCache<dnnl::eltwise_forward> cache;
  const Tensor x = IsDense(x_in) ? x_in : Contiguous(x_in);
  const Tensor y = EmptyLike(x);
  const int64_t n = x.numel();
  if (n == 0) return y;
  const dnnl::eltwise_forward prim =
      *cache.Get(EltwiseKey(op, n), [&] { return dnnl::eltwise_forward(EltwiseForwardPd(op, n)); });
  internal::RunDnnl(name, [&](dnnl::stream& stream) {
    auto& engine = internal::CpuEngine();
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(FlatDesc(n), engine, x.raw_data())},
                                               {DNNL_ARG_DST, dnnl::memory(FlatDesc(n), engine, y.raw_data())}};
    std::vector<Tensor> keep;
    internal::AddScratchpad(prim, args, keep);
    prim.execute(stream, args);
  });
  return y;
}

// dx = grad * f'(x) for float32 grad and x of one shape.
Tensor DnnlEltwiseBackward(std::string_view name, DnnlEltwiseOp op, const Tensor& grad_in,
                           const Tensor& x_in) {
  static internal::PrimitiveCache<dnnl::eltwise_backward> cache;
  const bool flat = IsDense(x_in) && grad_in.strides() == x_in.strides();
  const Tensor x = flat ? x_in : Contiguous(x_in), grad = flat ? grad_in : Contiguous(grad_in);
  const Tensor dx = EmptyLike(x);
  const int64_t n = x.numel();
  if (n == 0) return dx;
  const dnnl::eltwise_backward prim = *cache.Get(EltwiseKey(op, n), [&] {
    return dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(
        dnnl::eltwise_backward::desc(op.algorithm, FlatDesc(n), FlatDesc(n), op.alpha, 0.f),
        internal::UserScratchpad(), internal::CpuEngine(), EltwiseForwardPd(op, n)));
  });
  internal::RunDnnl(name, [&](dnnl::stream& stream) {
    auto& engine = internal::CpuEngine();
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(FlatDesc(n), engine, x.raw_data())},
        {DNNL_ARG_DIFF_DST, dnnl::memory(FlatDesc(n), engine, grad.raw_data())},
        {DNNL_ARG_DIFF_SRC, dnnl::memory(FlatDesc(n), engine, dx.raw_data())}};
    std::vector<Tensor> keep;
    internal::AddScratchpad(prim, args, keep);
    prim.execute(stream, args);
  });
  return dx;
}

// ---- activations: value and derivative, templated (float64, and the float32 reference) ----

template <typename T>
constexpr T kSqrtHalf = static_cast<T>(0.70710678118654752440);  // 1 / sqrt(2)
template <typename T>
constexpr T kTanhScale = static_cast<T>(0.79788456080286535588);  // sqrt(2 / pi)
template <typename T>
constexpr T kGeluCubic = static_cast<T>(0.044715);

template <typename T>
T SigmoidOf(T x) {
  return x >= 0 ? T{1} / (T{1} + std::exp(-x)) : std::exp(x) / (T{1} + std::exp(x));
}

template <typename T>
T GeluOf(T x, GeluApproximate approximate) {
  if (approximate == GeluApproximate::kTanh) {
    return T{0.5} * x * (T{1} + std::tanh(kTanhScale<T> * (x + kGeluCubic<T> * x * x * x)));
  }
  return T{0.5} * x * (T{1} + std::erf(x * kSqrtHalf<T>));
}

template <typename T>
T GeluDerivative(T x, GeluApproximate approximate) {
  if (approximate == GeluApproximate::kTanh) {
    const T t = std::tanh(kTanhScale<T> * (x + kGeluCubic<T> * x * x * x));
    return T{0.5} * (T{1} + t) +
           T{0.5} * x * (T{1} - t * t) * kTanhScale<T> * (T{1} + 3 * kGeluCubic<T> * x * x);
  }
  const T pdf = std::exp(T{-0.5} * x * x) * static_cast<T>(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);
  return T{0.5} * (T{1} + std::erf(x * kSqrtHalf<T>)) + x * pdf;
}

DnnlEltwiseOp GeluOp(GeluApproximate approximate) {
  return {approximate == GeluApproximate::kTanh ? dnnl::algorithm::eltwise_gelu_tanh
                                                : dnnl::algorithm::eltwise_gelu_erf,
          0.f};
}

constexpr DnnlEltwiseOp kSiluOp{dnnl::algorithm::eltwise_swish, 1.f};  // x * sigmoid(1 * x)

// grad * f'(x), both broadcast to one shape.
template <typename Op>
Tensor BackwardFromInput(std::string_view name, const Tensor& grad, const Tensor& x, Op op) {
  return BackwardFromOutput(name, grad, x, [&](auto g, auto v) { return g * op(v); });
}

}  // namespace

Tensor Add(const Tensor& a, const Tensor& b) {
  return Arith(
      "Add", a, b, [](auto x, auto y) { return x + y; }, cu::BinaryOp::kAdd);
}
Tensor Sub(const Tensor& a, const Tensor& b) {
  return Arith(
      "Sub", a, b, [](auto x, auto y) { return x - y; }, cu::BinaryOp::kSub);
}
Tensor Mul(const Tensor& a, const Tensor& b) {
  return Arith(
      "Mul", a, b, [](auto x, auto y) { return x * y; }, cu::BinaryOp::kMul);
}
Tensor Div(const Tensor& a, const Tensor& b) {
  return Arith(
      "Div", a, b, [](auto x, auto y) { return CheckedIntDiv(x, y); }, cu::BinaryOp::kDiv);
}
Tensor Pow(const Tensor& a, const Tensor& b) {
  return Arith("Pow", a, b, [](auto x, auto y) { return static_cast<decltype(x)>(std::pow(x, y)); });
}
Tensor Maximum(const Tensor& a, const Tensor& b) {
  return Arith(
      "Maximum", a, b, [](auto x, auto y) { return x > y || std::isnan(static_cast<double>(x)) ? x : y; },
      cu::BinaryOp::kMaximum);
}

Tensor Eq(const Tensor& a, const Tensor& b) {
  return Compare(
      "Eq", a, b, [](auto x, auto y) { return x == y; }, cu::BinaryOp::kEq);
}
Tensor Ne(const Tensor& a, const Tensor& b) { return Compare("Ne", a, b, [](auto x, auto y) { return x != y; }); }
Tensor Lt(const Tensor& a, const Tensor& b) {
  return Compare(
      "Lt", a, b, [](auto x, auto y) { return x < y; }, cu::BinaryOp::kLt);
}
Tensor Le(const Tensor& a, const Tensor& b) { return Compare("Le", a, b, [](auto x, auto y) { return x <= y; }); }
Tensor Gt(const Tensor& a, const Tensor& b) {
  return Compare(
      "Gt", a, b, [](auto x, auto y) { return x > y; }, cu::BinaryOp::kGt);
}
Tensor Ge(const Tensor& a, const Tensor& b) { return Compare("Ge", a, b, [](auto x, auto y) { return x >= y; }); }

Tensor Where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  CheckDefined("Where", mask);
  CheckDefined("Where", a);
  CheckDefined("Where", b);
  GW_CHECK(mask.dtype() == DType::kBool, "Where", "mask must be bool, got ",
           DTypeName(mask.dtype()), " ", ShapeToString(mask.sizes()));
  internal::CheckSameDType("Where", a, b);
  const Shape sizes = BroadcastShapes(
      "Where", BroadcastShapes("Where", mask.sizes(), a.sizes()), b.sizes());
  Tensor out = Tensor::Empty(sizes, a.dtype());
  auto loop = internal::MakeLoop<4>(
      sizes, {out.strides(), internal::BroadcastStrides(mask, sizes),
              internal::BroadcastStrides(a, sizes), internal::BroadcastStrides(b, sizes)});
  internal::DispatchAll(a.dtype(), [&]<typename T>() {
    T* po = out.data<T>();
    const bool* pm = mask.data<bool>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    internal::RunLoop(loop, [&](const std::array<int64_t, 4>& off, int64_t n,
                                const std::array<int64_t, 4>& s) {
      T* o = po + off[0];
      const bool* m = pm + off[1];
      const T* x = pa + off[2];
      const T* y = pb + off[3];
      // Both values are loaded before the choice, so it is a blend, not a branch (a
      // random mask mispredicts half the time).
      if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
        for (int64_t i = 0; i < n; ++i) o[i] = Select(m[i], x[i], y[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) o[i * s[0]] = Select(m[i * s[1]], x[i * s[2]], y[i * s[3]]);
      }
    });
  });
  return out;
}

Tensor MaskedFill(const Tensor& t, const Tensor& mask, double value) {
  CheckDefined("MaskedFill", t);
  CheckDefined("MaskedFill", mask);
  GW_CHECK(mask.dtype() == DType::kBool, "MaskedFill", "mask must be bool, got ",
           DTypeName(mask.dtype()), " ", ShapeToString(mask.sizes()));
  Tensor out = Tensor::Empty(BroadcastShapes("MaskedFill", t.sizes(), mask.sizes()), t.dtype());
  internal::DispatchAll(t.dtype(), [&]<typename T>() {
    const T v = static_cast<T>(value);
    BinaryLoop<T, T, bool>(out, t, mask, [v](T x, bool m) { return Select(m, v, x); });
  });
  return out;
}

Tensor AddScalar(const Tensor& a, double s) {
  return NumericUnary(
      "AddScalar", a, [s](auto x) { return x + static_cast<decltype(x)>(s); }, cu::UnaryOp::kAddScalar, s);
}
Tensor MulScalar(const Tensor& a, double s) {
  return NumericUnary(
      "MulScalar", a, [s](auto x) { return x * static_cast<decltype(x)>(s); }, cu::UnaryOp::kScale, s);
}
Tensor PowScalar(const Tensor& a, double e) {
  if (e == 2.0) return FloatUnary("PowScalar", a, [](auto x) { return x * x; });
  return FloatUnary("PowScalar", a, [e](auto x) { return std::pow(x, static_cast<decltype(x)>(e)); });
}
Tensor Neg(const Tensor& a) {
  return NumericUnary(
      "Neg", a, [](auto x) { return -x; }, cu::UnaryOp::kNeg);
}
Tensor Abs(const Tensor& a) {
  return NumericUnary(
      "Abs", a, [](auto x) { return x < 0 ? -x : x; }, cu::UnaryOp::kAbs);
}
Tensor Exp(const Tensor& a) {
  return FloatUnary(
      "Exp", a, [](auto x) { return std::exp(x); }, cu::UnaryOp::kExp);
}
Tensor Log(const Tensor& a) {
  return FloatUnary(
      "Log", a, [](auto x) { return std::log(x); }, cu::UnaryOp::kLog);
}
Tensor Sqrt(const Tensor& a) {
  return FloatUnary(
      "Sqrt", a, [](auto x) { return std::sqrt(x); }, cu::UnaryOp::kSqrt);
}
Tensor Relu(const Tensor& a) {
  return FloatUnary(
      "Relu", a, [](auto x) { return x > 0 ? x : decltype(x){0}; }, cu::UnaryOp::kRelu);
}
Tensor Tanh(const Tensor& a) {
  return FloatUnary(
      "Tanh", a, [](auto x) { return std::tanh(x); }, cu::UnaryOp::kTanh);
}
Tensor Sigmoid(const Tensor& a) {
  return FloatUnary(
      "Sigmoid", a, [](auto x) { return SigmoidOf(x); }, cu::UnaryOp::kSigmoid);
}

Tensor ReluBackward(const Tensor& grad, const Tensor& out) {
  return BackwardFromOutput(
      "ReluBackward", grad, out, [](auto g, auto y) { return y > 0 ? g : decltype(g){0}; },
      cu::BinaryOp::kReluBackward);
}
Tensor TanhBackward(const Tensor& grad, const Tensor& out) {
  return BackwardFromOutput(
      "TanhBackward", grad, out, [](auto g, auto y) { return g * (1 - y * y); }, cu::BinaryOp::kTanhBackward);
}
Tensor SigmoidBackward(const Tensor& grad, const Tensor& out) {
  return BackwardFromOutput(
      "SigmoidBackward", grad, out, [](auto g, auto y) { return g * y * (1 - y); }, cu::BinaryOp::kSigmoidBackward);
}

Tensor Erf(const Tensor& a) { return FloatUnary("Erf", a, [](auto x) { return std::erf(x); }); }

Tensor ErfBackward(const Tensor& grad, const Tensor& input) {
  return BackwardFromInput("ErfBackward", grad, input, [](auto x) {
    using T = decltype(x);
    return static_cast<T>(std::numbers::inv_sqrtpi * 2) * std::exp(-x * x);
  });
}

Tensor Gelu(const Tensor& a, GeluApproximate approximate) {
  CheckDefined("Gelu", a);
  if (a.dtype() == DType::kFloat32) return DnnlEltwise("Gelu", GeluOp(approximate), a);
  return FloatUnary("Gelu", a, [approximate](auto x) { return GeluOf(x, approximate); });
}

Tensor GeluBackward(const Tensor& grad, const Tensor& input, GeluApproximate approximate) {
  CheckDefined("GeluBackward", grad);
  CheckDefined("GeluBackward", input);
  if (input.dtype() == DType::kFloat32 && grad.dtype() == DType::kFloat32 &&
      grad.sizes() == input.sizes()) {
    return DnnlEltwiseBackward("GeluBackward", GeluOp(approximate), grad, input);
  }
  return BackwardFromInput("GeluBackward", grad, input,
                           [approximate](auto x) { return GeluDerivative(x, approximate); });
}

Tensor Silu(const Tensor& a) {
  CheckDefined("Silu", a);
  if (a.dtype() == DType::kFloat32) return DnnlEltwise("Silu", kSiluOp, a);
  return FloatUnary("Silu", a, [](auto x) { return x * SigmoidOf(x); });
}

Tensor SiluBackward(const Tensor& grad, const Tensor& input) {
  CheckDefined("SiluBackward", grad);
  CheckDefined("SiluBackward", input);
  if (input.dtype() == DType::kFloat32 && grad.dtype() == DType::kFloat32 &&
      grad.sizes() == input.sizes()) {
    return DnnlEltwiseBackward("SiluBackward", kSiluOp, grad, input);
  }
  return BackwardFromInput("SiluBackward", grad, input, [](auto x) {
    const auto s = SigmoidOf(x);
    return s * (1 + x * (1 - s));
  });
}

Tensor DropoutMask(const Shape& sizes, double p, DType dtype, Generator& gen) {
  GW_CHECK(p >= 0 && p <= 1, "DropoutMask", "p must be in [0, 1], got ", p);
  Tensor mask = Tensor::Empty(sizes, dtype);
  internal::DispatchFloating("DropoutMask", dtype, [&]<typename T>() {
    internal::ApplyDropout<T>(gen, p, nullptr, mask.data<T>(), mask.numel());
  });
  return mask;
}

void Fill(const Tensor& dst, double value) {
  if (cu::OnCuda("Fill", dst)) {
    dst.storage()->BumpVersion();
    cu::Unary(cu::UnaryOp::kFill, dst, dst, value);
    dst.storage()->BumpVersion();
    return;
  }
  CheckDefined("Fill", dst);
  dst.storage()->BumpVersion();  // a write starts (see storage.h)
  internal::DispatchAll(dst.dtype(), [&]<typename T>() {
    const T v = static_cast<T>(value);
    if (dst.is_contiguous()) {
      T* p = dst.data<T>();
      std::fill(p, p + dst.numel(), v);
    } else {
      Tensor scalar = Tensor::Empty({}, dst.dtype());
      *scalar.data<T>() = v;
      UnaryLoop<T, T>(dst, scalar, [](T x) { return x; });
    }
  });
  dst.storage()->BumpVersion();
}

// A source that shares storage with the destination is copied first, and a destination
// with broadcast (stride 0) dimensions is rejected: both would otherwise read elements
// this very operation already overwrote.
Tensor PrepareInPlace(std::string_view op, const Tensor& dst, const Tensor& src) {
  if (!cu::OnCuda(op, dst, {&src})) {
    CheckDefined(op, dst);
    CheckDefined(op, src);
  }
  internal::CheckSameDType(op, dst, src);
  for (int64_t i = 0; i < dst.dim(); ++i) {
    GW_CHECK(dst.strides()[i] != 0 || dst.sizes()[i] <= 1, op, "destination ",
             ShapeToString(dst.sizes()), " has broadcast (stride 0) dimensions");
  }
  GW_CHECK(BroadcastShapes(op, dst.sizes(), src.sizes()) == dst.sizes(), op, "source ",
           ShapeToString(src.sizes()), " does not broadcast to destination ",
           ShapeToString(dst.sizes()));
  Tensor safe_src = src.storage() == dst.storage() && !src.is_same(dst) ? Clone(src) : src;
  dst.storage()->BumpVersion();  // a write starts (see storage.h)
  return safe_src;
}

void CopyInPlace(const Tensor& dst, const Tensor& src_in) {
  // From another device: brought to dst's first (a state dict loaded into a GPU module).
  const bool moved = src_in.defined() && dst.defined() && src_in.device() != dst.device();
  const Tensor src = PrepareInPlace("CopyInPlace", dst, moved ? ToDevice(src_in, dst.device()) : src_in);
  if (dst.device().is_cuda()) {
    cu::Unary(cu::UnaryOp::kCopy, dst, src);
  } else if (dst.is_contiguous() && src.is_contiguous() && dst.sizes() == src.sizes()) {
    if (dst.nbytes() > 0) std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
  } else {
    internal::DispatchAll(dst.dtype(), [&]<typename T>() {
      UnaryLoop<T, T>(dst, src, [](T x) { return x; });
    });
  }
  dst.storage()->BumpVersion();
}

void AddInPlace(const Tensor& dst, const Tensor& src_in, double alpha) {
  const Tensor src = PrepareInPlace("AddInPlace", dst, src_in);
  if (dst.device().is_cuda()) {
    cu::Binary(cu::BinaryOp::kAxpy, dst, dst, src, alpha);
    dst.storage()->BumpVersion();
    return;
  }
  internal::DispatchNumeric("AddInPlace", dst.dtype(), [&]<typename T>() {
    const T a = static_cast<T>(alpha);
    BinaryLoop<T, T, T>(dst, dst, src, [a](T x, T y) { return x + a * y; });
  });
  dst.storage()->BumpVersion();
}

void ScaleInPlace(const Tensor& dst, double s) {
  PrepareInPlace("ScaleInPlace", dst, dst);
  if (dst.device().is_cuda()) {
    cu::Unary(cu::UnaryOp::kScale, dst, dst, s);
    dst.storage()->BumpVersion();
    return;
  }
  internal::DispatchNumeric("ScaleInPlace", dst.dtype(), [&]<typename T>() {
    const T a = static_cast<T>(s);
    UnaryLoop<T, T>(dst, dst, [a](T x) { return x * a; });
  });
  dst.storage()->BumpVersion();
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  GW_CHECK(a.sizes() == b.sizes(), "MaxAbsDiff", "shapes ", ShapeToString(a.sizes()), " and ",
           ShapeToString(b.sizes()), " differ");
  const std::vector<double> x = a.ToVector<double>(), y = b.ToVector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(x[i] - y[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

bool AllClose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.sizes() != b.sizes()) return false;
  const std::vector<double> x = a.ToVector<double>(), y = b.ToVector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(std::abs(x[i] - y[i]) <= atol + rtol * std::abs(y[i]))) return false;
  }
  return true;
}

}  // namespace gw::kernels
