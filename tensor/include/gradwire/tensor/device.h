// Device: where a tensor's storage lives.
//
// Contract
//   - Today every tensor is on the CPU. The device is carried by every Storage and
//     checked by every kernel (kernels::CheckCpu), so adding kCUDA means adding an
//     Allocator for it (see storage.h) and CUDA kernels behind the same ops; nothing
//     above the tensor layer needs to change.
#ifndef GRADWIRE_TENSOR_DEVICE_H_
#define GRADWIRE_TENSOR_DEVICE_H_

#include <cstdint>
#include <string>

namespace gw {

enum class DeviceType : uint8_t { kCPU = 0 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int16_t index = 0;

  bool operator==(const Device&) const = default;
  std::string ToString() const { return "cpu"; }
};

inline constexpr Device kCPU{};

}  // namespace gw

#endif  // GRADWIRE_TENSOR_DEVICE_H_
