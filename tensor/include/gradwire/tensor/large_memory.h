// Memory for large arrays that hot paths use: the parameter server's row chunks and
// index, the tracer's span chunks.
//
// Contract
//   - AllocateLarge(bytes): a block of 2 MiB or more is 2 MiB aligned and advised to use
//     transparent huge pages (madvise MADV_HUGEPAGE; a hint the kernel may not take), so
//     random rows do not each cost a TLB miss, and touching it first costs one page fault
//     instead of 512 (14 us each on the VM of BENCHMARKS.md). Smaller blocks come from
//     malloc. Throws std::bad_alloc when the system has no memory to give.
//   - FreeLarge(p) returns a block (null: nothing). Thread-safe.
#ifndef GRADWIRE_TENSOR_LARGE_MEMORY_H_
#define GRADWIRE_TENSOR_LARGE_MEMORY_H_

#include <cstddef>

namespace gw {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

void* AllocateLarge(size_t bytes);
void FreeLarge(void* p);

struct FreeLargeDeleter {
  void operator()(void* p) const { FreeLarge(p); }
};

template <typename T>
struct LargeAllocator {
  using value_type = T;
  LargeAllocator() = default;
  template <typename U>
  LargeAllocator(const LargeAllocator<U>&) {}  // NOLINT
  T* allocate(size_t n) { return static_cast<T*>(AllocateLarge(n * sizeof(T))); }
  void deallocate(T* p, size_t) { FreeLarge(p); }
  friend bool operator==(const LargeAllocator&, const LargeAllocator&) { return true; }
};

}  // namespace gw

#endif  // GRADWIRE_TENSOR_LARGE_MEMORY_H_
