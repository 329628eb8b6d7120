// Differentiable wrappers over gw::kernels: forward with kernels, backward recorded
// through autograd::Record. Each backward computes only the gradients some input needs.
#include "gradwire/autograd/functions.h"

#include <algorithm>

#include "gradwire/autograd/function.h"
#include "gradwire/tensor/kernels.h"

namespace gw {
namespace {

using autograd::Record;
using autograd::SavedTensor;
namespace k = kernels;

bool Needs(const Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace

// ---------------------------------------------------------------- element-wise

Tensor Add(const Tensor& a, const Tensor& b) {
  return Record("AddBackward", {a, b}, k::Add(a, b),
                [sa = a.sizes(), sb = b.sizes()](const Tensor& g) -> std::vector<Tensor> {
                  return {k::SumToShape(g, sa), k::SumToShape(g, sb)};
                });
}

Tensor Sub(const Tensor& a, const Tensor& b) {
  return Record("SubBackward", {a, b}, k::Sub(a, b),
                [sa = a.sizes(), sb = b.sizes()](const Tensor& g) -> std::vector<Tensor> {
                  return {k::SumToShape(g, sa), k::SumToShape(k::Neg(g), sb)};
                });
}

Tensor Mul(const Tensor& a, const Tensor& b) {
  return Record("MulBackward", {a, b}, k::Mul(a, b),
                [sa = SavedTensor(a), sb = SavedTensor(b), na = Needs(a),
                 nb = Needs(b)](const Tensor& g) -> std::vector<Tensor> {
                  const Tensor& x = sa.Get("MulBackward");
                  const Tensor& y = sb.Get("MulBackward");
                  return {na ? k::SumToShape(k::Mul(g, y), x.sizes()) : Tensor(),
                          nb ? k::SumToShape(k::Mul(g, x), y.sizes()) : Tensor()};
                });
}

Tensor Div(const Tensor& a, const Tensor& b) {
  return Record("DivBackward", {a, b}, k::Div(a, b),
                [sa = SavedTensor(a), sb = SavedTensor(b), na = Needs(a),
                 nb = Needs(b)](const Tensor& g) -> std::vector<Tensor> {
                  const Tensor& x = sa.Get("DivBackward");
                  const Tensor& y = sb.Get("DivBackward");
                  Tensor gb;
                  if (nb) {
                    gb = k::SumToShape(k::Neg(k::Div(k::Mul(g, x), k::Mul(y, y))), y.sizes());
                  }
                  return {na ? k::SumToShape(k::Div(g, y), x.sizes()) : Tensor(), gb};
                });
}

Tensor Pow(const Tensor& a, const Tensor& b) {
  Tensor out = k::Pow(a, b);
  return Record("PowBackward", {a, b}, out,
                [sa = SavedTensor(a), sb = SavedTensor(b), so = SavedTensor(out),
                 na = Needs(a), nb = Needs(b)](const Tensor& g) -> std::vector<Tensor> {
                  const Tensor& x = sa.Get("PowBackward");
                  const Tensor& y = sb.Get("PowBackward");
                  Tensor ga, gb;
                  if (na) {
                    ga = k::SumToShape(k::Mul(g, k::Mul(y, k::Pow(x, k::AddScalar(y, -1)))),
                                       x.sizes());
                  }
                  if (nb) {
                    gb = k::SumToShape(k::Mul(g, k::Mul(so.Get("PowBackward"), k::Log(x))),
                                       y.sizes());
                  }
                  return {ga, gb};
                });
}

Tensor Pow(const Tensor& a, double e) {
  return Record("PowScalarBackward", {a}, k::PowScalar(a, e),
                [sa = SavedTensor(a), e](const Tensor& g) -> std::vector<Tensor> {
                  const Tensor& x = sa.Get("PowScalarBackward");
                  if (e == 0) return {Tensor::Zeros(x.sizes(), x.dtype(), x.device())};  // not 0 * x^-1
                  return {k::Mul(g, k::MulScalar(k::PowScalar(x, e - 1), e))};
                });
}

Tensor AddScalar(const Tensor& a, double s) {
  return Record("AddScalarBackward", {a}, k::AddScalar(a, s),
                [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor MulScalar(const Tensor& a, double s) {
  return Record("MulScalarBackward", {a}, k::MulScalar(a, s),
                [s](const Tensor& g) -> std::vector<Tensor> { return {k::MulScalar(g, s)}; });
}

Tensor Neg(const Tensor& a) {
  return Record("NegBackward", {a}, k::Neg(a),
                [](const Tensor& g) -> std::vector<Tensor> { return {k::Neg(g)}; });
}

Tensor Exp(const Tensor& a) {
  Tensor out = k::Exp(a);
  return Record("ExpBackward", {a}, out,
                [so = SavedTensor(out)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::Mul(g, so.Get("ExpBackward"))};
                });
}

Tensor Log(const Tensor& a) {
  return Record("LogBackward", {a}, k::Log(a),
                [sa = SavedTensor(a)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::Div(g, sa.Get("LogBackward"))};
                });
}

Tensor Sqrt(const Tensor& a) {
  Tensor out = k::Sqrt(a);
  return Record("SqrtBackward", {a}, out,
                [so = SavedTensor(out)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::Div(g, k::MulScalar(so.Get("SqrtBackward"), 2))};
                });
}

Tensor Relu(const Tensor& a) {
  Tensor out = k::Relu(a);
  return Record("ReluBackward", {a}, out,
                [so = SavedTensor(out)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::ReluBackward(g, so.Get("ReluBackward"))};
                });
}

Tensor Tanh(const Tensor& a) {
  Tensor out = k::Tanh(a);
  return Record("TanhBackward", {a}, out,
                [so = SavedTensor(out)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::TanhBackward(g, so.Get("TanhBackward"))};
                });
}

Tensor Sigmoid(const Tensor& a) {
  Tensor out = k::Sigmoid(a);
  return Record("SigmoidBackward", {a}, out,
                [so = SavedTensor(out)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::SigmoidBackward(g, so.Get("SigmoidBackward"))};
                });
}

