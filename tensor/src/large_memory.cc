#include "gradwire/tensor/large_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace gw {

void* AllocateLarge(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void* p = std::malloc(std::max<size_t>(bytes, 1));
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void* p = std::aligned_alloc(kHugePageBytes, (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes);
  if (p == nullptr) throw std::bad_alloc();
  (void)::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: fine to fail
  return p;
}

void FreeLarge(void* p) { std::free(p); }

}  // namespace gw
