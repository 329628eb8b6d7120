#include "gradwire/models/images.h"

#include "gradwire/autograd/functions.h"
#include "gradwire/tensor/error.h"

namespace gw::models {

Tensor AsImages(const Tensor& x, std::string_view model, ImageShape shape) {
  const Shape want{shape.channels, shape.height, shape.width};
  const int64_t flat = shape.channels * shape.height * shape.width;
  GW_CHECK(x.defined(), model, "called with an undefined tensor");
  if (x.dim() == 4 && Shape(x.sizes().begin() + 1, x.sizes().end()) == want) return x;
  GW_CHECK(x.dim() == 2 && x.size(1) == flat, model, "expected input [N, ", shape.channels, ", ",
           shape.height, ", ", shape.width, "] or [N, ", flat, "], got ", ShapeToString(x.sizes()));
  return Reshape(x, {x.size(0), shape.channels, shape.height, shape.width});
}

}  // namespace gw::models
