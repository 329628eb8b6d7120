// CachingDeviceAllocator: the caching allocator of one device's memory, and the backend
// interface it allocates through (cudaMalloc and CUDA events on a GPU; host memory and
// hand-driven events in the tests).
//
// Contract
//   - Device memory is slow to get (cudaMalloc synchronises the device) and every training
//     step asks for the same shapes again: freed blocks stay cached and are handed out again.
//   - Requests are rounded up to 512 bytes. Requests of at most 1 MiB come from the small
//     pool, cut from 2 MiB segments; larger ones from the large pool, whose segments are the
//     request rounded up to 2 MiB. A cached block larger than a request is split (the small
//     pool: when at least 512 bytes remain; the large pool: more than 1 MiB); a freed
//     block merges with its free neighbours of the same segment.
//   - Pools are per stream: a block is handed out again only to a request on the stream it
//     was allocated on, where the work queued before its free has run before the work of
//     the new owner (stream order). A block also used on other streams (RecordStream) is
//     held back at its free until an event recorded then on each of those streams has
//     completed; Allocate and EmptyCache poll those events.
//   - When the backend is out of memory, every cached segment that is wholly free goes back
//     and the request is tried once more; then Allocate throws gw::Error naming the device,
//     the size asked for and what is allocated and cached.
//   - EmptyCache returns every wholly free segment to the backend (blocks in use, or waiting
//     for events, stay). The destructor returns every segment whose blocks are all free.
//   - Allocate(nbytes) allocates on the backend's current stream. Free takes back a pointer
//     Allocate returned (the size is ignored: the allocator knows it).
//   - Thread-safe; the backend is called under the allocator's lock.
#ifndef GRADWIRE_TENSOR_DEVICE_ALLOCATOR_H_
#define GRADWIRE_TENSOR_DEVICE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/tensor/allocator.h"
#include "gradwire/tensor/device.h"

namespace gw {

// A stream of one device, as the runtime names it (on CUDA, the cudaStream_t's bits;
// 0 is the default stream).
using StreamId = uint64_t;
// An event recorded on a stream, as the backend names it.
using EventId = uint64_t;

class DeviceMemoryBackend {
 public:
  virtual ~DeviceMemoryBackend() = default;
  virtual Device device() const = 0;
  // nullptr when the device has not that much memory free.
  virtual void* Malloc(size_t nbytes) = 0;
  virtual void Free(void* p) = 0;
  // The stream the calling thread issues its work on.
  virtual StreamId CurrentStream() = 0;
  // An event marking the work queued on `stream` so far.
  virtual EventId RecordEvent(StreamId stream) = 0;
  // True once that work has run (the event is then destroyed by the allocator).
  virtual bool EventDone(EventId event) = 0;
  virtual void DestroyEvent(EventId event) = 0;
};

struct DeviceMemoryStats {
  size_t allocated_bytes = 0;  // in blocks handed out (rounded sizes)
  size_t reserved_bytes = 0;   // in segments taken from the backend
  size_t peak_allocated_bytes = 0;
  uint64_t allocations = 0;  // Allocate calls
  uint64_t cache_hits = 0;   // of those, served from a cached block
  uint64_t segments = 0;     // segments held now
  uint64_t backend_mallocs = 0;
  uint64_t backend_frees = 0;
  uint64_t out_of_memory_retries = 0;  // backend mallocs retried after emptying the cache
  uint64_t blocks_waiting = 0;         // freed blocks held back for events of other streams
};

class CachingDeviceAllocator final : public Allocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallRequest = size_t{1} << 20;
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kLargeRound = size_t{2} << 20;

  explicit CachingDeviceAllocator(std::unique_ptr<DeviceMemoryBackend> backend);
  ~CachingDeviceAllocator() override;
  CachingDeviceAllocator(const CachingDeviceAllocator&) = delete;
  CachingDeviceAllocator& operator=(const CachingDeviceAllocator&) = delete;

  void* Allocate(size_t nbytes) override;
  void* Allocate(size_t nbytes, StreamId stream);
  void Free(void* p, size_t nbytes) override;
  Device device() const override;

  // REQUIRES: p is a block this allocator handed out and has not taken back.
  void RecordStream(void* p, StreamId stream);
  // The stream p was allocated on. REQUIRES: as RecordStream.
  StreamId StreamOf(void* p) const;

  void EmptyCache();
  DeviceMemoryStats stats() const;

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    StreamId stream = 0;
    bool small = false;
    bool allocated = false;
    int events_pending = 0;
    std::vector<StreamId> used_on;  // other streams (RecordStream)
    Block* prev = nullptr;          // neighbours in the segment
    Block* next = nullptr;
  };
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockOrder>;

  Block* NewSegment(size_t size, StreamId stream, bool small) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Split(Block* block, size_t size, Pool& pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // back into its pool
  void PollEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseFreeSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Pool& PoolOf(const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return block->small ? small_ : large_; }

  const std::unique_ptr<DeviceMemoryBackend> backend_;
  mutable absl::Mutex mu_;
  Pool small_ ABSL_GUARDED_BY(mu_);
  Pool large_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, Block*> live_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<EventId, Block*>> events_ ABSL_GUARDED_BY(mu_);
  DeviceMemoryStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw

#endif  // GRADWIRE_TENSOR_DEVICE_ALLOCATOR_H_
