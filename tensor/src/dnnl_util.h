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
//   - PrimitiveCache keeps primitives by a key of the caller's choosing (dims, strides,
//     flags): building a primitive descriptor costs tens of microseconds, more than a
//     small primitive takes to run. Thread-safe; oneDNN primitives may run concurrently.
//   - ScratchMemory/ToLayoutScratch put temporary layouts in gw tensors (the caching
//     allocator); CachedPrimitive keeps built primitive descriptors and primitives per
//     shape, process-wide and thread-safe.
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

// Primitives by key, made by `make()` on a miss. Bounded: emptied when full (the working
// set of a model is a few dozen shapes).
template <typename Primitive>
class PrimitiveCache {
 public:
  using Key = std::vector<int64_t>;

  template <typename Make>
  Primitive Get(const Key& key, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second;
    }
    Primitive made = make();  // outside the lock: creation may JIT-compile
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kCapacity) map_.clear();
    map_.emplace(key, made);
    return made;
  }

 private:
  static constexpr size_t kCapacity = 512;
  std::mutex mu_;
  absl::flat_hash_map<Key, Primitive> map_;
};

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

// A process-wide cache of built primitives (a primitive_desc and its primitive, say) of
// type T, keyed by the integers that determine them (shapes, strides, attributes): a
// primitive_desc costs 0.1-0.5 ms to create even when oneDNN's own primitive cache has the
// primitive. One cache per T; thread-safe; entries are immutable and shared. The cache is
// cleared when it exceeds 512 entries (shapes that change every call).
template <typename T>
std::shared_ptr<const T> CachedPrimitive(const std::vector<int64_t>& key,
                                         const std::function<T()>& build) {
  static std::mutex mu;
  static absl::flat_hash_map<std::vector<int64_t>, std::shared_ptr<const T>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  auto built = std::make_shared<const T>(build());  // outside the lock: it may take a while
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= 512) cache.clear();
  return cache.try_emplace(key, std::move(built)).first->second;
}

}  // namespace gw::internal

#endif  // GRADWIRE_TENSOR_SRC_DNNL_UTIL_H_
