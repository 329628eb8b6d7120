// Storage: a reference-counted, device-tagged byte buffer shared by tensors and views.
//
// Contract
//   - Owned through std::shared_ptr; every view of a tensor shares one Storage.
//   - Allocate() returns uninitialised, 64-byte aligned memory from an Allocator
//     (allocator.h); large CPU blocks are recycled by a bounded cache.
//   - Wrap() adopts memory owned elsewhere (a receive buffer, a mapped segment) and calls
//     the deleter exactly once when the last reference goes.
//   - version() counts in-place writes: every in-place kernel (and optimizer update)
//     bumps it when it starts writing and again when it is done. Autograd records it
//     when it saves a tensor and refuses to run backward if it changed; the shm
//     transport checks it to detect a tensor overwritten while a peer was copying it
//     (the bump before the first write is what makes that check sound). Each write
//     adds exactly 2, so an odd version means a write is in progress.
//   - Thread safety: the buffer is not synchronised; the version counter is atomic.
#ifndef GRADWIRE_TENSOR_STORAGE_H_
#define GRADWIRE_TENSOR_STORAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "gradwire/tensor/device.h"

namespace gw {

class Allocator;

class Storage {
 public:
  using Deleter = std::function<void(void*)>;

  // The CPU's memory comes from CachingCpuAllocator::Default(), a GPU's from its caching
  // allocator (gw::cuda::Allocator). Throws gw::Error naming the device when it is a GPU
  // this process has not (or this build has no CUDA support).
  static std::shared_ptr<Storage> Allocate(size_t nbytes, Device device = kCPU);
  // REQUIRES: `allocator` outlives the storage.
  static std::shared_ptr<Storage> Allocate(size_t nbytes, Allocator& allocator);
  static std::shared_ptr<Storage> Wrap(void* data, size_t nbytes, Device device, Deleter deleter);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  // Sequentially consistent: the bump is visible before the data writes that follow it.
  void BumpVersion() { version_.fetch_add(1, std::memory_order_seq_cst); }

 private:
  Storage(void* data, size_t nbytes, Device device, Deleter deleter)
      : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

  void* data_;
  size_t nbytes_;
  Device device_;
  Deleter deleter_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace gw

#endif  // GRADWIRE_TENSOR_STORAGE_H_
