#include "gradwire/tensor/device.h"

#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cuda/cuda_kernels.h"
#include "gradwire/tensor/error.h"

namespace gw {

absl::StatusOr<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return kCPU;
  absl::string_view rest(text.data(), text.size());  // Debian's Abseil has its own string_view
  if (absl::ConsumePrefix(&rest, "cuda")) {
    if (rest.empty()) return Cuda(0);
    int index = -1;
    if (absl::ConsumePrefix(&rest, ":") && absl::SimpleAtoi(rest, &index) && index >= 0 &&
        index <= std::numeric_limits<int16_t>::max()) {
      return Cuda(static_cast<int16_t>(index));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("'", absl::string_view(text.data(), text.size()),
                                                 "' is not a device: expected cpu, cuda or cuda:<index>"));
}

}  // namespace gw

namespace gw::internal::cuda {

bool OnCuda(std::string_view op, const Tensor& t, std::initializer_list<const Tensor*> others) {
  if (!t.defined() || !t.device().is_cuda()) {
    for (const Tensor* o : others) {
      GW_CHECK(!o->defined() || !o->device().is_cuda(), op, "tensors on ", t.device().ToString(), " and ",
               o->device().ToString(), "; move them to one device first (Tensor::To)");
    }
    return false;
  }
  for (const Tensor* o : others) {
    GW_CHECK(!o->defined() || o->device() == t.device(), op, "tensors on ", t.device().ToString(), " and ",
             o->device().ToString(), "; move them to one device first (Tensor::To)");
  }
  return true;
}

}  // namespace gw::internal::cuda
