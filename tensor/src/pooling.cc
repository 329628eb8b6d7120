// Max, average and adaptive average pooling: float32 on oneDNN's pooling primitives,
// everything else on window loops templated over the dtype.
#include "gradwire/tensor/pooling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "dispatch.h"
#include "dnnl_util.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

using dnnl::memory;

// One spatial axis of a pooling window sweep.
struct Axis {
  int64_t in, out, k, s, p, d;
  // oneDNN's high-side padding: what the last window reaches past the input.
  int64_t PadR() const { return (out - 1) * s + d * (k - 1) + 1 - in - p; }
};

// A pooling of [n, c, in.h, in.w] to [n, c, out.h, out.w]; `batched` is the input's rank 4.
struct PoolGeometry {
  int64_t n, c;
  Axis h, w;
  bool batched;

  Shape Sizes(int64_t hh, int64_t ww) const {
    return batched ? Shape{n, c, hh, ww} : Shape{c, hh, ww};
  }
  Shape in_sizes() const { return Sizes(h.in, w.in); }
  Shape out_sizes() const { return Sizes(h.out, w.out); }
};

// [N, C, H, W] or [C, H, W] as 4-D (a view).
Tensor As4D(const Tensor& t) { return t.dim() == 4 ? t : Unsqueeze(t, 0); }

void CheckInput(std::string_view op, const Tensor& x) {
  internal::CheckDefined(op, x);
  GW_CHECK(x.dim() == 3 || x.dim() == 4, op, "expected input [N, C, H, W] or [C, H, W], got ",
           ShapeToString(x.sizes()));
  GW_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64, op,
           "expected a float32 or float64 input, got ", DTypeName(x.dtype()));
}

Axis MakeAxis(std::string_view op, const Shape& input, int64_t in, int64_t k, int64_t s,
              int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = d * (k - 1) + 1;
  GW_CHECK(p <= span / 2, op, "padding ", p, " must be at most half the kernel span ", span,
           " (input ", ShapeToString(input), ")");
  const int64_t room = in + 2 * p - span;
  GW_CHECK(room >= 0, op, "input ", ShapeToString(input), " padded by ", p,
           " is smaller than the kernel span ", span);
  int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;  // the last window starts in the padding
  return {in, out, k, s, p, d};
}

// The pooling of an input of `sizes` ([N, C, H, W] or [C, H, W]).
PoolGeometry MakeGeometry(std::string_view op, const Shape& sizes, const Pool2dArgs& a) {
  GW_CHECK(sizes.size() == 3 || sizes.size() == 4, op,
           "expected input [N, C, H, W] or [C, H, W], got ", ShapeToString(sizes));
  const Size2 stride = a.stride.value_or(a.kernel_size);
  GW_CHECK(a.kernel_size.h > 0 && a.kernel_size.w > 0 && stride.h > 0 && stride.w > 0 &&
               a.dilation.h > 0 && a.dilation.w > 0 && a.padding.h >= 0 && a.padding.w >= 0,
           op, "kernel_size ", a.kernel_size.ToString(), ", stride ", stride.ToString(),
           " and dilation ", a.dilation.ToString(), " must be positive and padding ",
           a.padding.ToString(), " non-negative");
  const bool batched = sizes.size() == 4;
  const int64_t n = batched ? sizes[0] : 1, c = sizes[sizes.size() - 3];
  const int64_t h = sizes[sizes.size() - 2], w = sizes[sizes.size() - 1];
  return {n, c,
          MakeAxis(op, sizes, h, a.kernel_size.h, stride.h, a.padding.h, a.dilation.h,
                   a.ceil_mode),
          MakeAxis(op, sizes, w, a.kernel_size.w, stride.w, a.padding.w, a.dilation.w,
                   a.ceil_mode),
          batched};
}

PoolGeometry MakeGeometry(std::string_view op, const Tensor& x, const Pool2dArgs& a) {
  CheckInput(op, x);
  return MakeGeometry(op, x.sizes(), a);
}

// The geometry of a backward pass: the forward's, rebuilt from the input's sizes.
PoolGeometry BackwardGeometry(std::string_view op, const Tensor& grad, const Shape& input_sizes,
                              const Pool2dArgs& a) {
  CheckInput(op, grad);
  PoolGeometry g = MakeGeometry(op, input_sizes, a);
  GW_CHECK(grad.sizes() == g.out_sizes(), op, "grad_output ", ShapeToString(grad.sizes()),
           " does not match the output ", ShapeToString(g.out_sizes()), " of input ",
           ShapeToString(input_sizes));
  return g;
}

