#include "gradwire/tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dispatch.h"
#include "gradwire/tensor/kernels.h"

namespace gw {

TensorImpl& Tensor::impl() const {
  GW_CHECK(impl_ != nullptr, "Tensor", "use of an undefined tensor");
  return *impl_;
}

Tensor Tensor::Empty(const Shape& sizes, DType dtype, Device device) {
  for (int64_t d : sizes) {
    GW_CHECK(d >= 0, "Tensor::Empty", "negative size in shape ", ShapeToString(sizes));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::Allocate(static_cast<size_t>(NumElements(sizes)) * ElementSize(dtype),
                                    device);
  impl->sizes = sizes;
  impl->strides = ContiguousStrides(sizes);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::Zeros(const Shape& sizes, DType dtype, Device device) {
  Tensor t = Empty(sizes, dtype, device);
  if (device.is_cuda()) {
    kernels::Fill(t, 0);
  } else if (t.nbytes() > 0) {
    std::memset(t.raw_data(), 0, t.nbytes());
  }
  return t;
}

Tensor Tensor::Ones(const Shape& sizes, DType dtype, Device device) { return Full(sizes, 1.0, dtype, device); }

Tensor Tensor::Full(const Shape& sizes, double value, DType dtype, Device device) {
  Tensor t = Empty(sizes, dtype, device);
  kernels::Fill(t, value);
  return t;
}

Tensor Tensor::Scalar(double value, DType dtype) { return Full({}, value, dtype); }

Tensor Tensor::Arange(double start, double end, double step, DType dtype) {
  GW_CHECK(step != 0, "Tensor::Arange", "step must be non-zero");
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end - start) / step)));
  Tensor t = Empty({n}, dtype);
  internal::DispatchNumeric("Tensor::Arange", dtype, [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
  });
  return t;
}

template <typename T>
Tensor Tensor::FromVector(const std::vector<T>& values, Shape sizes) {
  if (sizes.empty()) sizes = {static_cast<int64_t>(values.size())};
  GW_CHECK(NumElements(sizes) == static_cast<int64_t>(values.size()), "Tensor::FromVector",
           values.size(), " values do not fill shape ", ShapeToString(sizes));
  Tensor t = Empty(sizes, DTypeOf<T>());
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}
template Tensor Tensor::FromVector<float>(const std::vector<float>&, Shape);
template Tensor Tensor::FromVector<double>(const std::vector<double>&, Shape);
template Tensor Tensor::FromVector<int64_t>(const std::vector<int64_t>&, Shape);
template Tensor Tensor::FromVector<bool>(const std::vector<bool>&, Shape);

namespace {
template <typename Fn>
Tensor FillRandom(std::string_view op, const Shape& sizes, DType dtype, Fn next) {
  Tensor t = Tensor::Empty(sizes, dtype);
  internal::DispatchFloating(op, dtype, [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = static_cast<T>(next());
  });
  return t;
}
}  // namespace

Tensor Tensor::Randn(const Shape& sizes, Generator& gen, DType dtype) {
  return FillRandom("Tensor::Randn", sizes, dtype, [&] { return gen.NextNormal(); });
}

Tensor Tensor::Rand(const Shape& sizes, Generator& gen, DType dtype) {
  return FillRandom("Tensor::Rand", sizes, dtype, [&] { return gen.NextDouble(); });
}

Tensor Tensor::Uniform(const Shape& sizes, double low, double high, Generator& gen,
                       DType dtype) {
  GW_CHECK(low <= high, "Tensor::Uniform", "low ", low, " > high ", high);
  return FillRandom("Tensor::Uniform", sizes, dtype,
                    [&] { return low + (high - low) * gen.NextDouble(); });
}

Tensor Tensor::FromStorage(std::shared_ptr<Storage> storage, DType dtype, Shape sizes,
                           Shape strides, int64_t offset) {
  GW_CHECK(sizes.size() == strides.size(), "Tensor::FromStorage", "sizes ",
           ShapeToString(sizes), " and strides ", ShapeToString(strides), " differ in rank");
  int64_t max_index = offset;
  bool empty = false;
  bool overflow = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    GW_CHECK(sizes[i] >= 0 && strides[i] >= 0, "Tensor::FromStorage",
             "negative size or stride in ", ShapeToString(sizes), " / ", ShapeToString(strides));
    if (sizes[i] == 0) empty = true;
    int64_t extent = 0;
    overflow |= __builtin_mul_overflow(std::max<int64_t>(sizes[i] - 1, 0), strides[i], &extent);
    overflow |= __builtin_add_overflow(max_index, extent, &max_index);
  }
  uint64_t end_bytes = 0;
  overflow |= __builtin_mul_overflow(static_cast<uint64_t>(max_index) + 1, ElementSize(dtype), &end_bytes);
  GW_CHECK(offset >= 0 && (empty || (!overflow && end_bytes <= storage->nbytes())),
           "Tensor::FromStorage", "view ", ShapeToString(sizes), " at offset ", offset,
           " exceeds a storage of ", storage->nbytes(), " bytes");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const {
  GW_CHECK(dim() > 0, "Tensor::size", "a 0-dimensional tensor has no dimension ", d);
  return sizes()[NormalizeDim("Tensor::size", d, dim())];
}
int64_t Tensor::stride(int64_t d) const {
  GW_CHECK(dim() > 0, "Tensor::stride", "a 0-dimensional tensor has no dimension ", d);
  return strides()[NormalizeDim("Tensor::stride", d, dim())];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sizes()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= sizes()[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl().storage->data()) +
         impl().offset * static_cast<int64_t>(ElementSize(impl().dtype));
}

