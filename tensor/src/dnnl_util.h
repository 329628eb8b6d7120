// Internal: what every kernel built on oneDNN primitives shares (convolution, pooling,
// normalization, recurrent layers).
//
// Contract
//   - CpuEngine() is the one CPU engine of the process, created on first use (oneDNN's own
//     engine is stateless for the CPU; its primitive cache is process-wide already).
//     Streams are cheap: Run() makes one per call, so kernels are safe to call from any
//     thread at once.
//   - oneDNN computes in float32 here; float64 kernels are gradwire's own (oneDNN has no
//     double precision), so callers dispatch on dtype before coming here.
//   - PlainDesc() describes a tensor's own strides, so a strided input needs no copy when
//     the primitive accepts strided memory; Dnnl() wraps a tensor's data without copying.
//   - ToLayout() reorders into the layout a primitive prefers (format_tag::any) and returns
//     the same memory when it already has it; reorders are counted so profiles can show
//     what they cost.
//   - Errors from oneDNN become gw::Error naming the operation and oneDNN's status.
//   - PrimitiveCache keeps built primitives by a key of the caller's choosing (dims,
//     strides, flags): building a primitive descriptor costs more than a small primitive
//     takes to run. Thread-safe; oneDNN primitives may run concurrently.
//   - ScratchMemory/ToLayoutScratch put temporary layouts in gw tensors (the caching
//     allocator).
//   - IsChannelsLast/EmptyChannelsLast/ToChannelsLast: [N, C, H, W] tensors stored as
//     [N, H, W, C] (PyTorch's channels_last), the layout oneDNN's nhwc kernels read in
//     place; kernels that take one return one, so consecutive layers need no reorders.
#ifndef GRADWIRE_TENSOR_SRC_DNNL_UTIL_H_
#define GRADWIRE_TENSOR_SRC_DNNL_UTIL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"
#include "gradwire/tensor/tensor.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace gw::internal {

inline dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

inline dnnl::memory::dims DnnlDims(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }

// A memory descriptor with `t`'s sizes and strides. REQUIRES: float32.
inline dnnl::memory::desc PlainDesc(const Tensor& t) {
  return dnnl::memory::desc(DnnlDims(t.sizes()), dnnl::memory::data_type::f32,
                            DnnlDims(t.strides()));
}

// A contiguous (row-major) descriptor of the given sizes.
inline dnnl::memory::desc ContiguousDesc(const Shape& sizes) {
  Shape strides(sizes.size(), 1);
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * std::max<int64_t>(sizes[i + 1], 1);
  }
  return dnnl::memory::desc(DnnlDims(sizes), dnnl::memory::data_type::f32, DnnlDims(strides));
}

// oneDNN memory over `t`'s data (no copy). REQUIRES: float32, CPU.
inline dnnl::memory Dnnl(const Tensor& t) {
  return dnnl::memory(PlainDesc(t), CpuEngine(), t.raw_data());
}

// Counts the reorders kernels run (what a profile of a model step reports).
inline std::atomic<int64_t>& ReorderCount() {
  static std::atomic<int64_t> count{0};
  return count;
}

// `mem` in layout `want`: `mem` itself when it already has it, else a reordered copy.
inline dnnl::memory ToLayout(const dnnl::memory& mem, const dnnl::memory::desc& want,
                             dnnl::stream& stream) {
  if (mem.get_desc() == want) return mem;
  dnnl::memory out(want, CpuEngine());
  dnnl::reorder(mem, out).execute(stream, const_cast<dnnl::memory&>(mem), out);
  ReorderCount().fetch_add(1, std::memory_order_relaxed);
  return out;
}

// Copies `mem` (any layout) into the plain tensor `dst`.
inline void ReorderInto(const dnnl::memory& mem, const Tensor& dst, dnnl::stream& stream) {
  dnnl::memory out = Dnnl(dst);
  if (mem.get_desc() == out.get_desc()) return;
  dnnl::reorder(mem, out).execute(stream, const_cast<dnnl::memory&>(mem), out);
  ReorderCount().fetch_add(1, std::memory_order_relaxed);
}

// Runs `body(stream)` and waits; oneDNN's exceptions become gw::Error naming `op`.
template <typename F>
void RunDnnl(std::string_view op, F&& body) {
  try {
    dnnl::stream stream(CpuEngine());
    body(stream);
    stream.wait();
  } catch (const dnnl::error& e) {
    Fail(op, "oneDNN failed: ", e.what(), " (status ", static_cast<int>(e.status), ")");
  }
}