// ---------------------------------------------------------------- own loops (any T)

// The rows [start, end) each output row of one axis averages, and its divisor's factor.
struct Windows {
  std::vector<int64_t> start, end, count;
};

Windows AvgWindows(const Axis& a, bool count_include_pad) {
  Windows win;
  for (int64_t o = 0; o < a.out; ++o) {
    const int64_t start = o * a.s - a.p;
    const int64_t end = std::min(start + a.k, a.in + a.p);
    const int64_t lo = std::max<int64_t>(start, 0), hi = std::min(end, a.in);
    win.start.push_back(lo);
    win.end.push_back(hi);
    win.count.push_back(count_include_pad ? end - start : hi - lo);
  }
  return win;
}

Windows AdaptiveWindows(int64_t in, int64_t out) {
  Windows win;
  for (int64_t o = 0; o < out; ++o) {
    win.start.push_back(o * in / out);
    win.end.push_back(((o + 1) * in + out - 1) / out);
    win.count.push_back(win.end.back() - win.start.back());
  }
  return win;
}

// y[n, c, i, j] = mean of x over rows wh[i] and columns ww[j]; x 4-D, any strides.
template <typename T>
Tensor AverageForward(const Tensor& x, const Windows& wh, const Windows& ww) {
  const int64_t planes_n = x.sizes()[0], planes_c = x.sizes()[1];
  const int64_t oh = static_cast<int64_t>(wh.start.size()), ow = static_cast<int64_t>(ww.start.size());
  Tensor y = Tensor::Empty({planes_n, planes_c, oh, ow}, DTypeOf<T>());
  const Shape& st = x.strides();
  T* py = y.data<T>();
  for (int64_t n = 0; n < planes_n; ++n) {
    for (int64_t c = 0; c < planes_c; ++c) {
      const T* plane = x.data<T>() + n * st[0] + c * st[1];
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          T sum = 0;
          for (int64_t r = wh.start[i]; r < wh.end[i]; ++r) {
            for (int64_t q = ww.start[j]; q < ww.end[j]; ++q) sum += plane[r * st[2] + q * st[3]];
          }
          *py++ = sum / static_cast<T>(wh.count[i] * ww.count[j]);
        }
      }
    }
  }
  return y;
}

// The adjoint of AverageForward into a new [n, c, h, w] tensor.
template <typename T>
Tensor AverageBackward(const Tensor& grad, const Shape& in4, const Windows& wh,
                       const Windows& ww) {
  const Tensor g = Contiguous(grad);
  Tensor gx = Tensor::Zeros(in4, DTypeOf<T>());
  const int64_t oh = static_cast<int64_t>(wh.start.size()), ow = static_cast<int64_t>(ww.start.size());
  const int64_t planes = in4[0] * in4[1], w = in4[3];
  const T* pg = g.data<T>();
  for (int64_t pl = 0; pl < planes; ++pl) {
    T* plane = gx.data<T>() + pl * in4[2] * w;
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        const T v = *pg++ / static_cast<T>(wh.count[i] * ww.count[j]);
        for (int64_t r = wh.start[i]; r < wh.end[i]; ++r) {
          for (int64_t q = ww.start[j]; q < ww.end[j]; ++q) plane[r * w + q] += v;
        }
      }
    }
  }
  return gx;
}

template <typename T>
MaxPool2dResult MaxForward(const Tensor& x, const PoolGeometry& g) {
  Tensor y = Tensor::Empty({g.n, g.c, g.h.out, g.w.out}, DTypeOf<T>());
  Tensor idx = Tensor::Empty({g.n, g.c, g.h.out, g.w.out}, DType::kInt64);
  const Shape& st = x.strides();
  T* py = y.data<T>();
  int64_t* pi = idx.data<int64_t>();
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t c = 0; c < g.c; ++c) {
      const T* plane = x.data<T>() + n * st[0] + c * st[1];
      for (int64_t i = 0; i < g.h.out; ++i) {
        for (int64_t j = 0; j < g.w.out; ++j) {
          T best = -std::numeric_limits<T>::infinity();
          int64_t arg = -1;
          for (int64_t a = 0; a < g.h.k; ++a) {
            const int64_t r = i * g.h.s - g.h.p + a * g.h.d;
            if (r < 0 || r >= g.h.in) continue;
            for (int64_t b = 0; b < g.w.k; ++b) {
              const int64_t q = j * g.w.s - g.w.p + b * g.w.d;
              if (q < 0 || q >= g.w.in) continue;
              const T v = plane[r * st[2] + q * st[3]];
              if (arg < 0 || v > best || std::isnan(v)) {
                best = v;
                arg = r * g.w.in + q;
                if (std::isnan(v)) break;
              }
            }
          }
          *py++ = best;
          *pi++ = arg;
        }
      }
    }
  }
  return {y, idx};
}