Tensor Erf(const Tensor& a) {
  return Record("ErfBackward", {a}, k::Erf(a),
                [sa = SavedTensor(a)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::ErfBackward(g, sa.Get("ErfBackward"))};
                });
}

Tensor Gelu(const Tensor& a, GeluApproximate approximate) {
  return Record("GeluBackward", {a}, k::Gelu(a, approximate),
                [sa = SavedTensor(a), approximate](const Tensor& g) -> std::vector<Tensor> {
                  return {k::GeluBackward(g, sa.Get("GeluBackward"), approximate)};
                });
}

Tensor Silu(const Tensor& a) {
  return Record("SiluBackward", {a}, k::Silu(a),
                [sa = SavedTensor(a)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::SiluBackward(g, sa.Get("SiluBackward"))};
                });
}

Tensor operator+(const Tensor& a, const Tensor& b) { return Add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return Sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return Mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return Div(a, b); }
Tensor operator-(const Tensor& a) { return Neg(a); }
Tensor operator+(const Tensor& a, double s) { return AddScalar(a, s); }
Tensor operator+(double s, const Tensor& a) { return AddScalar(a, s); }
Tensor operator-(const Tensor& a, double s) { return AddScalar(a, -s); }
Tensor operator-(double s, const Tensor& a) { return AddScalar(Neg(a), s); }
Tensor operator*(const Tensor& a, double s) { return MulScalar(a, s); }
Tensor operator*(double s, const Tensor& a) { return MulScalar(a, s); }
Tensor operator/(const Tensor& a, double s) { return MulScalar(a, 1.0 / s); }

// ---------------------------------------------------------------- reductions

namespace {

// Re-inserts the reduced dims of a non-keepdim reduction so `g` broadcasts to `sizes`.
Tensor UnreduceGrad(const Tensor& g, const Shape& sizes, const Shape& dims, bool keepdim) {
  Tensor out = g;
  if (!keepdim) {
    const int64_t nd = static_cast<int64_t>(sizes.size());
    std::vector<int64_t> norm;
    if (dims.empty()) {
      for (int64_t i = 0; i < nd; ++i) norm.push_back(i);
    } else {
      for (int64_t d : dims) norm.push_back(NormalizeDim("Sum", d, nd));
    }
    std::sort(norm.begin(), norm.end());
    for (int64_t d : norm) {
      if (nd > 0) out = k::Unsqueeze(out, d);
    }
  }
  return k::Expand(out, sizes);
}

}  // namespace

