// Tensor: an n-dimensional strided view over a shared Storage, with autograd metadata.
//
// Contract
//   - A Tensor is a cheap handle (one shared_ptr). Copies alias the same TensorImpl;
//     views (kernels::Reshape/Transpose/Narrow/Expand...) make a new TensorImpl over the
//     same Storage. A default-constructed Tensor is undefined (defined() == false).
//   - Elements live at storage->data() + (offset + sum(index[i] * stride[i])) * elemsize.
//   - The class holds data and metadata only. Math that records autograd is in
//     gradwire/autograd/functions.h (namespace gw); math that never records it is in
//     gradwire/tensor/kernels.h (namespace gw::kernels).
//   - Autograd metadata (requires_grad, grad_fn, grad) is stored here but interpreted by
//     the autograd layer; the tensor layer only knows autograd::Node by name.
//   - Thread safety: distinct Tensors may be used concurrently; mutating one Tensor's
//     data or autograd metadata from two threads needs external synchronisation.
#ifndef GRADWIRE_TENSOR_TENSOR_H_
#define GRADWIRE_TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "gradwire/tensor/device.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/shape.h"
#include "gradwire/tensor/storage.h"

namespace gw {

namespace autograd {
class Node;
class LeafHooks;
}  // namespace autograd

class Tensor;
struct TensorImpl;

// Per-tensor autograd state. Created lazily, only for tensors that take part in autograd.
struct AutogradMeta {
  bool requires_grad = false;
  // Non-leaf tensors: the node that computes their gradient, and which of its inputs.
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  // Leaves: the node that accumulates into `grad` (weak: the node owns the tensor).
  std::weak_ptr<autograd::Node> grad_accumulator;
  std::shared_ptr<TensorImpl> grad;
  // Leaves: hooks that run once the leaf's gradient of a pass is accumulated
  // (autograd/grad_hooks.h).
  std::shared_ptr<autograd::LeafHooks> hooks;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape sizes;
  Shape strides;  // in elements
  DType dtype = DType::kFloat32;
  std::unique_ptr<AutogradMeta> autograd;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation (all contiguous) ----
  static Tensor Empty(const Shape& sizes, DType dtype = DType::kFloat32, Device device = kCPU);
  // On a GPU (`device` cuda:N), Empty's memory comes from that device's caching allocator
  // and the fills are queued on its current stream; where there is no such GPU they throw
  // gw::Error naming the device and why (gradwire/tensor/cuda.h).
  static Tensor Zeros(const Shape& sizes, DType dtype = DType::kFloat32, Device device = kCPU);
  static Tensor Ones(const Shape& sizes, DType dtype = DType::kFloat32, Device device = kCPU);
  static Tensor Full(const Shape& sizes, double value, DType dtype = DType::kFloat32, Device device = kCPU);
  // A 0-dimensional tensor holding `value`.
  static Tensor Scalar(double value, DType dtype = DType::kFloat32);
  // [start, end) in steps of `step`; int64 unless a floating dtype is given.
  static Tensor Arange(double start, double end, double step = 1, DType dtype = DType::kInt64);
  // REQUIRES: NumElements(sizes) == values.size(). An empty `sizes` means 1-D.
  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, Shape sizes = {});
  static Tensor Randn(const Shape& sizes, Generator& gen, DType dtype = DType::kFloat32);
  static Tensor Rand(const Shape& sizes, Generator& gen, DType dtype = DType::kFloat32);
  static Tensor Uniform(const Shape& sizes, double low, double high, Generator& gen,
                        DType dtype = DType::kFloat32);
  // A view of existing storage. REQUIRES: the view stays inside the storage.
  static Tensor FromStorage(std::shared_ptr<Storage> storage, DType dtype, Shape sizes,
                            Shape strides, int64_t offset = 0);

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().sizes.size()); }
  int64_t numel() const { return NumElements(impl().sizes); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t storage_offset() const { return impl().offset; }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * ElementSize(dtype()); }
  bool is_contiguous() const;

  // Pointer to the first element (a device pointer for a tensor on a GPU). REQUIRES: T
  // matches dtype() (checked).
  template <typename T>
  T* data() const;
  void* raw_data() const;

  // The single value of a one-element tensor, converted to T (copied from a GPU first).
  template <typename T = double>
  T item() const;
  // The elements in logical (row-major) order, converted to T.
  template <typename T>
  std::vector<T> ToVector() const;

  // ---- autograd metadata (interpreted by gradwire/autograd) ----
  bool requires_grad() const { return impl().autograd && impl().autograd->requires_grad; }
  // Marks a leaf as a parameter/input whose gradient should be computed.
  // REQUIRES: a floating dtype and a leaf (no grad_fn). Returns *this.
  const Tensor& set_requires_grad(bool requires_grad) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  uint32_t output_nr() const { return impl().autograd ? impl().autograd->output_nr : 0; }
  bool is_leaf() const { return grad_fn() == nullptr; }
  // The accumulated gradient of a leaf; undefined until a backward pass reaches it.
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  AutogradMeta& autograd_meta() const;  // creates it on first use

  // A tensor sharing this one's data and shape but with no autograd history.
  Tensor detach() const;

  // ---- identity ----
  TensorImpl* unsafe_impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // A readable rendering, e.g. "tensor([[1.0000, 2.0000]], dtype=float32)"; large
  // tensors are summarised with "...".
  std::string ToString() const;

 private:
  TensorImpl& impl() const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- template definitions ----

template <>
std::vector<bool> Tensor::ToVector<bool>() const;

template <typename T>
T* Tensor::data() const {
  GW_CHECK(dtype() == DTypeOf<T>(), "Tensor::data", "requested ", DTypeName(DTypeOf<T>()),
           " from a ", DTypeName(dtype()), " tensor");
  return static_cast<T*>(impl().storage->data()) + impl().offset;
}

}  // namespace gw

#endif  // GRADWIRE_TENSOR_TENSOR_H_
