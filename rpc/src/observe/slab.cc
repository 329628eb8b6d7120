#include "observe/slab.h"

#include <sys/mman.h>

#include <cstdint>

namespace gw::rpc::internal {

std::unique_ptr<Slab> Slab::Make() {
  // Twice the size, so that an aligned 2 MiB lies inside; the rest is given back.
  void* raw = mmap(nullptr, 2 * kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* const begin = static_cast<char*>(raw);
  char* const data = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(begin) + kBytes - 1) & ~(kBytes - 1));
  if (data > begin) munmap(begin, static_cast<size_t>(data - begin));
  char* const end = begin + 2 * kBytes;
  if (data + kBytes < end) munmap(data + kBytes, static_cast<size_t>(end - (data + kBytes)));
#ifdef MADV_HUGEPAGE
  madvise(data, kBytes, MADV_HUGEPAGE);  // advice: without it, small pages
#endif
  return std::unique_ptr<Slab>(new Slab(data));
}

Slab::~Slab() { munmap(data_, kBytes); }

}  // namespace gw::rpc::internal