Tensor Sum(const Tensor& t, const Shape& dims, bool keepdim) {
  return Record("SumBackward", {t}, k::Sum(t, dims, keepdim),
                [sizes = t.sizes(), dims, keepdim](const Tensor& g) -> std::vector<Tensor> {
                  return {UnreduceGrad(g, sizes, dims, keepdim)};
                });
}

Tensor Mean(const Tensor& t, const Shape& dims, bool keepdim) {
  Tensor out = k::Mean(t, dims, keepdim);
  const double count = out.numel() == 0 ? 1.0 : static_cast<double>(t.numel() / out.numel());
  return Record("MeanBackward", {t}, out,
                [sizes = t.sizes(), dims, keepdim, count](const Tensor& g) -> std::vector<Tensor> {
                  return {UnreduceGrad(k::MulScalar(g, 1.0 / count), sizes, dims, keepdim)};
                });
}

Tensor Var(const Tensor& t, const Shape& dims, double correction, bool keepdim) {
  Tensor out = k::Var(t, dims, correction, keepdim);
  const double count = out.numel() == 0 ? 0.0 : static_cast<double>(t.numel() / out.numel());
  return Record("VarBackward", {t}, out,
                [st = SavedTensor(t), dims, keepdim,
                 scale = 2.0 / std::max(0.0, count - correction)](const Tensor& g) -> std::vector<Tensor> {
                  // d var / dx = 2 (x - mean) / (N - correction)
                  const Tensor& x = st.Get("VarBackward");
                  Tensor centered = k::Sub(x, k::Mean(x, dims, /*keepdim=*/true));
                  return {k::Mul(k::MulScalar(centered, scale),
                                 UnreduceGrad(g, x.sizes(), dims, keepdim))};
                });
}

Tensor Max(const Tensor& t, int64_t dim, bool keepdim) {
  auto [values, indices] = k::Max(t, dim, keepdim);
  return Record("MaxBackward", {t}, values,
                [sizes = t.sizes(), dtype = t.dtype(), dim, keepdim,
                 idx = indices](const Tensor& g) -> std::vector<Tensor> {
                  const int64_t nd = static_cast<int64_t>(sizes.size());
                  if (nd == 0) return {g};
                  const int64_t d = NormalizeDim("MaxBackward", dim, nd);
                  Tensor gk = keepdim ? g : k::Unsqueeze(g, d);
                  Tensor ik = keepdim ? idx : k::Unsqueeze(idx, d);
                  Shape pos_shape(nd, 1);
                  pos_shape[d] = sizes[d];
                  Tensor pos = k::Reshape(Tensor::Arange(0, sizes[d]), pos_shape);
                  Tensor mask = k::ToDType(k::Eq(pos, ik), dtype);
                  return {k::Mul(mask, gk)};
                });
}

// ---------------------------------------------------------------- linear algebra

