#include "gradwire/tensor/device_allocator.h"

#include <algorithm>
#include <tuple>

#include "gradwire/tensor/error.h"

namespace gw {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string Mib(size_t bytes) {
  return std::to_string(bytes >> 20) + "." + std::to_string(((bytes & ((1 << 20) - 1)) * 10) >> 20) + " MiB";
}

}  // namespace

bool CachingDeviceAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

CachingDeviceAllocator::CachingDeviceAllocator(std::unique_ptr<DeviceMemoryBackend> backend)
    : backend_(std::move(backend)) {}

CachingDeviceAllocator::~CachingDeviceAllocator() {
  absl::MutexLock lock(&mu_);
  PollEvents();
  ReleaseFreeSegments();
}

Device CachingDeviceAllocator::device() const { return backend_->device(); }

void* CachingDeviceAllocator::Allocate(size_t nbytes) { return Allocate(nbytes, backend_->CurrentStream()); }

void* CachingDeviceAllocator::Allocate(size_t nbytes, StreamId stream) {
  if (nbytes == 0) return nullptr;
  absl::MutexLock lock(&mu_);
  PollEvents();
  const size_t size = RoundUp(nbytes, kRound);
  const bool small = size <= kSmallRequest;
  Pool& pool = small ? small_ : large_;
  ++stats_.allocations;

  Block key;
  key.stream = stream;
  key.size = size;
  Block* block = nullptr;
  auto it = pool.lower_bound(&key);
  if (it != pool.end() && (*it)->stream == stream) {
    block = *it;
    pool.erase(it);
    ++stats_.cache_hits;
  } else {
    block = NewSegment(small ? kSmallSegment : RoundUp(size, kLargeRound), stream, small);
  }
  Split(block, size, pool);
  block->allocated = true;
  live_[block->ptr] = block;
  stats_.allocated_bytes += block->size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return block->ptr;
}

CachingDeviceAllocator::Block* CachingDeviceAllocator::NewSegment(size_t size, StreamId stream, bool small) {
  void* p = backend_->Malloc(size);
  if (p == nullptr) {
    ++stats_.out_of_memory_retries;
    ReleaseFreeSegments();
    p = backend_->Malloc(size);
  }
  if (p == nullptr) {
    internal::Fail("Allocate", "out of memory on ", backend_->device().ToString(), ": could not get ", Mib(size),
                   " more (", Mib(stats_.allocated_bytes), " allocated to tensors, ", Mib(stats_.reserved_bytes),
                   " reserved by gradwire's cache); free tensors or use "
                   "smaller batches");
  }
  ++stats_.backend_mallocs;
  ++stats_.segments;
  stats_.reserved_bytes += size;
  Block* block = new Block;
  block->ptr = static_cast<char*>(p);
  block->size = size;
  block->stream = stream;
  block->small = small;
  return block;
}

void CachingDeviceAllocator::Split(Block* block, size_t size, Pool& pool) {
  const size_t rest = block->size - size;
  const bool split = block->small ? rest >= kRound : rest > kSmallRequest;
  if (!split) return;
  Block* tail = new Block;
  tail->ptr = block->ptr + size;
  tail->size = rest;
  tail->stream = block->stream;
  tail->small = block->small;
  tail->prev = block;
  tail->next = block->next;
  if (tail->next != nullptr) tail->next->prev = tail;
  block->next = tail;
  block->size = size;
  pool.insert(tail);
}

void CachingDeviceAllocator::Free(void* p, size_t /*nbytes*/) {
  if (p == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = live_.find(p);
  GW_CHECK(it != live_.end(), "Free", "pointer ", p, " was not allocated by the ", backend_->device().ToString(),
           " caching allocator (or was freed twice)");
  Block* block = it->second;
  live_.erase(it);
  block->allocated = false;
  stats_.allocated_bytes -= block->size;
  if (block->used_on.empty()) {
    Release(block);
    return;
  }
  for (StreamId s : block->used_on) {
    events_.emplace_back(backend_->RecordEvent(s), block);
    ++block->events_pending;
  }
  block->used_on.clear();
  ++stats_.blocks_waiting;
}

void CachingDeviceAllocator::Release(Block* block) {
  Pool& pool = PoolOf(block);
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour == nullptr || neighbour->allocated || neighbour->events_pending > 0) continue;
    pool.erase(neighbour);
    if (neighbour == block->prev) {
      neighbour->size += block->size;
      neighbour->next = block->next;
      if (block->next != nullptr) block->next->prev = neighbour;
      delete block;
      block = neighbour;
    } else {
      block->size += neighbour->size;
      block->next = neighbour->next;
      if (neighbour->next != nullptr) neighbour->next->prev = block;
      delete neighbour;
    }
  }
  pool.insert(block);
}

void CachingDeviceAllocator::PollEvents() {
  for (auto it = events_.begin(); it != events_.end();) {
    if (!backend_->EventDone(it->first)) {
      ++it;
      continue;
    }
    backend_->DestroyEvent(it->first);
    Block* block = it->second;
    it = events_.erase(it);
    if (--block->events_pending == 0) {
      --stats_.blocks_waiting;
      Release(block);
    }
  }
}

void CachingDeviceAllocator::ReleaseFreeSegments() {
  for (Pool* pool : {&small_, &large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {
        ++it;
        continue;
      }
      backend_->Free(block->ptr);
      ++stats_.backend_frees;
      --stats_.segments;
      stats_.reserved_bytes -= block->size;
      delete block;
      it = pool->erase(it);
    }
  }
}

void CachingDeviceAllocator::RecordStream(void* p, StreamId stream) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(p);
  GW_CHECK(it != live_.end(), "RecordStream", "pointer ", p, " is not a live block of ", backend_->device().ToString());
  Block* block = it->second;
  if (stream == block->stream) return;
  if (std::find(block->used_on.begin(), block->used_on.end(), stream) == block->used_on.end()) {
    block->used_on.push_back(stream);
  }
}

StreamId CachingDeviceAllocator::StreamOf(void* p) const {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(p);
  GW_CHECK(it != live_.end(), "StreamOf", "pointer ", p, " is not a live block of ", backend_->device().ToString());
  return it->second->stream;
}

void CachingDeviceAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  PollEvents();
  ReleaseFreeSegments();
}

DeviceMemoryStats CachingDeviceAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace gw
