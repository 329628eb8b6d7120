// Indexing kernels: IndexSelect, IndexAdd, Gather, ScatterAdd, Cat, Stack.
#include <cstring>

#include "dispatch.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

struct OuterInner {
  int64_t outer, n, inner;
};

OuterInner SplitAt(const Tensor& t, int64_t dim) {
  OuterInner s{1, t.sizes()[dim], 1};
  for (int64_t i = 0; i < dim; ++i) s.outer *= t.sizes()[i];
  for (int64_t i = dim + 1; i < t.dim(); ++i) s.inner *= t.sizes()[i];
  return s;
}

const int64_t* CheckedIndex(std::string_view op, const Tensor& index, int64_t limit,
                            const Tensor& t, int64_t dim) {
  GW_CHECK(index.dtype() == DType::kInt64 && index.dim() <= 1, op,
           "index must be a 1-D int64 tensor, got ", DTypeName(index.dtype()), " ",
           ShapeToString(index.sizes()));
  const int64_t* p = index.data<int64_t>();
  for (int64_t i = 0; i < index.numel(); ++i) {
    GW_CHECK(p[i] >= 0 && p[i] < limit, op, "index ", p[i], " at position ", i,
             " is out of range for dimension ", dim, " of size ", limit, " (tensor shape ",
             ShapeToString(t.sizes()), ")");
  }
  return p;
}

}  // namespace

Tensor IndexSelect(const Tensor& t, int64_t dim, const Tensor& index) {
  internal::CheckDefined("IndexSelect", t);
  internal::CheckDefined("IndexSelect", index);
  GW_CHECK(t.dim() > 0, "IndexSelect", "cannot index a 0-dimensional tensor");
  dim = NormalizeDim("IndexSelect", dim, t.dim());
  Tensor idx = Contiguous(index);
  const int64_t* ip = CheckedIndex("IndexSelect", idx, t.sizes()[dim], t, dim);
  Tensor src = Contiguous(t);
  const OuterInner s = SplitAt(src, dim);
  const int64_t k = idx.numel();
  Shape out_sizes = t.sizes();
  out_sizes[dim] = k;
  Tensor out = Tensor::Empty(out_sizes, t.dtype());
  const size_t esize = ElementSize(t.dtype());
  const size_t chunk = static_cast<size_t>(s.inner) * esize;
  const char* in = static_cast<const char*>(src.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  for (int64_t a = 0; a < s.outer; ++a) {
    for (int64_t j = 0; j < k; ++j) {
      std::memcpy(o + (a * k + j) * chunk, in + (a * s.n + ip[j]) * chunk, chunk);
    }
  }
  return out;
}

void IndexAddInPlace(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src) {
  internal::CheckDefined("IndexAdd", t);
  internal::CheckDefined("IndexAdd", index);
  internal::CheckDefined("IndexAdd", src);
  internal::CheckSameDType("IndexAdd", t, src);
  GW_CHECK(t.dim() > 0, "IndexAdd", "cannot index a 0-dimensional tensor");
  dim = NormalizeDim("IndexAdd", dim, t.dim());
  Tensor idx = Contiguous(index);
  const int64_t* ip = CheckedIndex("IndexAdd", idx, t.sizes()[dim], t, dim);
  Shape expected = t.sizes();
  expected[dim] = idx.numel();
  GW_CHECK(src.sizes() == expected, "IndexAdd", "source ", ShapeToString(src.sizes()),
           " does not match ", ShapeToString(expected), " (tensor ", ShapeToString(t.sizes()),
           " with ", idx.numel(), " indices along dimension ", dim, ")");
  Tensor dst = Contiguous(t);
  const bool direct = dst.is_same(t);  // else the result is copied back by CopyInPlace
  if (direct) t.storage()->BumpVersion();
  Tensor s_c = Contiguous(src);
  const OuterInner s = SplitAt(dst, dim);
  const int64_t k = idx.numel();
  internal::DispatchNumeric("IndexAdd", t.dtype(), [&]<typename T>() {
    T* o = dst.data<T>();
    const T* in = s_c.data<T>();
    for (int64_t a = 0; a < s.outer; ++a) {
      for (int64_t j = 0; j < k; ++j) {
        T* row = o + (a * s.n + ip[j]) * s.inner;
        const T* srow = in + (a * k + j) * s.inner;
        for (int64_t i = 0; i < s.inner; ++i) row[i] += srow[i];
      }
    }
  });
  if (direct) {
    t.storage()->BumpVersion();
  } else {
    CopyInPlace(t, dst);
  }
}

Tensor IndexAdd(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = Clone(t);
  IndexAddInPlace(out, dim, index, src);
  return out;
}

namespace {

// Checks Gather/ScatterAdd's index against `t` (the tensor indexed along `dim`) and `other`
// (the gathered output or the scattered source, shaped like index or larger): int64, the
// same rank, and no larger than either outside `dim`.
void CheckScatterIndex(std::string_view op, const Tensor& t, int64_t dim, const Tensor& index,
                       const Tensor& other, std::string_view other_name) {
  GW_CHECK(index.dtype() == DType::kInt64, op, "index must be int64, got ",
           DTypeName(index.dtype()), " ", ShapeToString(index.sizes()));
  GW_CHECK(index.dim() == t.dim(), op, "index ", ShapeToString(index.sizes()),
           " must have as many dimensions as the tensor ", ShapeToString(t.sizes()));
  for (int64_t d = 0; d < t.dim(); ++d) {
    GW_CHECK(d == dim || index.sizes()[d] <= t.sizes()[d], op, "index ",
             ShapeToString(index.sizes()), " is larger than the tensor ",
             ShapeToString(t.sizes()), " in dimension ", d);
    if (other.defined()) {
      GW_CHECK(index.sizes()[d] <= other.sizes()[d], op, "index ",
               ShapeToString(index.sizes()), " is larger than the ", other_name, " ",
               ShapeToString(other.sizes()), " in dimension ", d);
    }
  }
}

// Calls f(t_offset, index_offset, other_offset) for every element of `index`, where
// t_offset is t's element offset with `dim` at the index's value. Throws on an index out of
// [0, t.size(dim)).
template <typename F>
void ForEachIndexed(std::string_view op, const Tensor& t, int64_t dim, const Tensor& index,
                    const Shape& other_strides, F&& f) {
  Shape t_strides = t.strides();
  t_strides[dim] = 0;
  const int64_t dim_stride = t.strides()[dim], limit = t.sizes()[dim];
  const int64_t* pi = index.data<int64_t>();
  auto loop = internal::MakeLoop<3>(index.sizes(), {t_strides, index.strides(), other_strides});
  internal::RunLoop(loop, [&](const std::array<int64_t, 3>& off, int64_t n,
                              const std::array<int64_t, 3>& s) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = pi[off[1] + i * s[1]];
      GW_CHECK(j >= 0 && j < limit, op, "index ", j, " is out of range for dimension ", dim,
               " of size ", limit, " (tensor shape ", ShapeToString(t.sizes()), ")");
      f(off[0] + i * s[0] + j * dim_stride, off[2] + i * s[2]);
    }
  });
}

}  // namespace