Tensor MatMul(const Tensor& a, const Tensor& b) {
  GW_CHECK(a.defined() && b.defined(), "MatMul", "called with an undefined tensor");
  if (a.dim() == 1 && b.dim() == 1) return Reshape(MatMul(Unsqueeze(a, 0), Unsqueeze(b, 1)), {});
  if (a.dim() == 1) return Squeeze(MatMul(Unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return Squeeze(MatMul(a, Unsqueeze(b, 1)), -1);
  return Record("MatMulBackward", {a, b}, k::MatMul(a, b),
                [sa = SavedTensor(a), sb = SavedTensor(b), na = Needs(a),
                 nb = Needs(b)](const Tensor& g) -> std::vector<Tensor> {
                  const Tensor& x = sa.Get("MatMulBackward");
                  const Tensor& y = sb.Get("MatMulBackward");
                  Tensor ga, gb;
                  if (na) ga = k::SumToShape(k::MatMul(g, k::Transpose(y, -1, -2)), x.sizes());
                  if (nb && y.dim() == 2) {
                    // x [..., m, k] against a matrix: one GEMM over the folded batch.
                    gb = Tensor::Empty(y.sizes(), g.dtype(), g.device());
                    k::Gemm(true, false, 1.0, k::Flatten2D(x), k::Flatten2D(g), 0.0, gb);
                  } else if (nb) {
                    gb = k::SumToShape(k::MatMul(k::Transpose(x, -1, -2), g), y.sizes());
                  }
                  return {ga, gb};
                });
}

Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  return Record(
      "LinearBackward", {x, w, bias}, k::Linear(x, w, bias),
      [sx = SavedTensor(x), sw = SavedTensor(w), nx = Needs(x), nw = Needs(w),
       nb = Needs(bias)](const Tensor& g) -> std::vector<Tensor> {
        const Tensor& xv = sx.Get("LinearBackward");
        const Tensor& wv = sw.Get("LinearBackward");
        Tensor g2 = k::Flatten2D(g);
        Tensor gx, gw, gb;
        if (nx) {
          gx = Tensor::Empty({g2.sizes()[0], wv.sizes()[1]}, g.dtype(), g.device());
          k::Gemm(false, false, 1.0, g2, wv, 0.0, gx);
          gx = k::Reshape(gx, xv.sizes());
        }
        if (nw) {
          gw = Tensor::Empty(wv.sizes(), g.dtype(), g.device());
          k::Gemm(true, false, 1.0, g2, k::Flatten2D(xv), 0.0, gw);
        }
        if (nb) gb = k::Sum(g2, {0});
        return {gx, gw, gb};
      });
}

// ---------------------------------------------------------------- softmax family

Tensor Softmax(const Tensor& t, int64_t dim) {
  Tensor out = k::Softmax(t, dim);
  return Record("SoftmaxBackward", {t}, out,
                [so = SavedTensor(out), dim](const Tensor& g) -> std::vector<Tensor> {
                  return {k::SoftmaxBackward(g, so.Get("SoftmaxBackward"), dim)};
                });
}

Tensor LogSoftmax(const Tensor& t, int64_t dim) {
  Tensor out = k::LogSoftmax(t, dim);
  return Record("LogSoftmaxBackward", {t}, out,
                [so = SavedTensor(out), dim](const Tensor& g) -> std::vector<Tensor> {
                  return {k::LogSoftmaxBackward(g, so.Get("LogSoftmaxBackward"), dim)};
                });
}

// ---------------------------------------------------------------- shape

Tensor Reshape(const Tensor& t, Shape sizes) {
  return Record("ReshapeBackward", {t}, k::Reshape(t, std::move(sizes)),
                [in = t.sizes()](const Tensor& g) -> std::vector<Tensor> {
                  return {k::Reshape(g, in)};
                });
}

Tensor Transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  return Record("TransposeBackward", {t}, k::Transpose(t, dim0, dim1),
                [dim0, dim1](const Tensor& g) -> std::vector<Tensor> {
                  return {k::Transpose(g, dim0, dim1)};
                });
}

Tensor Permute(const Tensor& t, const Shape& dims) {
  Tensor out = k::Permute(t, dims);
  Shape inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    inverse[NormalizeDim("Permute", dims[i], t.dim())] = static_cast<int64_t>(i);
  }
  return Record("PermuteBackward", {t}, out, [inverse](const Tensor& g) -> std::vector<Tensor> {
    return {k::Permute(g, inverse)};
  });
}

Tensor Narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  return Record("NarrowBackward", {t}, k::Narrow(t, dim, start, length),
                [sizes = t.sizes(), dim, start, length](const Tensor& g) -> std::vector<Tensor> {
                  Tensor gi = Tensor::Zeros(sizes, g.dtype(), g.device());
                  k::CopyInPlace(k::Narrow(gi, dim, start, length), g);
                  return {gi};
                });
}

Tensor Select(const Tensor& t, int64_t dim, int64_t index) {
  return Record("SelectBackward", {t}, k::Select(t, dim, index),
                [sizes = t.sizes(), dim, index](const Tensor& g) -> std::vector<Tensor> {
                  Tensor gi = Tensor::Zeros(sizes, g.dtype(), g.device());
                  k::CopyInPlace(k::Select(gi, dim, index), g);
                  return {gi};
                });
}

