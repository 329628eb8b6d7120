#include "gradwire/nn/pooling.h"

#include "absl/strings/str_cat.h"
#include "gradwire/autograd/pooling.h"

namespace gw::nn {
namespace {

// PyTorch prints an int argument as an int and a pair as a tuple.
std::string Repr(Size2 s) { return s.h == s.w ? absl::StrCat(s.h) : s.ToString(); }
const char* Repr(bool b) { return b ? "True" : "False"; }

void CheckRank(const Module& m, const Tensor& input) {
  GW_CHECK(input.defined() && (input.dim() == 3 || input.dim() == 4), m.ToString(),
           "expected input [N, C, H, W] or [C, H, W], got ",
           input.defined() ? ShapeToString(input.sizes()) : "undefined");
}

}  // namespace

MaxPool2d::MaxPool2d(Size2 kernel_size, const MaxPool2dOptions& o)
    : Module("MaxPool2d"),
      args_{.kernel_size = kernel_size,
            .stride = o.stride.value_or(kernel_size),
            .padding = o.padding,
            .dilation = o.dilation,
            .ceil_mode = o.ceil_mode} {}

Tensor MaxPool2d::Forward(const Tensor& input) {
  CheckRank(*this, input);
  return gw::MaxPool2d(input, args_);
}

std::string MaxPool2d::ExtraRepr() const {
  return absl::StrCat("kernel_size=", Repr(args_.kernel_size), ", stride=", Repr(*args_.stride),
                      ", padding=", Repr(args_.padding), ", dilation=", Repr(args_.dilation),
                      ", ceil_mode=", Repr(args_.ceil_mode));
}

AvgPool2d::AvgPool2d(Size2 kernel_size, const AvgPool2dOptions& o)
    : Module("AvgPool2d"),
      args_{.kernel_size = kernel_size,
            .stride = o.stride.value_or(kernel_size),
            .padding = o.padding,
            .ceil_mode = o.ceil_mode,
            .count_include_pad = o.count_include_pad} {}

Tensor AvgPool2d::Forward(const Tensor& input) {
  CheckRank(*this, input);
  return gw::AvgPool2d(input, args_);
}

std::string AvgPool2d::ExtraRepr() const {
  return absl::StrCat("kernel_size=", Repr(args_.kernel_size), ", stride=", Repr(*args_.stride),
                      ", padding=", Repr(args_.padding));
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 output_size)
    : Module("AdaptiveAvgPool2d"), output_size_(output_size) {
  GW_CHECK(output_size.h > 0 && output_size.w > 0, "AdaptiveAvgPool2d",
           "output_size must be positive, got ", output_size.ToString());
}

Tensor AdaptiveAvgPool2d::Forward(const Tensor& input) {
  CheckRank(*this, input);
  return gw::AdaptiveAvgPool2d(input, output_size_);
}

std::string AdaptiveAvgPool2d::ExtraRepr() const {
  return absl::StrCat("output_size=", Repr(output_size_));
}

}  // namespace gw::nn