Tensor Gather(const Tensor& t, int64_t dim, const Tensor& index) {
  internal::CheckDefined("Gather", t);
  internal::CheckDefined("Gather", index);
  dim = NormalizeDim("Gather", dim, t.dim());
  if (t.dim() == 0) return Reshape(Gather(Reshape(t, {1}), 0, Reshape(index, {1})), {});
  CheckScatterIndex("Gather", t, dim, index, Tensor(), "");
  Tensor out = Tensor::Empty(index.sizes(), t.dtype());
  internal::DispatchAll(t.dtype(), [&]<typename T>() {
    const T* pt = t.data<T>();
    T* po = out.data<T>();
    ForEachIndexed("Gather", t, dim, index, out.strides(),
                   [&](int64_t ti, int64_t oi) { po[oi] = pt[ti]; });
  });
  return out;
}

void ScatterAddInPlace(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src) {
  internal::CheckDefined("ScatterAdd", t);
  internal::CheckDefined("ScatterAdd", index);
  internal::CheckDefined("ScatterAdd", src);
  internal::CheckSameDType("ScatterAdd", t, src);
  GW_CHECK(t.dim() > 0, "ScatterAdd", "cannot scatter into a 0-dimensional tensor");
  dim = NormalizeDim("ScatterAdd", dim, t.dim());
  CheckScatterIndex("ScatterAdd", t, dim, index, src, "source");
  for (int64_t d = 0; d < t.dim(); ++d) {
    GW_CHECK(t.strides()[d] != 0 || t.sizes()[d] <= 1, "ScatterAdd", "destination ",
             ShapeToString(t.sizes()), " has broadcast (stride 0) dimensions");
  }
  const Tensor s = src.storage() == t.storage() ? Clone(src) : src;
  t.storage()->BumpVersion();
  internal::DispatchNumeric("ScatterAdd", t.dtype(), [&]<typename T>() {
    T* pt = t.data<T>();
    const T* ps = s.data<T>();
    ForEachIndexed("ScatterAdd", t, dim, index, s.strides(),
                   [&](int64_t ti, int64_t si) { pt[ti] += ps[si]; });
  });
  t.storage()->BumpVersion();
}

Tensor ScatterAdd(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = Clone(t);
  ScatterAddInPlace(out, dim, index, src);
  return out;
}

Tensor Cat(const std::vector<Tensor>& tensors, int64_t dim) {
  GW_CHECK(!tensors.empty(), "Cat", "needs at least one tensor");
  const Tensor& first = tensors[0];
  internal::CheckDefined("Cat", first);
  GW_CHECK(first.dim() > 0, "Cat", "cannot concatenate 0-dimensional tensors");
  dim = NormalizeDim("Cat", dim, first.dim());
  Shape sizes = first.sizes();
  sizes[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    internal::CheckDefined("Cat", t);
    internal::CheckSameDType("Cat", first, t);
    bool ok = t.dim() == first.dim();
    for (int64_t d = 0; ok && d < t.dim(); ++d) ok = d == dim || t.sizes()[d] == first.sizes()[d];
    GW_CHECK(ok, "Cat", "tensor ", i, " has shape ", ShapeToString(t.sizes()),
             " but tensor 0 has shape ", ShapeToString(first.sizes()),
             " (only dimension ", dim, " may differ)");
    sizes[dim] += t.sizes()[dim];
  }
  Tensor out = Tensor::Empty(sizes, first.dtype());
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    CopyInPlace(Narrow(out, dim, offset, t.sizes()[dim]), t);
    offset += t.sizes()[dim];
  }
  return out;
}

Tensor Stack(const std::vector<Tensor>& tensors, int64_t dim) {
  GW_CHECK(!tensors.empty(), "Stack", "needs at least one tensor");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    internal::CheckDefined("Stack", tensors[i]);
    GW_CHECK(tensors[i].sizes() == tensors[0].sizes(), "Stack", "tensor ", i, " has shape ",
             ShapeToString(tensors[i].sizes()), " but tensor 0 has shape ",
             ShapeToString(tensors[0].sizes()));
    expanded.push_back(Unsqueeze(tensors[i], NormalizeDim("Stack", dim, tensors[0].dim() + 1)));
  }
  return Cat(expanded, dim);
}

}  // namespace gw::kernels