// The attributes of every primitive gradwire caches: a scratchpad the caller passes at each
// execution (DNNL_ARG_SCRATCHPAD, ScratchMemory of pd.scratchpad_desc()). oneDNN's default
// (library) mode ties a primitive to a thread-local buffer of the thread that created it
// (this oneDNN is built without DNNL_ENABLE_CONCURRENT_EXEC), so a cached primitive run on
// another thread (an RPC handler, a backward pass on a pool thread) wrote through a null
// pointer with OMP_NUM_THREADS=1, and two threads running primitives would share it.
inline dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Built primitives (a primitive, or a struct of a primitive_desc and its primitive) of type T
// by a key of the integers that determine them (shapes, strides, attributes), made by
// `make()` on a miss: a primitive_desc costs 0.01-0.5 ms to create even when oneDNN's own
// primitive cache has the primitive, more than a small primitive takes to run. Callers keep
// one cache per kind as a function-local static. Thread-safe; entries are immutable and
// shared (oneDNN primitives may run concurrently). Bounded: emptied when full (a model's
// working set is a few dozen shapes; shapes that change every call start it over).
template <typename T>
class PrimitiveCache {
 public:
  using Key = std::vector<int64_t>;

  template <typename Make>
  std::shared_ptr<const T> Get(const Key& key, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = map_.find(key); it != map_.end()) return it->second;
    }
    auto made = std::make_shared<const T>(make());  // outside the lock: creation may JIT-compile
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kCapacity) map_.clear();
    return map_.try_emplace(key, std::move(made)).first->second;
  }

 private:
  static constexpr size_t kCapacity = 512;
  std::mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<const T>> map_;
};

// A primitive descriptor and the primitive built from it (what backward passes need as
// hints and what execution needs).
template <typename Prim>
struct Built {
  typename Prim::primitive_desc pd;
  Prim prim;
};

template <typename Prim>
Built<Prim> Build(const typename Prim::primitive_desc& pd) {
  return Built<Prim>{pd, Prim(pd)};
}

// Appends a tensor's sizes and strides to a cache key.
inline void AppendLayout(std::vector<int64_t>* key, const Tensor& t) {
  key->push_back(t.dim());
  key->insert(key->end(), t.sizes().begin(), t.sizes().end());
  key->insert(key->end(), t.strides().begin(), t.strides().end());
}

// Memory of layout `desc` backed by a new float32 gw::Tensor, so that the caching CPU
// allocator recycles it (oneDNN's own allocation of a multi-MiB buffer page-faults on
// every call). The tensor is appended to `keep`, which must outlive the memory's use.
inline dnnl::memory ScratchMemory(const dnnl::memory::desc& desc, std::vector<Tensor>& keep) {
  const int64_t floats = static_cast<int64_t>((desc.get_size() + sizeof(float) - 1) / sizeof(float));
  keep.push_back(Tensor::Empty({floats}, DType::kFloat32));
  return dnnl::memory(desc, CpuEngine(), keep.back().raw_data());
}

// Adds to `args` the scratchpad `prim` (made with UserScratchpad()) needs, as ScratchMemory
// kept in `keep`; nothing when it needs none.
inline void AddScratchpad(const dnnl::primitive& prim, std::unordered_map<int, dnnl::memory>& args,
                          std::vector<Tensor>& keep) {
  const dnnl_memory_desc_t* md =
      dnnl_primitive_desc_query_md(prim.get_primitive_desc(), dnnl_query_scratchpad_md, 0);
  if (md == nullptr || dnnl_memory_desc_get_size(md) == 0) return;
  args[DNNL_ARG_SCRATCHPAD] = ScratchMemory(dnnl::memory::desc(*md), keep);
}

// Like ToLayout, with the reordered copy in ScratchMemory.
inline dnnl::memory ToLayoutScratch(const dnnl::memory& mem, const dnnl::memory::desc& want,
                                    dnnl::stream& stream, std::vector<Tensor>& keep) {
  if (mem.get_desc() == want) return mem;
  dnnl::memory out = ScratchMemory(want, keep);
  dnnl::reorder(mem, out).execute(stream, const_cast<dnnl::memory&>(mem), out);
  ReorderCount().fetch_add(1, std::memory_order_relaxed);
  return out;
}

// [N, C, H, W] stored as [N, H, W, C]: a permuted contiguous [N, H, W, C] tensor, with the
// channel stride 1 even for one channel (a contiguous [N, 1, H, W] image is plain; its
// channels-last view has strides [H * W, 1, W, 1]). Other dims of size 1 may have any stride.
inline bool IsChannelsLast(const Tensor& t) {
  if (t.dim() != 4 || t.strides()[1] != 1) return false;
  const Shape& s = t.sizes();
  const Shape& st = t.strides();
  const int64_t want[4] = {s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]};
  for (int d = 0; d < 4; ++d) {
    if (s[d] != 1 && st[d] != want[d]) return false;
  }
  return true;
}

// A new channels-last tensor of the given [N, C, H, W] sizes.
inline Tensor EmptyChannelsLast(const Shape& s, DType dtype = DType::kFloat32) {
  return kernels::Permute(Tensor::Empty({s[0], s[2], s[3], s[1]}, dtype), {0, 3, 1, 2});
}

// `t` itself when channels-last, else a channels-last copy.
inline Tensor ToChannelsLast(const Tensor& t) {
  if (IsChannelsLast(t)) return t;
  return kernels::Permute(kernels::Contiguous(kernels::Permute(t, {0, 2, 3, 1})), {0, 3, 1, 2});
}

}  // namespace gw::internal

#endif  // GRADWIRE_TENSOR_SRC_DNNL_UTIL_H_
