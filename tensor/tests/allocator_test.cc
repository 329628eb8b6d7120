// Unit: CachingCpuAllocator — recycling, size classes, the cache bound.
#include "gradwire/tensor/allocator.h"
#include "gradwire/tensor/large_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "gradwire/tensor/tensor.h"

namespace gw {
namespace {

TEST(CachingCpuAllocatorTest, RecyclesLargeBlocksAndBypassesSmallOnes) {
  CachingCpuAllocator alloc({.min_cached_bytes = 1 << 16, .max_cached_bytes = 1 << 22});
  void* a = alloc.Allocate(1 << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  std::memset(a, 1, 1 << 20);
  alloc.Free(a, 1 << 20);
  EXPECT_EQ(alloc.cached_bytes(), size_t{1} << 20);
  void* b = alloc.Allocate((1 << 20) - 100);  // same size class
  EXPECT_EQ(a, b);
  EXPECT_EQ(alloc.cached_bytes(), 0u);
  alloc.Free(b, (1 << 20) - 100);
  void* small = alloc.Allocate(100);
  alloc.Free(small, 100);
  EXPECT_EQ(alloc.cached_bytes(), size_t{1} << 20);  // small blocks are never cached
  alloc.EmptyCache();
  EXPECT_EQ(alloc.cached_bytes(), 0u);
  EXPECT_EQ(alloc.Allocate(0), nullptr);
}

TEST(CachingCpuAllocatorTest, SizeClassesWasteAtMostAnEighth) {
  CachingCpuAllocator alloc({});
  for (size_t n : {size_t{65536}, size_t{100000}, size_t{4194304}, size_t{4194305}, size_t{12345678}}) {
    const size_t r = alloc.RoundSize(n);
    EXPECT_GE(r, n);
    EXPECT_LE(r - n, n / 8) << n;
  }
}

TEST(CachingCpuAllocatorTest, CacheIsBounded) {
  CachingCpuAllocator alloc({.min_cached_bytes = 1 << 16, .max_cached_bytes = 3 << 20});
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(alloc.Allocate(1 << 20));
  for (void* p : blocks) alloc.Free(p, 1 << 20);
  EXPECT_EQ(alloc.cached_bytes(), size_t{3} << 20);
}

TEST(CachingCpuAllocatorTest, StorageReturnsMemoryToItsAllocator) {
  CachingCpuAllocator alloc({.min_cached_bytes = 1 << 10, .max_cached_bytes = 1 << 22});
  {
    auto storage = Storage::Allocate(1 << 12, alloc);
    Tensor t = Tensor::FromStorage(storage, DType::kFloat32, {1024}, {1});
    EXPECT_EQ(alloc.cached_bytes(), 0u);
  }
  EXPECT_EQ(alloc.cached_bytes(), size_t{1} << 12);
}

}  // namespace
// Large blocks (the row store's chunks, the tracer's span chunks) are 2 MiB aligned, so
// that one huge page can back them; small ones are plain malloc memory.
TEST(LargeMemoryTest, LargeBlocksAreHugePageAlignedAndWritable) {
  std::unique_ptr<char[], FreeLargeDeleter> a(static_cast<char*>(AllocateLarge(kHugePageBytes)));
  std::unique_ptr<char[], FreeLargeDeleter> b(static_cast<char*>(AllocateLarge(3 * kHugePageBytes + 1)));
  std::unique_ptr<char[], FreeLargeDeleter> small(static_cast<char*>(AllocateLarge(100)));
  for (char* block : {a.get(), b.get()}) EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % kHugePageBytes, 0u);
  std::memset(a.get(), 0x5a, kHugePageBytes);
  std::memset(b.get(), 0x5a, 3 * kHugePageBytes + 1);
  std::memset(small.get(), 0x5a, 100);
  EXPECT_EQ(a.get()[kHugePageBytes - 1], 0x5a);
  EXPECT_EQ(b.get()[3 * kHugePageBytes], 0x5a);
  EXPECT_NE(a.get(), b.get());
}

}  // namespace gw