Tensor Expand(const Tensor& t, const Shape& sizes) {
  return Record("ExpandBackward", {t}, k::Expand(t, sizes),
                [in = t.sizes()](const Tensor& g) -> std::vector<Tensor> {
                  return {k::SumToShape(g, in)};
                });
}

Tensor Squeeze(const Tensor& t, int64_t dim) {
  return Record("SqueezeBackward", {t}, k::Squeeze(t, dim),
                [in = t.sizes()](const Tensor& g) -> std::vector<Tensor> {
                  return {k::Reshape(g, in)};
                });
}

Tensor Unsqueeze(const Tensor& t, int64_t dim) {
  return Record("UnsqueezeBackward", {t}, k::Unsqueeze(t, dim),
                [in = t.sizes()](const Tensor& g) -> std::vector<Tensor> {
                  return {k::Reshape(g, in)};
                });
}

Tensor To(const Tensor& t, Device device) {
  Tensor out = k::ToDevice(t, device);
  if (out.is_same(t)) return t;
  return Record("ToBackward", {t}, out,
                [from = t.device()](const Tensor& g) -> std::vector<Tensor> { return {k::ToDevice(g, from)}; });
}

Tensor Contiguous(const Tensor& t) {
  Tensor out = k::Contiguous(t);
  if (out.is_same(t)) return t;
  return Record("ContiguousBackward", {t}, out,
                [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor Flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  return Record("FlattenBackward", {t}, k::Flatten(t, start_dim, end_dim),
                [in = t.sizes()](const Tensor& g) -> std::vector<Tensor> {
                  return {k::Reshape(g, in)};
                });
}

namespace {

// The kernel's consecutive pieces of t along `dim`, each re-made as a differentiable Narrow.
std::vector<Tensor> AsNarrows(const Tensor& t, std::vector<Tensor> pieces, int64_t dim) {
  const int64_t d = NormalizeDim("Split", dim, t.dim());
  int64_t start = 0;
  for (Tensor& piece : pieces) {
    const int64_t length = piece.sizes()[d];
    piece = Narrow(t, d, start, length);
    start += length;
  }
  return pieces;
}

}  // namespace

std::vector<Tensor> Split(const Tensor& t, int64_t split_size, int64_t dim) {
  return AsNarrows(t, k::Split(t, split_size, dim), dim);
}

std::vector<Tensor> Split(const Tensor& t, const Shape& sizes, int64_t dim) {
  return AsNarrows(t, k::Split(t, sizes, dim), dim);
}

std::vector<Tensor> Chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  return AsNarrows(t, k::Chunk(t, chunks, dim), dim);
}

// ---------------------------------------------------------------- indexing

Tensor IndexSelect(const Tensor& t, int64_t dim, const Tensor& index) {
  return Record("IndexSelectBackward", {t}, k::IndexSelect(t, dim, index),
                [sizes = t.sizes(), dim, si = SavedTensor(index)](const Tensor& g) -> std::vector<Tensor> {
                  Tensor gi = Tensor::Zeros(sizes, g.dtype(), g.device());
                  k::IndexAddInPlace(gi, dim, si.Get("IndexSelectBackward"), g);
                  return {gi};
                });
}

Tensor IndexAdd(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src) {
  return Record("IndexAddBackward", {t, src}, k::IndexAdd(t, dim, index, src),
                [dim, si = SavedTensor(index)](const Tensor& g) -> std::vector<Tensor> {
                  return {g, k::IndexSelect(g, dim, si.Get("IndexAddBackward"))};
                });
}

Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = k::Cat(tensors, dim);
  const int64_t d = NormalizeDim("Cat", dim, out.dim());
  std::vector<int64_t> lengths;
  for (const Tensor& t : tensors) lengths.push_back(t.sizes()[d]);
  return Record("CatBackward", tensors, out, [d, lengths](const Tensor& g) -> std::vector<Tensor> {
    std::vector<Tensor> grads;
    int64_t offset = 0;
    for (int64_t len : lengths) {
      grads.push_back(k::Narrow(g, d, offset, len));
      offset += len;
    }
    return grads;
  });
}

