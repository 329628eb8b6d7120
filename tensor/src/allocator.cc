#include "gradwire/tensor/allocator.h"

#include <bit>
#include <cstdlib>
#include <string>

#include "gradwire/tensor/error.h"

namespace gw {
namespace {

constexpr size_t kAlignment = 64;

void* SystemAllocate(size_t nbytes) {
  const size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  GW_CHECK(p != nullptr, "Allocate", "out of memory allocating ", nbytes, " bytes");
  return p;
}

}  // namespace

CachingCpuAllocator::CachingCpuAllocator(Options options) : options_(options) {}

CachingCpuAllocator::~CachingCpuAllocator() { EmptyCache(); }

CachingCpuAllocator& CachingCpuAllocator::Default() {
  // Never destroyed: tensors may be freed during static destruction.
  static CachingCpuAllocator* const allocator = [] {
    Options options;
#if defined(__SANITIZE_ADDRESS__)
    options.max_cached_bytes = 0;  // let AddressSanitizer see every use after free
#endif
    if (const char* mb = std::getenv("GRADWIRE_CPU_CACHE_MB")) {
      options.max_cached_bytes = static_cast<size_t>(std::strtoull(mb, nullptr, 10)) << 20;
    }
    return new CachingCpuAllocator(options);
  }();
  return *allocator;
}

size_t CachingCpuAllocator::RoundSize(size_t nbytes) const {
  if (nbytes < options_.min_cached_bytes) return nbytes;
  // Classes of 1/8 of the enclosing power of two: at most 12.5% waste.
  const size_t step = std::bit_floor(nbytes) / 8;
  return (nbytes + step - 1) / step * step;
}

void* CachingCpuAllocator::Allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = RoundSize(nbytes);
  if (size >= options_.min_cached_bytes && options_.max_cached_bytes > 0) {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= size;
      return p;
    }
  }
  return SystemAllocate(size);
}

void CachingCpuAllocator::Free(void* p, size_t nbytes) {
  if (p == nullptr) return;
  const size_t size = RoundSize(nbytes);
  if (size >= options_.min_cached_bytes) {
    absl::MutexLock lock(&mu_);
    if (cached_bytes_ + size <= options_.max_cached_bytes) {
      free_[size].push_back(p);
      cached_bytes_ += size;
      return;
    }
  }
  std::free(p);
}

void CachingCpuAllocator::EmptyCache() {
  absl::flat_hash_map<size_t, std::vector<void*>> blocks;
  {
    absl::MutexLock lock(&mu_);
    blocks.swap(free_);
    cached_bytes_ = 0;
  }
  for (auto& [_, list] : blocks) {
    for (void* p : list) std::free(p);
  }
}

size_t CachingCpuAllocator::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

}  // namespace gw
