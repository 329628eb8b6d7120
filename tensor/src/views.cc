// View and copy kernels: everything that changes how a storage is seen.
#include <algorithm>
#include <cstring>

#include "cuda/cuda_kernels.h"
#include "dispatch.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"

namespace gw {
namespace internal {

Shape BroadcastStrides(const Tensor& t, const Shape& sizes, std::string_view op) {
  const size_t n = sizes.size();
  const size_t k = static_cast<size_t>(t.dim());
  GW_CHECK(k <= n, op, "cannot broadcast ", ShapeToString(t.sizes()), " to ",
           ShapeToString(sizes));
  Shape strides(n, 0);
  for (size_t i = 0; i < k; ++i) {
    const int64_t ts = t.sizes()[i];
    const int64_t target = sizes[n - k + i];
    GW_CHECK(ts == target || ts == 1, op, "cannot broadcast ",
             ShapeToString(t.sizes()), " to ", ShapeToString(sizes));
    strides[n - k + i] = ts == 1 ? 0 : t.strides()[i];
  }
  return strides;
}

}  // namespace internal

namespace kernels {
namespace {

Tensor MakeView(const Tensor& t, Shape sizes, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->offset = offset;
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

Shape InferSize(std::string_view op, const Tensor& t, Shape sizes) {
  int64_t infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      GW_CHECK(infer < 0, op, "only one dimension can be -1 in ", ShapeToString(sizes));
      infer = static_cast<int64_t>(i);
    } else {
      GW_CHECK(sizes[i] >= 0, op, "invalid size in ", ShapeToString(sizes));
      known *= sizes[i];
    }
  }
  if (infer >= 0) {
    GW_CHECK(known != 0 && t.numel() % known == 0, op, "cannot reshape ",
             ShapeToString(t.sizes()), " into ", ShapeToString(sizes));
    sizes[infer] = t.numel() / known;
  }
  GW_CHECK(NumElements(sizes) == t.numel(), op, "cannot reshape ", ShapeToString(t.sizes()),
           " (", t.numel(), " elements) into ", ShapeToString(sizes));
  return sizes;
}

// Strides for viewing t with `sizes` without a copy, if possible (NumPy's algorithm).
bool ViewStrides(const Tensor& t, const Shape& sizes, Shape* out) {
  if (t.numel() == 0 || t.is_contiguous()) {
    *out = ContiguousStrides(sizes);
    return true;
  }
  const Shape& os = t.sizes();
  const Shape& ot = t.strides();
  Shape ns(sizes.size());
  int64_t view_d = static_cast<int64_t>(sizes.size()) - 1;
  int64_t chunk_base_stride = ot.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t d = static_cast<int64_t>(os.size()) - 1; d >= 0; --d) {
    tensor_numel *= os[d];
    if (d == 0 || (os[d - 1] != 1 && ot[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || sizes[view_d] == 1)) {
        ns[view_d] = view_numel * chunk_base_stride;
        view_numel *= sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = ot[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return false;
  *out = ns;
  return true;
}

}  // namespace

Tensor View(const Tensor& t, Shape sizes) {
  internal::CheckTensor("View", t);
  sizes = InferSize("View", t, std::move(sizes));
  Shape strides;
  GW_CHECK(ViewStrides(t, sizes, &strides), "View", "a tensor of shape ",
           ShapeToString(t.sizes()), " with strides ", ShapeToString(t.strides()),
           " cannot be viewed as ", ShapeToString(sizes), "; use Reshape (copies)");
  return MakeView(t, std::move(sizes), std::move(strides), t.storage_offset());
}

Tensor Reshape(const Tensor& t, Shape sizes) {
  internal::CheckTensor("Reshape", t);
  sizes = InferSize("Reshape", t, std::move(sizes));
  Shape strides;
  if (ViewStrides(t, sizes, &strides)) {
    return MakeView(t, std::move(sizes), std::move(strides), t.storage_offset());
  }
  Tensor c = Clone(t);
  return MakeView(c, sizes, ContiguousStrides(sizes), 0);
}

Tensor Transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  internal::CheckTensor("Transpose", t);
  dim0 = NormalizeDim("Transpose", dim0, t.dim());
  dim1 = NormalizeDim("Transpose", dim1, t.dim());
  Shape sizes = t.sizes(), strides = t.strides();
  if (t.dim() > 0) {
    std::swap(sizes[dim0], sizes[dim1]);
    std::swap(strides[dim0], strides[dim1]);
  }
  return MakeView(t, std::move(sizes), std::move(strides), t.storage_offset());
}

Tensor Permute(const Tensor& t, const Shape& dims) {
  internal::CheckTensor("Permute", t);
  GW_CHECK(static_cast<int64_t>(dims.size()) == t.dim(), "Permute", "permutation ",
           ShapeToString(dims), " does not match a tensor of shape ", ShapeToString(t.sizes()));
  Shape sizes(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = NormalizeDim("Permute", dims[i], t.dim());
    GW_CHECK(!seen[d], "Permute", "repeated dimension in ", ShapeToString(dims));
    seen[d] = true;
    sizes[i] = t.sizes()[d];
    strides[i] = t.strides()[d];
  }
  return MakeView(t, std::move(sizes), std::move(strides), t.storage_offset());
}

Tensor Narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  internal::CheckTensor("Narrow", t);
  GW_CHECK(t.dim() > 0, "Narrow", "cannot narrow a 0-dimensional tensor");
  dim = NormalizeDim("Narrow", dim, t.dim());
  const int64_t n = t.sizes()[dim];
  if (start < 0) start += n;
  GW_CHECK(start >= 0 && length >= 0 && start + length <= n, "Narrow", "range [", start, ", ",
           start + length, ") is out of bounds for dimension ", dim, " of shape ",
           ShapeToString(t.sizes()));
  Shape sizes = t.sizes();
  sizes[dim] = length;
  return MakeView(t, std::move(sizes), t.strides(), t.storage_offset() + start * t.strides()[dim]);
}

Tensor Select(const Tensor& t, int64_t dim, int64_t index) {
  internal::CheckTensor("Select", t);
  GW_CHECK(t.dim() > 0, "Select", "cannot select from a 0-dimensional tensor");
  dim = NormalizeDim("Select", dim, t.dim());
  const int64_t n = t.sizes()[dim];
  if (index < 0) index += n;
  GW_CHECK(index >= 0 && index < n, "Select", "index ", index, " is out of range for dimension ",
           dim, " of shape ", ShapeToString(t.sizes()));
  Shape sizes = t.sizes(), strides = t.strides();
  const int64_t offset = t.storage_offset() + index * strides[dim];
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  return MakeView(t, std::move(sizes), std::move(strides), offset);
}

Tensor Expand(const Tensor& t, const Shape& sizes) {
  internal::CheckTensor("Expand", t);
  GW_CHECK(static_cast<int64_t>(sizes.size()) >= t.dim(), "Expand", "cannot expand ",
           ShapeToString(t.sizes()), " to fewer dimensions ", ShapeToString(sizes));
  Shape target = sizes;
  const size_t lead = sizes.size() - static_cast<size_t>(t.dim());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (target[i] == -1) {
      GW_CHECK(i >= lead, "Expand", "-1 is not allowed for new leading dimensions in ",
               ShapeToString(sizes));
      target[i] = t.sizes()[i - lead];
    }
    GW_CHECK(target[i] >= 0, "Expand", "invalid size ", sizes[i], " in ", ShapeToString(sizes),
             " for a tensor of shape ", ShapeToString(t.sizes()));
  }
  Shape strides = internal::BroadcastStrides(t, target, "Expand");
  return MakeView(t, std::move(target), std::move(strides), t.storage_offset());
}

Tensor Squeeze(const Tensor& t, int64_t dim) {
  internal::CheckTensor("Squeeze", t);
  if (t.dim() == 0) return MakeView(t, t.sizes(), t.strides(), t.storage_offset());
  dim = NormalizeDim("Squeeze", dim, t.dim());
  if (t.sizes()[dim] != 1) return MakeView(t, t.sizes(), t.strides(), t.storage_offset());
  Shape sizes = t.sizes(), strides = t.strides();
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  return MakeView(t, std::move(sizes), std::move(strides), t.storage_offset());
}

Tensor Unsqueeze(const Tensor& t, int64_t dim) {
  internal::CheckTensor("Unsqueeze", t);
  dim = NormalizeDim("Unsqueeze", dim, t.dim() + 1);
  Shape sizes = t.sizes(), strides = t.strides();
  const int64_t stride = dim < t.dim() ? sizes[dim] * strides[dim] : 1;
  sizes.insert(sizes.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  return MakeView(t, std::move(sizes), std::move(strides), t.storage_offset());
}

Tensor Flatten2D(const Tensor& t) {
  internal::CheckTensor("Flatten2D", t);
  GW_CHECK(t.dim() >= 1, "Flatten2D", "needs at least one dimension, got a 0-d tensor");
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) rows *= t.sizes()[i];
  return Reshape(t, {rows, t.sizes().back()});
}

Tensor Flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  internal::CheckTensor("Flatten", t);
  if (t.dim() == 0) return Reshape(t, {1});
  const int64_t start = NormalizeDim("Flatten", start_dim, t.dim());
  const int64_t end = NormalizeDim("Flatten", end_dim, t.dim());
  GW_CHECK(start <= end, "Flatten", "start_dim ", start_dim, " comes after end_dim ", end_dim,
           " for a tensor of shape ", ShapeToString(t.sizes()));
  Shape sizes(t.sizes().begin(), t.sizes().begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= t.sizes()[d];
  sizes.push_back(merged);
  sizes.insert(sizes.end(), t.sizes().begin() + end + 1, t.sizes().end());
  return Reshape(t, std::move(sizes));
}

std::vector<Tensor> Split(const Tensor& t, const Shape& sizes, int64_t dim) {
  internal::CheckTensor("Split", t);
  GW_CHECK(t.dim() > 0, "Split", "cannot split a 0-dimensional tensor");
  dim = NormalizeDim("Split", dim, t.dim());
  int64_t total = 0;
  for (int64_t s : sizes) {
    GW_CHECK(s >= 0, "Split", "negative size in ", ShapeToString(sizes));
    total += s;
  }
  GW_CHECK(total == t.sizes()[dim], "Split", "sizes ", ShapeToString(sizes), " sum to ", total,
           " but dimension ", dim, " of ", ShapeToString(t.sizes()), " has ", t.sizes()[dim]);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(Narrow(t, dim, start, s));
    start += s;
  }
  return pieces;
}