template <typename T>
std::vector<T> Tensor::ToVector() const {
  Tensor c = kernels::ToDevice(kernels::Contiguous(*this), kCPU);
  std::vector<T> out(static_cast<size_t>(numel()));
  internal::DispatchAll(dtype(), [&]<typename S>() {
    const S* p = c.data<S>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(p[i]);
  });
  return out;
}
template std::vector<float> Tensor::ToVector<float>() const;
template std::vector<double> Tensor::ToVector<double>() const;
template std::vector<int64_t> Tensor::ToVector<int64_t>() const;

template <>
std::vector<bool> Tensor::ToVector<bool>() const {
  std::vector<double> v = ToVector<double>();
  return std::vector<bool>(v.begin(), v.end());
}

template <typename T>
T Tensor::item() const {
  GW_CHECK(numel() == 1, "Tensor::item", "needs exactly one element, got shape ",
           ShapeToString(sizes()));
  const Tensor host = kernels::ToDevice(*this, kCPU);
  return internal::DispatchAll(dtype(),
                               [&]<typename S>() { return static_cast<T>(*static_cast<const S*>(host.raw_data())); });
}
template double Tensor::item<double>() const;
template float Tensor::item<float>() const;
template int64_t Tensor::item<int64_t>() const;
template bool Tensor::item<bool>() const;

const Tensor& Tensor::set_requires_grad(bool requires_grad) const {
  GW_CHECK(!requires_grad || IsFloating(dtype()), "Tensor::set_requires_grad",
           "only floating tensors can require gradients, got ", DTypeName(dtype()));
  GW_CHECK(is_leaf(), "Tensor::set_requires_grad",
           "can only be set on leaf tensors; use detach() to make a new leaf");
  autograd_meta().requires_grad = requires_grad;
  return *this;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  return impl().autograd ? impl().autograd->grad_fn : kNone;
}

Tensor Tensor::grad() const {
  if (!impl().autograd) return Tensor();
  return Tensor(impl().autograd->grad);
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    GW_CHECK(grad.sizes() == sizes() && grad.dtype() == dtype(), "Tensor::set_grad",
             "gradient ", DTypeName(grad.dtype()), ShapeToString(grad.sizes()),
             " does not match tensor ", DTypeName(dtype()), ShapeToString(sizes()));
  }
  autograd_meta().grad = grad.impl_ptr();
}

AutogradMeta& Tensor::autograd_meta() const {
  TensorImpl& i = impl();
  if (!i.autograd) i.autograd = std::make_unique<AutogradMeta>();
  return *i.autograd;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage();
  impl->offset = storage_offset();
  impl->sizes = sizes();
  impl->strides = strides();
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

namespace {

constexpr int64_t kSummaryThreshold = 1000;  // elements
constexpr int64_t kEdgeItems = 3;

std::string FormatValue(double v, DType dtype) {
  switch (dtype) {
    case DType::kBool: return v != 0 ? "true" : "false";
    case DType::kInt64: return absl::StrFormat("%d", static_cast<int64_t>(v));
    default:
      if (std::isnan(v)) return "nan";
      if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
      return absl::StrFormat("%.4f", v);
  }
}

void Render(const std::vector<double>& values, const Shape& sizes, DType dtype, size_t dim,
            int64_t offset, bool summarise, int indent, std::string* out) {
  if (sizes.empty()) {
    *out += FormatValue(values[0], dtype);
    return;
  }
  const int64_t n = sizes[dim];
  int64_t inner = 1;
  for (size_t i = dim + 1; i < sizes.size(); ++i) inner *= sizes[i];
  *out += "[";
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      *out += dim + 1 == sizes.size() ? "..., " : absl::StrCat("...,\n", std::string(indent + 1, ' '));
      i = n - kEdgeItems;
    }
    if (dim + 1 == sizes.size()) {
      *out += FormatValue(values[offset + i], dtype);
    } else {
      Render(values, sizes, dtype, dim + 1, offset + i * inner, summarise, indent + 1, out);
    }
    if (i + 1 < n) *out += dim + 1 == sizes.size() ? ", " : absl::StrCat(",\n", std::string(indent + 1, ' '));
  }
  *out += "]";
}

}  // namespace

std::string Tensor::ToString() const {
  if (!defined()) return "tensor(undefined)";
  std::string out = "tensor(";
  Render(ToVector<double>(), sizes(), dtype(), 0, 0, numel() > kSummaryThreshold, 7, &out);
  absl::StrAppend(&out, ", dtype=", DTypeName(dtype()));
  if (!device().is_cpu()) absl::StrAppend(&out, ", device=", device().ToString());
  if (dim() != 1 || numel() > kSummaryThreshold) absl::StrAppend(&out, ", shape=", ShapeToString(sizes()));
  if (requires_grad()) absl::StrAppend(&out, ", requires_grad=true");
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.ToString(); }

}  // namespace gw
