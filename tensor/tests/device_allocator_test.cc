// The caching device allocator's bookkeeping through a host-memory backend behind the same
// interface as cudaMalloc and CUDA events (events complete when the test says so), device
// names, and what a CUDA tensor does where there is no GPU.
#include "gradwire/tensor/device_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"
#include "gradwire/tensor/tensor.h"

namespace gw {
namespace {

// Real host memory, with a byte budget; events complete when Complete() says so.
class HostMemoryBackend final : public DeviceMemoryBackend {
 public:
  struct State {
    size_t budget = size_t{1} << 30;
    size_t in_use = 0;
    int mallocs = 0;
    int frees = 0;
    StreamId current = 0;
    EventId next_event = 1;
    absl::flat_hash_map<EventId, StreamId> events;  // recorded, not yet completed
    std::set<EventId> completed;
    std::set<EventId> destroyed;
    absl::flat_hash_map<void*, size_t> sizes;
  };
  explicit HostMemoryBackend(State* state) : s_(state) {}

  Device device() const override { return Cuda(3); }
  void* Malloc(size_t nbytes) override {
    if (s_->in_use + nbytes > s_->budget) return nullptr;
    void* p = std::malloc(nbytes);
    s_->in_use += nbytes;
    s_->sizes[p] = nbytes;
    ++s_->mallocs;
    return p;
  }
  void Free(void* p) override {
    s_->in_use -= s_->sizes.at(p);
    s_->sizes.erase(p);
    std::free(p);
    ++s_->frees;
  }
  StreamId CurrentStream() override { return s_->current; }
  EventId RecordEvent(StreamId stream) override {
    const EventId e = s_->next_event++;
    s_->events[e] = stream;
    return e;
  }
  bool EventDone(EventId event) override { return s_->completed.contains(event); }
  void DestroyEvent(EventId event) override {
    s_->destroyed.insert(event);
    s_->events.erase(event);
  }

 private:
  State* s_;
};

class DeviceAllocatorTest : public ::testing::Test {
 protected:
  HostMemoryBackend::State state_;
  CachingDeviceAllocator alloc_{std::make_unique<HostMemoryBackend>(&state_)};

  // Completes every event recorded on `stream` so far.
  void CompleteStream(StreamId stream) {
    for (const auto& [e, s] : state_.events) {
      if (s == stream) state_.completed.insert(e);
    }
  }
};

TEST_F(DeviceAllocatorTest, SmallRequestsShareOneSegmentAndAreRounded) {
  void* a = alloc_.Allocate(100);
  void* b = alloc_.Allocate(1000);
  EXPECT_EQ(state_.mallocs, 1);                                   // one 2 MiB segment
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 512);  // 100 rounded up to 512
  const DeviceMemoryStats st = alloc_.stats();
  EXPECT_EQ(st.allocated_bytes, 512u + 1024u);
  EXPECT_EQ(st.reserved_bytes, CachingDeviceAllocator::kSmallSegment);
  EXPECT_EQ(st.segments, 1u);
  EXPECT_EQ(alloc_.device(), Cuda(3));
  alloc_.Free(a, 100);
  alloc_.Free(b, 1000);
  EXPECT_EQ(alloc_.stats().allocated_bytes, 0u);
}

TEST_F(DeviceAllocatorTest, FreedBlocksAreReusedWithoutTheBackend) {
  void* a = alloc_.Allocate(4 << 20);
  alloc_.Free(a, 4 << 20);
  void* b = alloc_.Allocate(4 << 20);
  EXPECT_EQ(a, b);
  EXPECT_EQ(state_.mallocs, 1);
  const DeviceMemoryStats st = alloc_.stats();
  EXPECT_EQ(st.allocations, 2u);
  EXPECT_EQ(st.cache_hits, 1u);
  EXPECT_EQ(st.peak_allocated_bytes, size_t{4} << 20);
  alloc_.Free(b, 0);
}

TEST_F(DeviceAllocatorTest, LargeBlocksSplitAndMergeBack) {
  void* big = alloc_.Allocate(8 << 20);  // an 8 MiB segment
  alloc_.Free(big, 0);
  void* a = alloc_.Allocate(3 << 20);  // cut from it: 5 MiB remain, more than 1 MiB: split
  void* b = alloc_.Allocate(3 << 20);
  EXPECT_EQ(a, big);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(big) + (3 << 20));
  EXPECT_EQ(state_.mallocs, 1);
  alloc_.Free(a, 0);
  alloc_.Free(b, 0);
  // Merged again: the whole 8 MiB serves one request.
  void* c = alloc_.Allocate(8 << 20);
  EXPECT_EQ(c, big);
  EXPECT_EQ(state_.mallocs, 1);
  alloc_.Free(c, 0);
  alloc_.EmptyCache();
  EXPECT_EQ(state_.frees, 1);
  EXPECT_EQ(alloc_.stats().reserved_bytes, 0u);
}

