// Conv2d and ConvTranspose2d: float32 on oneDNN's convolution primitives, float64 (any
// floating type) on im2col + GEMM. Both are written once, over the geometry of a plain
// convolution: a transposed convolution is that convolution's adjoint (its forward is the
// convolution's backward-data, its backward-data the convolution's forward).
#include "gradwire/tensor/convolution.h"

#include <algorithm>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "dispatch.h"
#include "dnnl_util.h"
#include "gradwire/tensor/kernels.h"

namespace gw {

std::string Size2::ToString() const { return absl::StrCat("(", h, ", ", w, ")"); }

namespace kernels {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// A convolution from x [n, c, h, w] to y [n, oc, oh, ow] with weight [oc, c / g, kh, kw].
// `extra` (the transposed convolution's output_padding) is the part of x past the last
// window: x spans (oh - 1) * stride + dilated kernel - 2 * padding + extra rows.
struct Geometry {
  int64_t n, c, h, w, oc, kh, kw, oh, ow, groups;
  Size2 stride, padding, dilation, extra;

  int64_t cg() const { return c / groups; }
  int64_t ocg() const { return oc / groups; }
  Shape x_sizes() const { return {n, c, h, w}; }
  Shape y_sizes() const { return {n, oc, oh, ow}; }
  Shape w_sizes() const { return {oc, c / groups, kh, kw}; }
  std::vector<int64_t> Key() const {
    return {n, c, h, w, oc, kh, kw, oh, ow, groups, stride.h, stride.w, padding.h, padding.w,
            dilation.h, dilation.w, extra.h, extra.w};
  }
};

std::string Describe(const Tensor& t) {
  return t.defined() ? ShapeToString(t.sizes()) : std::string("undefined");
}

void CheckArgs(std::string_view op, const Conv2dArgs& a) {
  GW_CHECK(a.stride.h > 0 && a.stride.w > 0 && a.dilation.h > 0 && a.dilation.w > 0 &&
               a.padding.h >= 0 && a.padding.w >= 0 && a.groups > 0 &&
               a.output_padding.h >= 0 && a.output_padding.w >= 0,
           op, "stride ", a.stride.ToString(), " and dilation ", a.dilation.ToString(),
           " must be positive, padding ", a.padding.ToString(), " and output_padding ",
           a.output_padding.ToString(), " non-negative, groups ", a.groups, " positive");
}

// Checks x [N, C, H, W] against weight [W0, W1, kH, kW] where the convolution maps
// `x_channels` = W1 * groups (Conv2d) or W0 (ConvTranspose2d) channels.
void CheckOperands(std::string_view op, const Tensor& x, const Tensor& weight,
                   const Tensor& bias, const Conv2dArgs& a, bool transposed) {
  internal::CheckDefined(op, x);
  internal::CheckDefined(op, weight);
  CheckArgs(op, a);
  GW_CHECK(weight.dim() == 4, op, "expected a 4-D weight, got ", Describe(weight));
  const int64_t in_channels = transposed ? weight.sizes()[0] : weight.sizes()[1] * a.groups;
  const int64_t out_channels = transposed ? weight.sizes()[1] * a.groups : weight.sizes()[0];
  GW_CHECK(x.dim() == 4, op, "expected input [N, ", in_channels, ", H, W], got ", Describe(x));
  GW_CHECK(x.sizes()[1] == in_channels, op, "input ", Describe(x), " has ", x.sizes()[1],
           " channels but weight ", Describe(weight), " with groups=", a.groups, " expects ",
           in_channels);
  GW_CHECK(weight.sizes()[0] % a.groups == 0, op, "weight ", Describe(weight), ": ",
           weight.sizes()[0], " channels are not divisible by groups=", a.groups);
  internal::CheckSameDType(op, x, weight);
  if (bias.defined()) {
    internal::CheckDefined(op, bias);
    internal::CheckSameDType(op, x, bias);
    GW_CHECK(bias.dim() == 1 && bias.sizes()[0] == out_channels, op, "bias ", Describe(bias),
             " does not match ", out_channels, " output channels of weight ",
             Describe(weight));
  }
  if (transposed) {
    GW_CHECK((a.output_padding.h < a.stride.h || a.output_padding.h < a.dilation.h) &&
                 (a.output_padding.w < a.stride.w || a.output_padding.w < a.dilation.w),
             op, "output_padding ", a.output_padding.ToString(),
             " must be smaller than stride ", a.stride.ToString(), " or dilation ",
             a.dilation.ToString());
  }
}

int64_t ConvOut(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

Geometry ConvGeometry(std::string_view op, const Tensor& x, const Tensor& weight,
                      const Conv2dArgs& a) {
  const Shape& xs = x.sizes();
  const Shape& ws = weight.sizes();
  const int64_t span_h = a.dilation.h * (ws[2] - 1) + 1, span_w = a.dilation.w * (ws[3] - 1) + 1;
  GW_CHECK(xs[2] + 2 * a.padding.h >= span_h && xs[3] + 2 * a.padding.w >= span_w, op, "input ",
           ShapeToString(xs), " padded by ", a.padding.ToString(), " is smaller than the ",
           "dilated kernel (", span_h, ", ", span_w, ") of weight ", ShapeToString(ws));
  return {xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3],
          ConvOut(xs[2], ws[2], a.stride.h, a.padding.h, a.dilation.h),
          ConvOut(xs[3], ws[3], a.stride.w, a.padding.w, a.dilation.w),
          a.groups, a.stride, a.padding, a.dilation, Size2(0)};
}

// The convolution whose adjoint is ConvTranspose2d(x, weight): its output is x.
Geometry TransposedGeometry(std::string_view op, const Tensor& x, const Tensor& weight,
                            const Conv2dArgs& a) {
  const Shape& xs = x.sizes();
  const Shape& ws = weight.sizes();
  const int64_t h = (xs[2] - 1) * a.stride.h - 2 * a.padding.h + a.dilation.h * (ws[2] - 1) +
                    a.output_padding.h + 1;
  const int64_t w = (xs[3] - 1) * a.stride.w - 2 * a.padding.w + a.dilation.w * (ws[3] - 1) +
                    a.output_padding.w + 1;
  GW_CHECK(h > 0 && w > 0, op, "input ", ShapeToString(xs), " with weight ", ShapeToString(ws),
           " and padding ", a.padding.ToString(), " gives an empty output (", h, ", ", w, ")");
  return {xs[0], ws[1] * a.groups, h, w, ws[0], ws[2], ws[3], xs[2], xs[3],
          a.groups, a.stride, a.padding, a.dilation, a.output_padding};
}

// ---------------------------------------------------------------- own loops (any T)

// col [c/g * kh * kw, oh * ow] of batch item `n`, group `grp` of x (any strides).
template <typename T>
void Im2Col(const Geometry& g, const Tensor& x, int64_t n, int64_t grp, T* col) {
  const T* px = x.data<T>();
  const Shape& st = x.strides();
  for (int64_t ci = 0; ci < g.cg(); ++ci) {
    const T* plane = px + n * st[0] + (grp * g.cg() + ci) * st[1];
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.stride.h - g.padding.h + ki * g.dilation.h;
          T* out = col + ((ci * g.kh + ki) * g.kw + kj) * g.oh * g.ow + oy * g.ow;
          if (iy < 0 || iy >= g.h) {
            std::fill(out, out + g.ow, T(0));
            continue;
          }
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const int64_t ix = ox * g.stride.w - g.padding.w + kj * g.dilation.w;
            out[ox] = ix < 0 || ix >= g.w ? T(0) : plane[iy * st[2] + ix * st[3]];
          }
        }
      }
    }
  }
}

