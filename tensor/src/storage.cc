#include "gradwire/tensor/storage.h"

#include "gradwire/tensor/allocator.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/error.h"

namespace gw {

std::shared_ptr<Storage> Storage::Allocate(size_t nbytes, Device device) {
  if (device.is_cuda()) {
    cuda::CheckDevice("Storage::Allocate", device);
    return Allocate(nbytes, cuda::Allocator(device));
  }
  return Allocate(nbytes, CachingCpuAllocator::Default());
}

std::shared_ptr<Storage> Storage::Allocate(size_t nbytes, Allocator& allocator) {
  void* p = allocator.Allocate(nbytes);
  return std::shared_ptr<Storage>(new Storage(
      p, nbytes, allocator.device(), [&allocator, nbytes](void* q) { allocator.Free(q, nbytes); }));
}

std::shared_ptr<Storage> Storage::Wrap(void* data, size_t nbytes, Device device,
                                       Deleter deleter) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, std::move(deleter)));
}

Storage::~Storage() {
  if (deleter_ && data_ != nullptr) deleter_(data_);
}

}  // namespace gw
