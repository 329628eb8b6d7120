#include "gradwire/tensor/storage.h"

#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"
#include "gradwire/tensor/error.h"

namespace gw {
namespace {

constexpr size_t kAlignment = 64;

void* CpuAllocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    throw Error(absl::StrCat("Storage::Allocate: out of memory allocating ", nbytes, " bytes"));
  }
  return p;
}

}  // namespace

std::shared_ptr<Storage> Storage::Allocate(size_t nbytes, Device device) {
  GW_CHECK(device.type == DeviceType::kCPU, "Storage::Allocate", "no allocator for device ",
           device.ToString());
  void* p = CpuAllocate(nbytes);
  return std::shared_ptr<Storage>(new Storage(p, nbytes, device, [](void* q) { std::free(q); }));
}

std::shared_ptr<Storage> Storage::Wrap(void* data, size_t nbytes, Device device,
                                       Deleter deleter) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, std::move(deleter)));
}

Storage::~Storage() {
  if (deleter_ && data_ != nullptr) deleter_(data_);
}

}  // namespace gw