// The adjoint of Im2Col: adds col into batch item `n`, group `grp` of the contiguous x.
template <typename T>
void Col2ImAdd(const Geometry& g, const T* col, int64_t n, int64_t grp, T* x) {
  for (int64_t ci = 0; ci < g.cg(); ++ci) {
    T* plane = x + (n * g.c + grp * g.cg() + ci) * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.stride.h - g.padding.h + ki * g.dilation.h;
          if (iy < 0 || iy >= g.h) continue;
          const T* in = col + ((ci * g.kh + ki) * g.kw + kj) * g.oh * g.ow + oy * g.ow;
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const int64_t ix = ox * g.stride.w - g.padding.w + kj * g.dilation.w;
            if (ix >= 0 && ix < g.w) plane[iy * g.w + ix] += in[ox];
          }
        }
      }
    }
  }
}

// The per-group matrices: weight as [oc, c/g * kh * kw] rows of group `grp`, and one
// batch item of y as [oc, oh * ow] rows of group `grp` (views of contiguous tensors).
Tensor GroupRows(const Tensor& t2d, int64_t grp, int64_t rows) {
  return Narrow(t2d, 0, grp * rows, rows);
}

template <typename T>
struct OwnConv {
  const Geometry& g;

  int64_t ColRows() const { return g.cg() * g.kh * g.kw; }
  Tensor Weight2D(const Tensor& w) const { return Reshape(Contiguous(w), {g.oc, ColRows()}); }
  Tensor Col() const { return Tensor::Empty({ColRows(), g.oh * g.ow}, DTypeOf<T>()); }