template <typename T>
Tensor MaxBackward(const Tensor& grad, const Tensor& indices, const PoolGeometry& g) {
  const Tensor gc = Contiguous(grad);
  Tensor gx = Tensor::Zeros({g.n, g.c, g.h.in, g.w.in}, DTypeOf<T>());
  const int64_t plane_out = g.h.out * g.w.out, plane_in = g.h.in * g.w.in;
  const T* pg = gc.data<T>();
  const int64_t* pi = indices.data<int64_t>();
  for (int64_t pl = 0; pl < g.n * g.c; ++pl) {
    T* plane = gx.data<T>() + pl * plane_in;
    for (int64_t o = 0; o < plane_out; ++o) plane[pi[pl * plane_out + o]] += pg[pl * plane_out + o];
  }
  return gx;
}

// ---------------------------------------------------------------- oneDNN (float32)

// oneDNN's pooling of a contiguous float32 [n, c, h, w] input to a contiguous output.
struct DnnlPool {
  dnnl::pooling_v2_forward::primitive_desc fwd_pd;
  dnnl::pooling_v2_forward fwd;
  dnnl::pooling_v2_backward::primitive_desc bwd_pd;
  dnnl::pooling_v2_backward bwd;
};

std::shared_ptr<const DnnlPool> GetDnnlPool(const PoolGeometry& g, dnnl::algorithm alg) {
  const std::vector<int64_t> key = {static_cast<int64_t>(alg), g.n, g.c, g.h.in, g.w.in,
                                    g.h.k, g.w.k, g.h.s, g.w.s, g.h.p, g.w.p, g.h.d, g.w.d,
                                    g.h.out, g.w.out};
  return internal::CachedPrimitive<DnnlPool>(key, [&] {
    const memory::desc src = internal::ContiguousDesc({g.n, g.c, g.h.in, g.w.in});
    const memory::desc dst = internal::ContiguousDesc({g.n, g.c, g.h.out, g.w.out});
    const memory::dims strides{g.h.s, g.w.s}, kernel{g.h.k, g.w.k},
        dilation{g.h.d - 1, g.w.d - 1}, pad_l{g.h.p, g.w.p}, pad_r{g.h.PadR(), g.w.PadR()};
    dnnl::pooling_v2_forward::primitive_desc fwd_pd(
        {dnnl::prop_kind::forward_training, alg, src, dst, strides, kernel, dilation, pad_l,
         pad_r},
        internal::UserScratchpad(), internal::CpuEngine());
    dnnl::pooling_v2_backward::primitive_desc bwd_pd(
        {alg, src, dst, strides, kernel, dilation, pad_l, pad_r}, internal::UserScratchpad(),
        internal::CpuEngine(), fwd_pd);
    return DnnlPool{fwd_pd, dnnl::pooling_v2_forward(fwd_pd), bwd_pd,
                    dnnl::pooling_v2_backward(bwd_pd)};
  });
}

// The workspace of a max pooling as an int64 tensor (an opaque buffer).
Tensor Workspace(const DnnlPool& pool) {
  const int64_t bytes = static_cast<int64_t>(pool.fwd_pd.workspace_desc().get_size());
  return Tensor::Empty({(bytes + 7) / 8}, DType::kInt64);
}

// Runs the forward pooling of the contiguous float32 x4 into a new output.
Tensor DnnlForward(std::string_view op, const DnnlPool& pool, const Tensor& x4,
                   const PoolGeometry& g, const Tensor& workspace) {
  Tensor y = Tensor::Empty({g.n, g.c, g.h.out, g.w.out}, DType::kFloat32);
  internal::RunDnnl(op, [&](dnnl::stream& stream) {
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, internal::Dnnl(x4)},
                                         {DNNL_ARG_DST, internal::Dnnl(y)}};
    if (workspace.defined()) {
      args[DNNL_ARG_WORKSPACE] = memory(pool.fwd_pd.workspace_desc(), internal::CpuEngine(),
                                        workspace.raw_data());
    }
    std::vector<Tensor> keep;
    internal::AddScratchpad(pool.fwd, args, keep);
    pool.fwd.execute(stream, args);
  });
  return y;
}

