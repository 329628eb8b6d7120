// Element-wise kernels: arithmetic, comparisons, unary math, in-place updates.
#include <cmath>
#include <cstring>

#include "dispatch.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

using internal::BinaryLoop;
using internal::CheckDefined;
using internal::UnaryLoop;

template <typename Op>
Tensor Arith(std::string_view name, const Tensor& a, const Tensor& b, Op op) {
  CheckDefined(name, a);
  CheckDefined(name, b);
  internal::CheckSameDType(name, a, b);
  Tensor out = Tensor::Empty(BroadcastShapes(name, a.sizes(), b.sizes()), a.dtype());
  internal::DispatchNumeric(name, a.dtype(), [&]<typename T>() {
    BinaryLoop<T, T, T>(out, a, b, [&](T x, T y) { return op(x, y); });
  });
  return out;
}

template <typename Op>
Tensor Compare(std::string_view name, const Tensor& a, const Tensor& b, Op op) {
  CheckDefined(name, a);
  CheckDefined(name, b);
  internal::CheckSameDType(name, a, b);
  Tensor out = Tensor::Empty(BroadcastShapes(name, a.sizes(), b.sizes()), DType::kBool);
  internal::DispatchAll(a.dtype(), [&]<typename T>() {
    BinaryLoop<bool, T, T>(out, a, b, [&](T x, T y) { return op(x, y); });
  });
  return out;
}

template <typename Op>
Tensor FloatUnary(std::string_view name, const Tensor& a, Op op) {
  CheckDefined(name, a);
  Tensor out = Tensor::Empty(a.sizes(), a.dtype());
  internal::DispatchFloating(name, a.dtype(), [&]<typename T>() {
    UnaryLoop<T, T>(out, a, [&](T x) { return static_cast<T>(op(x)); });
  });
  return out;
}

template <typename Op>
Tensor NumericUnary(std::string_view name, const Tensor& a, Op op) {
  CheckDefined(name, a);
  Tensor out = Tensor::Empty(a.sizes(), a.dtype());
  internal::DispatchNumeric(name, a.dtype(), [&]<typename T>() {
    UnaryLoop<T, T>(out, a, [&](T x) { return static_cast<T>(op(x)); });
  });
  return out;
}

// grad * f(out), both shaped like out.
template <typename Op>
Tensor BackwardFromOutput(std::string_view name, const Tensor& grad, const Tensor& out, Op op) {
  CheckDefined(name, grad);
  CheckDefined(name, out);
  internal::CheckSameDType(name, grad, out);
  Tensor result = Tensor::Empty(BroadcastShapes(name, grad.sizes(), out.sizes()), out.dtype());
  internal::DispatchFloating(name, out.dtype(), [&]<typename T>() {
    BinaryLoop<T, T, T>(result, grad, out, [&](T g, T y) { return static_cast<T>(op(g, y)); });
  });
  return result;
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

}  // namespace

Tensor Add(const Tensor& a, const Tensor& b) { return Arith("Add", a, b, [](auto x, auto y) { return x + y; }); }
Tensor Sub(const Tensor& a, const Tensor& b) { return Arith("Sub", a, b, [](auto x, auto y) { return x - y; }); }
Tensor Mul(const Tensor& a, const Tensor& b) { return Arith("Mul", a, b, [](auto x, auto y) { return x * y; }); }
Tensor Div(const Tensor& a, const Tensor& b) {
  return Arith("Div", a, b, [](auto x, auto y) { return CheckedIntDiv(x, y); });
}
Tensor Pow(const Tensor& a, const Tensor& b) {
  return Arith("Pow", a, b, [](auto x, auto y) { return static_cast<decltype(x)>(std::pow(x, y)); });
}
Tensor Maximum(const Tensor& a, const Tensor& b) {
  return Arith("Maximum", a, b, [](auto x, auto y) { return x > y || std::isnan(static_cast<double>(x)) ? x : y; });
}

Tensor Eq(const Tensor& a, const Tensor& b) { return Compare("Eq", a, b, [](auto x, auto y) { return x == y; }); }
Tensor Ne(const Tensor& a, const Tensor& b) { return Compare("Ne", a, b, [](auto x, auto y) { return x != y; }); }
Tensor Lt(const Tensor& a, const Tensor& b) { return Compare("Lt", a, b, [](auto x, auto y) { return x < y; }); }
Tensor Le(const Tensor& a, const Tensor& b) { return Compare("Le", a, b, [](auto x, auto y) { return x <= y; }); }
Tensor Gt(const Tensor& a, const Tensor& b) { return Compare("Gt", a, b, [](auto x, auto y) { return x > y; }); }
Tensor Ge(const Tensor& a, const Tensor& b) { return Compare("Ge", a, b, [](auto x, auto y) { return x >= y; }); }