  Tensor Forward(const Tensor& x, const Tensor& w, const Tensor& bias) const {
    Tensor y = Tensor::Empty(g.y_sizes(), DTypeOf<T>());
    if (bias.defined()) {
      CopyInPlace(y, Reshape(bias, {g.oc, 1, 1}));
    }
    const Tensor w2 = Weight2D(w);
    Tensor col = Col();
    for (int64_t n = 0; n < g.n; ++n) {
      Tensor yn = Reshape(Select(y, 0, n), {g.oc, g.oh * g.ow});
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        Im2Col<T>(g, x, n, grp, col.data<T>());
        Gemm(false, false, 1.0, GroupRows(w2, grp, g.ocg()), col, bias.defined() ? 1.0 : 0.0,
             GroupRows(yn, grp, g.ocg()));
      }
    }
    return y;
  }

  Tensor BackwardData(const Tensor& gy, const Tensor& w) const {
    Tensor gx = Tensor::Zeros(g.x_sizes(), DTypeOf<T>());
    const Tensor w2 = Weight2D(w);
    const Tensor gyc = Contiguous(gy);
    Tensor col = Col();
    for (int64_t n = 0; n < g.n; ++n) {
      Tensor gyn = Reshape(Select(gyc, 0, n), {g.oc, g.oh * g.ow});
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        Gemm(true, false, 1.0, GroupRows(w2, grp, g.ocg()), GroupRows(gyn, grp, g.ocg()), 0.0,
             col);
        Col2ImAdd<T>(g, col.data<T>(), n, grp, gx.data<T>());
      }
    }
    return gx;
  }

  Tensor BackwardWeight(const Tensor& x, const Tensor& gy) const {
    Tensor gw2 = Tensor::Zeros({g.oc, ColRows()}, DTypeOf<T>());
    const Tensor gyc = Contiguous(gy);
    Tensor col = Col();
    for (int64_t n = 0; n < g.n; ++n) {
      Tensor gyn = Reshape(Select(gyc, 0, n), {g.oc, g.oh * g.ow});
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        Im2Col<T>(g, x, n, grp, col.data<T>());
        Gemm(false, true, 1.0, GroupRows(gyn, grp, g.ocg()), col, 1.0,
             GroupRows(gw2, grp, g.ocg()));
      }
    }
    return Reshape(gw2, g.w_sizes());
  }
};

// ---------------------------------------------------------------- oneDNN (float32)

memory::dims Dims(const Shape& s) { return memory::dims(s.begin(), s.end()); }

memory::desc AnyDesc(const Shape& sizes) {
  return memory::desc(Dims(sizes), memory::data_type::f32, Tag::any);
}