Tensor DnnlBackward(std::string_view op, const DnnlPool& pool, const Tensor& grad,
                    const PoolGeometry& g, const Tensor& workspace) {
  const Tensor gy = Contiguous(grad);
  Tensor gx = Tensor::Empty({g.n, g.c, g.h.in, g.w.in}, DType::kFloat32);
  internal::RunDnnl(op, [&](dnnl::stream& stream) {
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, internal::Dnnl(gy)},
                                         {DNNL_ARG_DIFF_SRC, internal::Dnnl(gx)}};
    if (workspace.defined()) {
      args[DNNL_ARG_WORKSPACE] = memory(pool.fwd_pd.workspace_desc(), internal::CpuEngine(),
                                        workspace.raw_data());
    }
    std::vector<Tensor> keep;
    internal::AddScratchpad(pool.bwd, args, keep);
    pool.bwd.execute(stream, args);
  });
  return gx;
}

// oneDNN's average pooling divides by the whole window (include) or its part inside the
// input (exclude); PyTorch's include-mode divisor stops at the padding, so windows that
// ceil_mode pushes past it are ours.
bool DnnlCanAverage(const PoolGeometry& g, bool count_include_pad) {
  return !count_include_pad || (g.h.PadR() <= g.h.p && g.w.PadR() <= g.w.p);
}

dnnl::algorithm AvgAlgorithm(bool count_include_pad) {
  return count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                           : dnnl::algorithm::pooling_avg_exclude_padding;
}

Shape In4(const PoolGeometry& g) { return {g.n, g.c, g.h.in, g.w.in}; }

// A [n, c, h, w] result reshaped to the rank of the geometry's input.
Tensor ToRank(const Tensor& t4, bool batched) { return batched ? t4 : Squeeze(t4, 0); }

}  // namespace

MaxPool2dResult MaxPool2d(const Tensor& input, const Pool2dArgs& args) {
  const PoolGeometry g = MakeGeometry("MaxPool2d", input, args);
  const Tensor x4 = As4D(input);
  MaxPool2dResult r;
  if (input.dtype() == DType::kFloat32) {
    auto pool = GetDnnlPool(g, dnnl::algorithm::pooling_max);
    r.indices = Workspace(*pool);
    r.output = DnnlForward("MaxPool2d", *pool, Contiguous(x4), g, r.indices);
  } else {
    r = internal::DispatchFloating("MaxPool2d", input.dtype(),
                                   [&]<typename T>() { return MaxForward<T>(x4, g); });
    r.indices = ToRank(r.indices, g.batched);
  }
  r.output = ToRank(r.output, g.batched);
  return r;
}

Tensor MaxPool2dBackward(const Tensor& grad_output, const Shape& input_sizes,
                         const Tensor& indices, const Pool2dArgs& args) {
  const PoolGeometry g = BackwardGeometry("MaxPool2dBackward", grad_output, input_sizes, args);
  GW_CHECK(indices.defined() && indices.dtype() == DType::kInt64, "MaxPool2dBackward",
           "expected the int64 indices MaxPool2d returned");
  const Tensor gy = As4D(grad_output);
  Tensor gx;
  if (grad_output.dtype() == DType::kFloat32) {
    gx = DnnlBackward("MaxPool2dBackward", *GetDnnlPool(g, dnnl::algorithm::pooling_max), gy, g,
                      indices);
  } else {
    GW_CHECK(indices.sizes() == grad_output.sizes(), "MaxPool2dBackward", "indices ",
             ShapeToString(indices.sizes()), " do not match grad_output ",
             ShapeToString(grad_output.sizes()));
    gx = internal::DispatchFloating("MaxPool2dBackward", grad_output.dtype(), [&]<typename T>() {
      return MaxBackward<T>(gy, Contiguous(indices), g);
    });
  }
  return ToRank(gx, g.batched);
}

Tensor AvgPool2d(const Tensor& input, const Pool2dArgs& args) {
  GW_CHECK(args.dilation == Size2(1), "AvgPool2d", "has no dilation, got ",
           args.dilation.ToString());
  const PoolGeometry g = MakeGeometry("AvgPool2d", input, args);
  const Tensor x4 = As4D(input);
  Tensor y;
  if (input.dtype() == DType::kFloat32 && DnnlCanAverage(g, args.count_include_pad)) {
    y = DnnlForward("AvgPool2d", *GetDnnlPool(g, AvgAlgorithm(args.count_include_pad)),
                    Contiguous(x4), g, Tensor());
  } else {
    y = internal::DispatchFloating("AvgPool2d", input.dtype(), [&]<typename T>() {
      return AverageForward<T>(x4, AvgWindows(g.h, args.count_include_pad),
                               AvgWindows(g.w, args.count_include_pad));
    });
  }
  return ToRank(y, g.batched);
}

