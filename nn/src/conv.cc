#include "gradwire/nn/conv.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/convolution.h"
#include "gradwire/autograd/functions.h"

namespace gw::nn {
namespace {

const char* TypeName(int kind) {
  static const char* const kNames[] = {"Conv1d", "Conv2d", "ConvTranspose2d"};
  return kNames[kind];
}

}  // namespace

ConvLayer::ConvLayer(Kind kind, int64_t in_channels, int64_t out_channels, Size2 kernel_size,
                     const Conv2dArgs& args, bool bias, Generator& gen, DType dtype)
    : Module(TypeName(static_cast<int>(kind))),
      kind_(kind),
      in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_size_(kernel_size),
      args_(args) {
  GW_CHECK(in_channels > 0 && out_channels > 0 && kernel_size.h > 0 && kernel_size.w > 0 &&
               args.stride.h > 0 && args.stride.w > 0 && args.dilation.h > 0 &&
               args.dilation.w > 0 && args.padding.h >= 0 && args.padding.w >= 0 &&
               args.groups > 0,
           ToString(), "channels, kernel_size, stride, dilation and groups must be positive, ",
           "padding non-negative");
  GW_CHECK(in_channels % args.groups == 0 && out_channels % args.groups == 0, ToString(),
           "in_channels and out_channels must be divisible by groups");
  const bool transposed = kind == Kind::kTranspose2d;
  Shape w_sizes = {transposed ? in_channels : out_channels,
                   (transposed ? out_channels : in_channels) / args.groups};
  if (kind != Kind::k1d) w_sizes.push_back(kernel_size.h);
  w_sizes.push_back(kernel_size.w);
  const double fan_in = static_cast<double>(w_sizes[1] * kernel_size.h * kernel_size.w);
  const double bound = 1.0 / std::sqrt(fan_in);
  weight_ = RegisterParameter("weight", Tensor::Uniform(w_sizes, -bound, bound, gen, dtype));
  if (bias) {
    bias_ = RegisterParameter("bias", Tensor::Uniform({out_channels}, -bound, bound, gen, dtype));
  }
}

std::string ConvLayer::ExtraRepr() const {
  // PyTorch prints tuples: "(3,)" for one spatial dimension, "(3, 3)" for two.
  auto tuple = [&](Size2 s) {
    return kind_ == Kind::k1d ? absl::StrCat("(", s.w, ",)") : s.ToString();
  };
  std::string out = absl::StrCat(in_channels_, ", ", out_channels_, ", kernel_size=",
                                 tuple(kernel_size_), ", stride=", tuple(args_.stride));
  if (args_.padding != Size2(0)) absl::StrAppend(&out, ", padding=", tuple(args_.padding));
  if (args_.dilation != Size2(1)) absl::StrAppend(&out, ", dilation=", tuple(args_.dilation));
  if (args_.output_padding != Size2(0)) {
    absl::StrAppend(&out, ", output_padding=", tuple(args_.output_padding));
  }
  if (args_.groups != 1) absl::StrAppend(&out, ", groups=", args_.groups);
  if (!bias_.defined()) absl::StrAppend(&out, ", bias=False");
  return out;
}

void ConvLayer::CheckInput(const Tensor& input) const {
  const char* dims = kind_ == Kind::k1d ? "L" : "H, W";
  const int64_t rank = kind_ == Kind::k1d ? 3 : 4;
  GW_CHECK(input.defined() && (input.dim() == rank || input.dim() == rank - 1) &&
               input.sizes()[input.dim() - rank + 1] == in_channels_,
           ToString(), "expected input [N, ", in_channels_, ", ", dims, "] or [", in_channels_,
           ", ", dims, "], got ", input.defined() ? ShapeToString(input.sizes()) : "undefined");
  GW_CHECK(input.dtype() == weight_.dtype(), ToString(), "expected a ",
           DTypeName(weight_.dtype()), " input, got ", DTypeName(input.dtype()), " ",
           ShapeToString(input.sizes()));
}

namespace {

// Applies `f` to a batched input, adding and removing the batch dimension of an unbatched
// one (rank `batched_rank` - 1).
template <typename F>
Tensor Batched(const Tensor& input, int64_t batched_rank, F f) {
  if (input.dim() == batched_rank) return f(input);
  return gw::Squeeze(f(gw::Unsqueeze(input, 0)), 0);
}

}  // namespace

Conv1d::Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Generator& gen,
               const Conv1dOptions& o, DType dtype)
    : ConvLayer(Kind::k1d, in_channels, out_channels, Size2(1, kernel_size),
                {.stride = Size2(1, o.stride),
                 .padding = Size2(0, o.padding),
                 .dilation = Size2(1, o.dilation),
                 .groups = o.groups},
                o.bias, gen, dtype) {}

Tensor Conv1d::Forward(const Tensor& input) {
  CheckInput(input);
  const Conv1dArgs args{.stride = args_.stride.w,
                        .padding = args_.padding.w,
                        .dilation = args_.dilation.w,
                        .groups = args_.groups};
  return Batched(input, 3, [&](const Tensor& x) { return gw::Conv1d(x, weight_, bias_, args); });
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Generator& gen,
               const Conv2dOptions& o, DType dtype)
    : ConvLayer(Kind::k2d, in_channels, out_channels, kernel_size,
                {.stride = o.stride, .padding = o.padding, .dilation = o.dilation,
                 .groups = o.groups},
                o.bias, gen, dtype) {}

Tensor Conv2d::Forward(const Tensor& input) {
  CheckInput(input);
  return Batched(input, 4, [&](const Tensor& x) { return gw::Conv2d(x, weight_, bias_, args_); });
}

ConvTranspose2d::ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
                                 Generator& gen, const ConvTranspose2dOptions& o, DType dtype)
    : ConvLayer(Kind::kTranspose2d, in_channels, out_channels, kernel_size,
                {.stride = o.stride, .padding = o.padding, .dilation = o.dilation,
                 .groups = o.groups, .output_padding = o.output_padding},
                o.bias, gen, dtype) {
  const Size2 s = o.stride, d = o.dilation, op = o.output_padding;
  GW_CHECK(op.h >= 0 && op.w >= 0 && (op.h < s.h || op.h < d.h) && (op.w < s.w || op.w < d.w),
           ToString(), "output_padding must be non-negative and smaller than stride or dilation");
}

Tensor ConvTranspose2d::Forward(const Tensor& input) {
  CheckInput(input);
  return Batched(input, 4, [&](const Tensor& x) {
    return gw::ConvTranspose2d(x, weight_, bias_, args_);
  });
}

}  // namespace gw::nn