namespace {

// split_size pieces of dimension `dim`, the last one smaller when it does not divide.
Shape SplitSizes(std::string_view op, const Tensor& t, int64_t split_size, int64_t dim) {
  internal::CheckTensor(op, t);
  GW_CHECK(t.dim() > 0, op, "cannot split a 0-dimensional tensor");
  const int64_t n = t.sizes()[NormalizeDim(op, dim, t.dim())];
  GW_CHECK(split_size > 0 || (split_size == 0 && n == 0), op, "split size must be positive, got ",
           split_size, " for a tensor of shape ", ShapeToString(t.sizes()));
  if (n == 0) return {0};
  Shape sizes;
  for (int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  return sizes;
}

}  // namespace

std::vector<Tensor> Split(const Tensor& t, int64_t split_size, int64_t dim) {
  return Split(t, SplitSizes("Split", t, split_size, dim), dim);
}

std::vector<Tensor> Chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  internal::CheckTensor("Chunk", t);
  GW_CHECK(chunks > 0, "Chunk", "chunks must be positive, got ", chunks);
  GW_CHECK(t.dim() > 0, "Chunk", "cannot chunk a 0-dimensional tensor");
  const int64_t n = t.sizes()[NormalizeDim("Chunk", dim, t.dim())];
  return Split(t, SplitSizes("Chunk", t, (n + chunks - 1) / chunks, dim), dim);
}