Tensor Stack(const std::vector<Tensor>& tensors, int64_t dim) {
  GW_CHECK(!tensors.empty(), "Stack", "needs at least one tensor");
  std::vector<Tensor> expanded;
  const int64_t d = NormalizeDim("Stack", dim, tensors[0].dim() + 1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    GW_CHECK(tensors[i].defined() && tensors[i].sizes() == tensors[0].sizes(), "Stack",
             "tensor ", i, " has shape ",
             tensors[i].defined() ? ShapeToString(tensors[i].sizes()) : "undefined",
             " but tensor 0 has shape ", ShapeToString(tensors[0].sizes()));
    expanded.push_back(Unsqueeze(tensors[i], d));
  }
  return Cat(expanded, d);
}

Tensor Gather(const Tensor& t, int64_t dim, const Tensor& index) {
  return Record("GatherBackward", {t}, k::Gather(t, dim, index),
                [sizes = t.sizes(), dim, si = SavedTensor(index)](const Tensor& g) -> std::vector<Tensor> {
                  Tensor gi = Tensor::Zeros(sizes, g.dtype(), g.device());
                  k::ScatterAddInPlace(gi, dim, si.Get("GatherBackward"), g);
                  return {gi};
                });
}

// ---------------------------------------------------------------- selection

Tensor MaskedFill(const Tensor& t, const Tensor& mask, double value) {
  return Record("MaskedFillBackward", {t}, k::MaskedFill(t, mask, value),
                [sizes = t.sizes(), sm = SavedTensor(mask)](const Tensor& g) -> std::vector<Tensor> {
                  return {k::SumToShape(k::MaskedFill(g, sm.Get("MaskedFillBackward"), 0), sizes)};
                });
}

Tensor Where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  return Record("WhereBackward", {a, b}, k::Where(mask, a, b),
                [sa = a.sizes(), sb = b.sizes(), sm = SavedTensor(mask), na = Needs(a),
                 nb = Needs(b)](const Tensor& g) -> std::vector<Tensor> {
                  const Tensor& m = sm.Get("WhereBackward");
                  const Tensor zero = Tensor::Zeros({}, g.dtype(), g.device());
                  return {na ? k::SumToShape(k::Where(m, g, zero), sa) : Tensor(),
                          nb ? k::SumToShape(k::MaskedFill(g, m, 0), sb) : Tensor()};
                });
}

// ---------------------------------------------------------------- dropout

namespace {

// x * mask, where the mask (made here, never modified) is the whole backward.
Tensor ApplyDropoutMask(const char* name, const Tensor& x, Tensor mask) {
  Tensor out = k::Mul(x, mask);
  return Record(name, {x}, out, [mask = std::move(mask)](const Tensor& g) -> std::vector<Tensor> {
    return {k::Mul(g, mask)};
  });
}

}  // namespace

Tensor Dropout(const Tensor& x, double p, bool training, Generator& gen) {
  GW_CHECK(p >= 0 && p <= 1, "Dropout", "p must be in [0, 1], got ", p);
  if (!training || p == 0) return x;
  GW_CHECK(x.defined(), "Dropout", "called with an undefined tensor");
  return ApplyDropoutMask("DropoutBackward", x, k::DropoutMask(x.sizes(), p, x.dtype(), gen));
}

Tensor FeatureDropout(const Tensor& x, double p, bool training, Generator& gen) {
  GW_CHECK(p >= 0 && p <= 1, "FeatureDropout", "p must be in [0, 1], got ", p);
  GW_CHECK(x.defined() && x.dim() >= 2, "FeatureDropout", "expected input [N, C, ...], got ",
           x.defined() ? ShapeToString(x.sizes()) : "undefined");
  if (!training || p == 0) return x;
  Shape mask_sizes(x.dim(), 1);
  mask_sizes[0] = x.sizes()[0];
  mask_sizes[1] = x.sizes()[1];
  return ApplyDropoutMask("FeatureDropoutBackward", x,
                          k::DropoutMask(mask_sizes, p, x.dtype(), gen));
}

}  // namespace gw