// oneDNN's weight shape: [g, oc/g, c/g, kh, kw] when grouped.
Shape DnnlWeightSizes(const Geometry& g) {
  if (g.groups == 1) return g.w_sizes();
  return {g.groups, g.ocg(), g.cg(), g.kh, g.kw};
}

// `weight`'s data as oneDNN's (grouped) weight, without a copy.
memory::desc WeightDesc(const Geometry& g, const Tensor& weight) {
  if (g.groups == 1) return internal::PlainDesc(weight);
  const Shape& st = weight.strides();
  return memory::desc(Dims(DnnlWeightSizes(g)), memory::data_type::f32,
                      {st[0] * g.ocg(), st[0], st[1], st[2], st[3]});
}

// The primitives of one geometry, and what their descriptors share.
struct DnnlConv {
  const Geometry& g;

  memory::dims Strides() const { return {g.stride.h, g.stride.w}; }
  memory::dims Dilates() const { return {g.dilation.h - 1, g.dilation.w - 1}; }
  memory::dims PadL() const { return {g.padding.h, g.padding.w}; }
  // The padding on the high side that makes oneDNN's size check hold: a transposed
  // convolution's output_padding (`extra`) lies past the last window.
  memory::dims PadR() const {
    return {g.padding.h - g.stride.h * (g.extra.h / g.stride.h),
            g.padding.w - g.stride.w * (g.extra.w / g.stride.w)};
  }
  memory::desc Bias() const { return memory::desc({g.oc}, memory::data_type::f32, Tag::x); }
  // oneDNN's "auto" lets it pick Winograd (2x faster for 3x3 stride-1 layers of 32 to 64
  // channels, measured), but it picks it for a one-channel input too, which Winograd pads
  // to 16 channels (6 ms instead of 0.3 ms for the W16 model's first layer): Winograd is
  // only worth it for 16 channels or more on both sides.
  dnnl::algorithm Algorithm() const {
    return g.cg() >= 16 && g.ocg() >= 16 ? dnnl::algorithm::convolution_auto
                                         : dnnl::algorithm::convolution_direct;
  }

  struct Fwd {
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward prim;
  };
  struct BwdData {
    dnnl::convolution_backward_data::primitive_desc pd;
    dnnl::convolution_backward_data prim;
  };
  struct BwdWeights {
    dnnl::convolution_backward_weights::primitive_desc pd;
    dnnl::convolution_backward_weights prim;
  };