Tensor Where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  CheckDefined("Where", mask);
  GW_CHECK(mask.dtype() == DType::kBool, "Where", "mask must be bool, got ",
           DTypeName(mask.dtype()));
  internal::CheckSameDType("Where", a, b);
  Shape sizes = BroadcastShapes("Where", BroadcastShapes("Where", mask.sizes(), a.sizes()),
                                b.sizes());
  Tensor out = Tensor::Empty(sizes, a.dtype());
  Tensor ea = Expand(a, sizes), eb = Expand(b, sizes), em = Expand(mask, sizes);
  internal::DispatchAll(a.dtype(), [&]<typename T>() {
    // out = a, then overwrite where !mask.
    UnaryLoop<T, T>(out, ea, [](T x) { return x; });
    T* po = out.data<T>();
    const T* pb = eb.data<T>();
    const bool* pm = em.data<bool>();
    auto loop = internal::MakeLoop<3>(sizes, {out.strides(), eb.strides(), em.strides()});
    internal::RunLoop(loop, [&](const std::array<int64_t, 3>& off, int64_t n,
                                const std::array<int64_t, 3>& s) {
      for (int64_t i = 0; i < n; ++i) {
        if (!pm[off[2] + i * s[2]]) po[off[0] + i * s[0]] = pb[off[1] + i * s[1]];
      }
    });
  });
  return out;
}

Tensor AddScalar(const Tensor& a, double s) {
  return NumericUnary("AddScalar", a, [s](auto x) { return x + static_cast<decltype(x)>(s); });
}
Tensor MulScalar(const Tensor& a, double s) {
  return NumericUnary("MulScalar", a, [s](auto x) { return x * static_cast<decltype(x)>(s); });
}
Tensor PowScalar(const Tensor& a, double e) {
  if (e == 2.0) return FloatUnary("PowScalar", a, [](auto x) { return x * x; });
  return FloatUnary("PowScalar", a, [e](auto x) { return std::pow(x, static_cast<decltype(x)>(e)); });
}
Tensor Neg(const Tensor& a) { return NumericUnary("Neg", a, [](auto x) { return -x; }); }
Tensor Abs(const Tensor& a) { return NumericUnary("Abs", a, [](auto x) { return x < 0 ? -x : x; }); }
Tensor Exp(const Tensor& a) { return FloatUnary("Exp", a, [](auto x) { return std::exp(x); }); }
Tensor Log(const Tensor& a) { return FloatUnary("Log", a, [](auto x) { return std::log(x); }); }
Tensor Sqrt(const Tensor& a) { return FloatUnary("Sqrt", a, [](auto x) { return std::sqrt(x); }); }
Tensor Relu(const Tensor& a) {
  return FloatUnary("Relu", a, [](auto x) { return x > 0 ? x : decltype(x){0}; });
}
Tensor Tanh(const Tensor& a) { return FloatUnary("Tanh", a, [](auto x) { return std::tanh(x); }); }
Tensor Sigmoid(const Tensor& a) {
  return FloatUnary("Sigmoid", a, [](auto x) {
    using T = decltype(x);
    return x >= 0 ? T{1} / (T{1} + std::exp(-x)) : std::exp(x) / (T{1} + std::exp(x));
  });
}

Tensor ReluBackward(const Tensor& grad, const Tensor& out) {
  return BackwardFromOutput("ReluBackward", grad, out,
                            [](auto g, auto y) { return y > 0 ? g : decltype(g){0}; });
}
Tensor TanhBackward(const Tensor& grad, const Tensor& out) {
  return BackwardFromOutput("TanhBackward", grad, out, [](auto g, auto y) { return g * (1 - y * y); });
}
Tensor SigmoidBackward(const Tensor& grad, const Tensor& out) {
  return BackwardFromOutput("SigmoidBackward", grad, out, [](auto g, auto y) { return g * y * (1 - y); });
}

void Fill(const Tensor& dst, double value) {
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
  CheckDefined(op, dst);
  CheckDefined(op, src);
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
  const Tensor src = PrepareInPlace("CopyInPlace", dst, src_in);
  if (dst.is_contiguous() && src.is_contiguous() && dst.sizes() == src.sizes()) {
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
  internal::DispatchNumeric("AddInPlace", dst.dtype(), [&]<typename T>() {
    const T a = static_cast<T>(alpha);
    BinaryLoop<T, T, T>(dst, dst, src, [a](T x, T y) { return x + a * y; });
  });
  dst.storage()->BumpVersion();
}

void ScaleInPlace(const Tensor& dst, double s) {
  PrepareInPlace("ScaleInPlace", dst, dst);
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
