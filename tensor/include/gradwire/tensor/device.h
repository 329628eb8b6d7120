// Device: where a tensor's storage lives.
//
// Contract
//   - A device is the CPU or one GPU: Device{DeviceType::kCUDA, i} is the i-th CUDA device
//     the process sees (as CUDA_VISIBLE_DEVICES leaves them), written "cuda:i".
//   - Every Storage carries its device and every kernel checks it: a kernel without an
//     implementation for a tensor's device throws gw::Error naming the op and the device.
//   - The same API exists in a CPU-only build and a CUDA build; making a CUDA tensor where
//     there is no GPU (or no CUDA support) throws gw::Error naming the device and the reason
//     (gradwire/tensor/cuda.h).
//   - ParseDevice accepts "cpu", "cuda" (= "cuda:0") and "cuda:<index>"; it says nothing
//     about whether that device exists.
#ifndef GRADWIRE_TENSOR_DEVICE_H_
#define GRADWIRE_TENSOR_DEVICE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace gw {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int16_t index = 0;

  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string ToString() const {
    return type == DeviceType::kCPU ? std::string("cpu") : "cuda:" + std::to_string(index);
  }
  template <typename H>
  friend H AbslHashValue(H h, const Device& d) {
    return H::combine(std::move(h), d.type, d.index);
  }
};

inline constexpr Device kCPU{};
inline constexpr Device Cuda(int16_t index = 0) { return Device{DeviceType::kCUDA, index}; }

// "cpu", "cuda", "cuda:1". INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<Device> ParseDevice(std::string_view text);

}  // namespace gw

#endif  // GRADWIRE_TENSOR_DEVICE_H_