Tensor Contiguous(const Tensor& t) {
  internal::CheckTensor("Contiguous", t);
  return t.is_contiguous() ? t : Clone(t);
}

Tensor Clone(const Tensor& t) {
  if (internal::cuda::OnCuda("Clone", t)) {
    Tensor out = Tensor::Empty(t.sizes(), t.dtype(), t.device());
    internal::cuda::Unary(internal::cuda::UnaryOp::kCopy, out, t);
    return out;
  }
  internal::CheckDefined("Clone", t);
  Tensor out = Tensor::Empty(t.sizes(), t.dtype());
  if (t.is_contiguous()) {
    if (t.nbytes() > 0) std::memcpy(out.raw_data(), t.raw_data(), t.nbytes());
    return out;
  }
  internal::DispatchAll(t.dtype(), [&]<typename T>() {
    internal::UnaryLoop<T, T>(out, t, [](T x) { return x; });
  });
  return out;
}

Tensor ToDevice(const Tensor& t, Device device) {
  internal::CheckTensor("ToDevice", t);
  if (t.device() == device) return t;
  if (device.is_cuda()) gw::cuda::CheckDevice("ToDevice", device);
  const Tensor src = Contiguous(t);
  Tensor out = Tensor::Empty(t.sizes(), t.dtype(), device);
  internal::cuda::CopyBytes(out, src);
  return out;
}

Tensor ToDType(const Tensor& t, DType dtype) {
  internal::CheckTensor("ToDType", t);
  if (t.dtype() == dtype) return t;
  if (internal::cuda::OnCuda("ToDType", t)) {
    Tensor out = Tensor::Empty(t.sizes(), dtype, t.device());
    internal::cuda::Unary(internal::cuda::UnaryOp::kCopy, out, t);
    return out;
  }
  internal::CheckDefined("ToDType", t);
  Tensor out = Tensor::Empty(t.sizes(), dtype);
  internal::DispatchAll(dtype, [&]<typename R>() {
    internal::DispatchAll(t.dtype(), [&]<typename A>() {
      internal::UnaryLoop<R, A>(out, t, [](A x) { return static_cast<R>(x); });
    });
  });
  return out;
}

}  // namespace kernels
}  // namespace gw