  // Every primitive gets its scratchpad from the caller (Operands::Scratchpad): oneDNN's
  // own ("library" mode) is, in builds without DNNL_ENABLE_CONCURRENT_EXEC (Debian's,
  // OpenMP runtime), a thread-local buffer sized by the primitives created on the calling
  // thread, so a cached primitive run on another thread (an RPC handler's forward, the
  // autograd engine's backward) wrote past it (SIGSEGV in Winograd kernels, seen with
  // TutorialCnn served by examples/rpc_ps_fashion_mnist).
  static dnnl::primitive_attr UserScratchpad() {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  std::vector<int64_t> Key(bool bias) const {
    std::vector<int64_t> key = g.Key();
    key.push_back(bias);
    return key;
  }

  std::shared_ptr<const Fwd> Forward(bool bias) const {
    return internal::CachedPrimitive<Fwd>(Key(bias), [&] {
      const auto alg = Algorithm();
      const auto prop = dnnl::prop_kind::forward_training;
      const memory::desc x = AnyDesc(g.x_sizes()), w = AnyDesc(DnnlWeightSizes(g)),
                         y = AnyDesc(g.y_sizes());
      dnnl::convolution_forward::desc d =
          bias ? dnnl::convolution_forward::desc(prop, alg, x, w, Bias(), y, Strides(),
                                                 Dilates(), PadL(), PadR())
               : dnnl::convolution_forward::desc(prop, alg, x, w, y, Strides(), Dilates(),
                                                 PadL(), PadR());
      dnnl::convolution_forward::primitive_desc pd(d, UserScratchpad(), internal::CpuEngine());
      return Fwd{pd, dnnl::convolution_forward(pd)};
    });
  }

  std::shared_ptr<const BwdData> BackwardData() const {
    return internal::CachedPrimitive<BwdData>(Key(false), [&] {
      dnnl::convolution_backward_data::desc d(
          Algorithm(), AnyDesc(g.x_sizes()), AnyDesc(DnnlWeightSizes(g)),
          AnyDesc(g.y_sizes()), Strides(), Dilates(), PadL(), PadR());
      dnnl::convolution_backward_data::primitive_desc pd(d, UserScratchpad(), internal::CpuEngine(),
                                                         Forward(false)->pd);
      return BwdData{pd, dnnl::convolution_backward_data(pd)};
    });
  }

  std::shared_ptr<const BwdWeights> BackwardWeights(bool bias) const {
    return internal::CachedPrimitive<BwdWeights>(Key(bias), [&] {
      const auto alg = Algorithm();
      const memory::desc x = AnyDesc(g.x_sizes()), w = AnyDesc(DnnlWeightSizes(g)),
                         y = AnyDesc(g.y_sizes());
      dnnl::convolution_backward_weights::desc d =
          bias ? dnnl::convolution_backward_weights::desc(alg, x, w, Bias(), y, Strides(),
                                                          Dilates(), PadL(), PadR())
               : dnnl::convolution_backward_weights::desc(alg, x, w, y, Strides(), Dilates(),
                                                          PadL(), PadR());
      dnnl::convolution_backward_weights::primitive_desc pd(d, UserScratchpad(), internal::CpuEngine(),
                                                            Forward(bias)->pd);
      return BwdWeights{pd, dnnl::convolution_backward_weights(pd)};
    });
  }
};

// The operands of the primitives of one call: tensors reordered into the layouts the
// primitives want (each tensor once per layout, shared between primitives), and outputs
// written in a primitive's layout, then reordered into plain tensors.
class Operands {
 public:
  explicit Operands(dnnl::stream& stream) : stream_(stream) {}

  memory In(const Tensor& t, const memory::desc& want) {
    return In(t, internal::PlainDesc(t), want);
  }
  memory In(const Tensor& t, const memory::desc& have, const memory::desc& want) {
    for (const Seen& s : seen_) {
      if (s.data == t.raw_data() && s.have == have && s.mem.get_desc() == want) return s.mem;
    }
    memory mem = internal::ToLayoutScratch(memory(have, internal::CpuEngine(), t.raw_data()),
                                           want, stream_, keep_);
    seen_.push_back({t.raw_data(), have, mem});
    return mem;
  }

  // Memory in layout `want` for the plain tensor `dst`: dst itself when it has that layout.
  memory Out(const Tensor& dst, const memory::desc& want, const memory::desc& have) {
    if (have == want) return memory(have, internal::CpuEngine(), dst.raw_data());
    memory mem = internal::ScratchMemory(want, keep_);
    pending_.push_back({mem, memory(have, internal::CpuEngine(), dst.raw_data())});
    return mem;
  }
  memory Out(const Tensor& dst, const memory::desc& want) {
    return Out(dst, want, internal::PlainDesc(dst));
  }

  // The scratchpad a primitive of `pd` needs (none when it needs none).
  template <typename Pd>
  memory Scratchpad(const Pd& pd) {
    const memory::desc want = pd.scratchpad_desc();
    if (want.get_size() == 0) return memory(want, internal::CpuEngine(), nullptr);
    return internal::ScratchMemory(want, keep_);
  }

  // Reorders the outputs written in other layouts into their tensors.
  void Finish() {
    for (auto& [from, to] : pending_) {
      dnnl::reorder(from, to).execute(stream_, from, to);
      internal::ReorderCount().fetch_add(1, std::memory_order_relaxed);
    }
    pending_.clear();
  }