Tensor AvgPool2dBackward(const Tensor& grad_output, const Shape& input_sizes,
                         const Pool2dArgs& args) {
  const PoolGeometry g = BackwardGeometry("AvgPool2dBackward", grad_output, input_sizes, args);
  const Tensor gy = As4D(grad_output);
  Tensor gx;
  if (grad_output.dtype() == DType::kFloat32 && DnnlCanAverage(g, args.count_include_pad)) {
    gx = DnnlBackward("AvgPool2dBackward", *GetDnnlPool(g, AvgAlgorithm(args.count_include_pad)),
                      gy, g, Tensor());
  } else {
    gx = internal::DispatchFloating("AvgPool2dBackward", grad_output.dtype(), [&]<typename T>() {
      return AverageBackward<T>(gy, In4(g), AvgWindows(g.h, args.count_include_pad),
                                AvgWindows(g.w, args.count_include_pad));
    });
  }
  return ToRank(gx, g.batched);
}

namespace {

// Adaptive pooling with even windows is an average pooling (oneDNN's for float32).
std::optional<Pool2dArgs> EvenWindows(const Shape& in, Size2 out) {
  const int64_t h = in[in.size() - 2], w = in[in.size() - 1];
  if (h % out.h != 0 || w % out.w != 0) return std::nullopt;
  return Pool2dArgs{.kernel_size = Size2(h / out.h, w / out.w)};
}

void CheckAdaptive(std::string_view op, const Tensor& x, Size2 out) {
  CheckInput(op, x);
  GW_CHECK(out.h > 0 && out.w > 0, op, "output_size ", out.ToString(), " must be positive (input ",
           ShapeToString(x.sizes()), ")");
}

}  // namespace

Tensor AdaptiveAvgPool2d(const Tensor& input, Size2 output_size) {
  CheckAdaptive("AdaptiveAvgPool2d", input, output_size);
  if (auto even = EvenWindows(input.sizes(), output_size)) return AvgPool2d(input, *even);
  const Tensor x4 = As4D(input);
  Tensor y = internal::DispatchFloating("AdaptiveAvgPool2d", input.dtype(), [&]<typename T>() {
    return AverageForward<T>(x4, AdaptiveWindows(x4.sizes()[2], output_size.h),
                             AdaptiveWindows(x4.sizes()[3], output_size.w));
  });
  return ToRank(y, input.dim() == 4);
}

Tensor AdaptiveAvgPool2dBackward(const Tensor& grad_output, const Shape& input_sizes) {
  internal::CheckDefined("AdaptiveAvgPool2dBackward", grad_output);
  GW_CHECK(grad_output.dim() == static_cast<int64_t>(input_sizes.size()) &&
               grad_output.dim() >= 3,
           "AdaptiveAvgPool2dBackward", "grad_output ", ShapeToString(grad_output.sizes()),
           " does not match input ", ShapeToString(input_sizes));
  const Size2 out(grad_output.sizes()[grad_output.dim() - 2], grad_output.sizes().back());
  if (auto even = EvenWindows(input_sizes, out)) {
    return AvgPool2dBackward(grad_output, input_sizes, *even);
  }
  const Tensor gy = As4D(grad_output);
  const Shape in4 = input_sizes.size() == 4
                        ? input_sizes
                        : Shape{1, input_sizes[0], input_sizes[1], input_sizes[2]};
  GW_CHECK(gy.sizes()[0] == in4[0] && gy.sizes()[1] == in4[1], "AdaptiveAvgPool2dBackward",
           "grad_output ", ShapeToString(grad_output.sizes()), " does not match input ",
           ShapeToString(input_sizes));
  Tensor gx = internal::DispatchFloating("AdaptiveAvgPool2dBackward", grad_output.dtype(),
                                         [&]<typename T>() {
                                           return AverageBackward<T>(
                                               gy, in4, AdaptiveWindows(in4[2], out.h),
                                               AdaptiveWindows(in4[3], out.w));
                                         });
  return ToRank(gx, input_sizes.size() == 4);
}

}  // namespace gw::kernels