TEST_F(DeviceAllocatorTest, BlocksAreReusedOnlyOnTheirOwnStream) {
  void* a = alloc_.Allocate(4 << 20, /*stream=*/7);
  EXPECT_EQ(alloc_.StreamOf(a), 7u);
  alloc_.Free(a, 0);
  void* b = alloc_.Allocate(4 << 20, /*stream=*/9);  // not a: stream 9 is not ordered after 7
  EXPECT_NE(a, b);
  EXPECT_EQ(state_.mallocs, 2);
  void* c = alloc_.Allocate(4 << 20, /*stream=*/7);
  EXPECT_EQ(a, c);
  alloc_.Free(b, 0);
  alloc_.Free(c, 0);
}

TEST_F(DeviceAllocatorTest, UseOnAnotherStreamHoldsTheBlockUntilItsEventCompletes) {
  void* a = alloc_.Allocate(4 << 20, /*stream=*/1);
  alloc_.RecordStream(a, /*stream=*/2);
  alloc_.RecordStream(a, /*stream=*/2);  // once is enough
  alloc_.RecordStream(a, /*stream=*/1);  // its own stream: nothing to wait for
  alloc_.Free(a, 0);
  EXPECT_EQ(state_.events.size(), 1u);  // one event, on stream 2
  EXPECT_EQ(state_.events.begin()->second, 2u);
  EXPECT_EQ(alloc_.stats().blocks_waiting, 1u);
  void* b = alloc_.Allocate(4 << 20, /*stream=*/1);  // stream 2 may still be reading a
  EXPECT_NE(a, b);
  CompleteStream(2);
  void* c = alloc_.Allocate(4 << 20, /*stream=*/1);  // now a is free again
  EXPECT_EQ(a, c);
  EXPECT_EQ(alloc_.stats().blocks_waiting, 0u);
  EXPECT_EQ(state_.destroyed.size(), 1u);
  alloc_.Free(b, 0);
  alloc_.Free(c, 0);
}

TEST_F(DeviceAllocatorTest, CurrentStreamIsUsedWhenNoneIsGiven) {
  state_.current = 42;
  void* a = alloc_.Allocate(256);
  EXPECT_EQ(alloc_.StreamOf(a), 42u);
  alloc_.Free(a, 0);
}

TEST_F(DeviceAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetriesThenNamesTheDevice) {
  state_.budget = size_t{10} << 20;
  void* a = alloc_.Allocate(6 << 20);
  alloc_.Free(a, 0);                                 // cached: 6 MiB held
  void* b = alloc_.Allocate(8 << 20, /*stream=*/5);  // fits only once the cached 6 MiB are back
  EXPECT_NE(b, nullptr);
  const DeviceMemoryStats st = alloc_.stats();
  EXPECT_EQ(st.out_of_memory_retries, 1u);
  EXPECT_EQ(state_.frees, 1);
  try {
    alloc_.Allocate(4 << 20);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on cuda:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("8.0 MiB allocated"), std::string::npos) << e.what();
  }
  alloc_.Free(b, 0);
}

TEST_F(DeviceAllocatorTest, FreeingAnUnknownPointerIsAnError) {
  int x = 0;
  EXPECT_THROW(alloc_.Free(&x, 4), Error);
  EXPECT_THROW(alloc_.RecordStream(&x, 1), Error);
}

TEST(DeviceTest, NamesParseAndPrint) {
  EXPECT_EQ(kCPU.ToString(), "cpu");
  EXPECT_EQ(Cuda(1).ToString(), "cuda:1");
  EXPECT_EQ(*ParseDevice("cpu"), kCPU);
  EXPECT_EQ(*ParseDevice("cuda"), Cuda(0));
  EXPECT_EQ(*ParseDevice("cuda:7"), Cuda(7));
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:99999", "CPU"}) {
    const absl::StatusOr<Device> d = ParseDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("is not a device"), absl::string_view::npos);
  }
}

// Where there is no GPU (CI, this build without CUDA, or a machine without one), a CUDA
// tensor is an error naming the device and why; on a GPU machine, a device past the last.
TEST(DeviceTest, CudaTensorWithoutThatGpuNamesTheDeviceAndTheReason) {
  const Device missing = cuda::Available() ? Cuda(static_cast<int16_t>(cuda::DeviceCount())) : Cuda(0);
  try {
    Tensor::Zeros({2, 3}, DType::kFloat32, missing);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(missing.ToString()), std::string::npos) << what;
    if (cuda::Available()) {
      EXPECT_NE(what.find("visible"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("no GPU is present"), std::string::npos) << what;
      EXPECT_FALSE(cuda::UnavailableReason().empty());
    }
  }
  EXPECT_THROW(kernels::ToDevice(Tensor::Ones({2}), missing), Error);
  EXPECT_THROW(cuda::NewStream(missing), Error);
}

}  // namespace
}  // namespace gw