 private:
  struct Seen {
    const void* data;
    memory::desc have;
    memory mem;
  };
  dnnl::stream& stream_;
  std::vector<Tensor> keep_;
  std::vector<Seen> seen_;
  std::vector<std::pair<memory, memory>> pending_;
};

Tensor DnnlForward(const Geometry& g, const Tensor& x, const Tensor& w, const Tensor& bias) {
  Tensor y = Tensor::Empty(g.y_sizes(), DType::kFloat32);
  const DnnlConv conv{g};
  auto fwd = conv.Forward(bias.defined());
  internal::RunDnnl("Conv2d", [&](dnnl::stream& stream) {
    Operands ops(stream);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, ops.In(x, fwd->pd.src_desc())},
        {DNNL_ARG_WEIGHTS, ops.In(w, WeightDesc(g, w), fwd->pd.weights_desc())},
        {DNNL_ARG_DST, ops.Out(y, fwd->pd.dst_desc())},
        {DNNL_ARG_SCRATCHPAD, ops.Scratchpad(fwd->pd)}};
    if (bias.defined()) args[DNNL_ARG_BIAS] = ops.In(bias, fwd->pd.bias_desc());
    fwd->prim.execute(stream, args);
    ops.Finish();
  });
  return y;
}

// The gradients of x (`need.input`), the weight and the bias of the convolution `g`.
ConvGrads DnnlBackward(const Geometry& g, const Tensor& gy, const Tensor& x, const Tensor& w,
                       ConvGradMask need) {
  ConvGrads out;
  const DnnlConv conv{g};
  internal::RunDnnl("Conv2dBackward", [&](dnnl::stream& stream) {
    Operands ops(stream);
    if (need.input) {
      auto bwd = conv.BackwardData();
      out.input = Tensor::Empty(g.x_sizes(), DType::kFloat32);
      bwd->prim.execute(stream,
                        {{DNNL_ARG_DIFF_DST, ops.In(gy, bwd->pd.diff_dst_desc())},
                         {DNNL_ARG_WEIGHTS, ops.In(w, WeightDesc(g, w), bwd->pd.weights_desc())},
                         {DNNL_ARG_DIFF_SRC, ops.Out(out.input, bwd->pd.diff_src_desc())},
                         {DNNL_ARG_SCRATCHPAD, ops.Scratchpad(bwd->pd)}});
    }
    if (need.weight || need.bias) {
      auto bwd = conv.BackwardWeights(need.bias);
      out.weight = Tensor::Empty(g.w_sizes(), DType::kFloat32);
      std::unordered_map<int, memory> args{
          {DNNL_ARG_DIFF_DST, ops.In(gy, bwd->pd.diff_dst_desc())},
          {DNNL_ARG_SRC, ops.In(x, bwd->pd.src_desc())},
          {DNNL_ARG_DIFF_WEIGHTS, ops.Out(out.weight, bwd->pd.diff_weights_desc(),
                                          WeightDesc(g, out.weight))},
          {DNNL_ARG_SCRATCHPAD, ops.Scratchpad(bwd->pd)}};
      if (need.bias) {
        out.bias = Tensor::Empty({g.oc}, DType::kFloat32);
        args[DNNL_ARG_DIFF_BIAS] = ops.Out(out.bias, bwd->pd.diff_bias_desc());
      }
      bwd->prim.execute(stream, args);
      if (!need.weight) out.weight = Tensor();
    }
    ops.Finish();
  });
  return out;
}

// The input gradient of the convolution `g` alone (ConvTranspose2d's forward).
Tensor DnnlBackwardDataOnly(const Geometry& g, const Tensor& gy, const Tensor& w) {
  return DnnlBackward(g, gy, Tensor(), w, {.input = true, .weight = false, .bias = false}).input;
}

// ---------------------------------------------------------------- dispatch

Tensor Forward(const Geometry& g, const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (x.dtype() == DType::kFloat32) return DnnlForward(g, x, w, bias);
  return internal::DispatchFloating("Conv2d", x.dtype(), [&]<typename T>() {
    return OwnConv<T>{g}.Forward(x, w, bias);
  });
}

