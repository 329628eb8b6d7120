#include "gradwire/tensor/shape.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/tensor/error.h"

namespace gw {

std::string ShapeToString(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

int64_t NumElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape ContiguousStrides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

int64_t NormalizeDim(std::string_view op, int64_t dim, int64_t ndim) {
  const int64_t lo = ndim == 0 ? -1 : -ndim;
  const int64_t hi = ndim == 0 ? 0 : ndim - 1;
  GW_CHECK(dim >= lo && dim <= hi, op, "dimension ", dim, " is out of range for a tensor with ",
           ndim, " dimension(s) (expected ", lo, " to ", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape BroadcastShapes(std::string_view op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    GW_CHECK(da == db || da == 1 || db == 1, op, "shapes ", ShapeToString(a), " and ",
             ShapeToString(b), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace gw