Tensor BackwardData(const Geometry& g, const Tensor& gy, const Tensor& w) {
  if (gy.dtype() == DType::kFloat32) return DnnlBackwardDataOnly(g, gy, w);
  return internal::DispatchFloating("Conv2dBackward", gy.dtype(), [&]<typename T>() {
    return OwnConv<T>{g}.BackwardData(gy, w);
  });
}

// Gradients of the convolution `g` from its output gradient gy, input x and weight w.
// The bias gradient is the convolution's (gy summed over N, H, W).
ConvGrads Backward(const Geometry& g, const Tensor& gy, const Tensor& x, const Tensor& w,
                   ConvGradMask need) {
  if (gy.dtype() == DType::kFloat32) return DnnlBackward(g, gy, x, w, need);
  return internal::DispatchFloating("Conv2dBackward", gy.dtype(), [&]<typename T>() {
    const OwnConv<T> conv{g};
    ConvGrads out;
    if (need.input) out.input = conv.BackwardData(gy, w);
    if (need.weight) out.weight = conv.BackwardWeight(x, gy);
    if (need.bias) out.bias = Sum(gy, {0, 2, 3});
    return out;
  });
}

void CheckGradOutput(std::string_view op, const Tensor& grad, const Geometry& g, DType dtype) {
  internal::CheckDefined(op, grad);
  GW_CHECK(grad.sizes() == g.y_sizes() && grad.dtype() == dtype, op, "grad_output ",
           DTypeName(grad.dtype()), " ", ShapeToString(grad.sizes()), " does not match the ",
           DTypeName(dtype), " output ", ShapeToString(g.y_sizes()));
}

}  // namespace

Tensor Conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              const Conv2dArgs& args) {
  CheckOperands("Conv2d", input, weight, bias, args, /*transposed=*/false);
  return Forward(ConvGeometry("Conv2d", input, weight, args), input, weight, bias);
}

ConvGrads Conv2dBackward(const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                         const Conv2dArgs& args, ConvGradMask need) {
  CheckOperands("Conv2dBackward", input, weight, Tensor(), args, /*transposed=*/false);
  const Geometry g = ConvGeometry("Conv2dBackward", input, weight, args);
  CheckGradOutput("Conv2dBackward", grad_output, g, input.dtype());
  return Backward(g, grad_output, input, weight, need);
}

Tensor ConvTranspose2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                       const Conv2dArgs& args) {
  CheckOperands("ConvTranspose2d", input, weight, bias, args, /*transposed=*/true);
  const Geometry g = TransposedGeometry("ConvTranspose2d", input, weight, args);
  Tensor out = BackwardData(g, input, weight);
  if (bias.defined()) AddInPlace(out, Reshape(bias, {g.c, 1, 1}));
  return out;
}

ConvGrads ConvTranspose2dBackward(const Tensor& grad_output, const Tensor& input,
                                  const Tensor& weight, const Conv2dArgs& args,
                                  ConvGradMask need) {
  CheckOperands("ConvTranspose2dBackward", input, weight, Tensor(), args, /*transposed=*/true);
  const Geometry g = TransposedGeometry("ConvTranspose2dBackward", input, weight, args);
  internal::CheckDefined("ConvTranspose2dBackward", grad_output);
  GW_CHECK(grad_output.sizes() == g.x_sizes() && grad_output.dtype() == input.dtype(),
           "ConvTranspose2dBackward", "grad_output ", DTypeName(grad_output.dtype()), " ",
           ShapeToString(grad_output.sizes()), " does not match the ",
           DTypeName(input.dtype()), " output ", ShapeToString(g.x_sizes()));
  // The adjoint's input gradient is the convolution's forward; its weight gradient is the
  // convolution's, with the roles of input and output gradient exchanged.
  ConvGrads out;
  if (need.input) out.input = Forward(g, grad_output, weight, Tensor());
  if (need.weight) {
    out.weight = Backward(g, input, grad_output, weight,
                          {.input = false, .weight = true, .bias = false})
                     .weight;
  }
  if (need.bias) out.bias = Sum(grad_output, {0, 2, 3});
  return out;
}

}  // namespace kernels
}  // namespace gw
