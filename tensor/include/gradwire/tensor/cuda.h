// gw::cuda: the GPUs this process sees, their streams and their memory.
//
// Contract
//   - The same API in a CPU-only build and a CUDA build; no CUDA type appears here.
//     Available() is false in a CPU-only build, when no device is visible or the driver is
//     missing; UnavailableReason() then says which. Functions that need a device throw
//     gw::Error naming the device and that reason ("cuda:0: no GPU is present: ...").
//   - Streams: every thread has a current stream per device, at first the device's default
//     stream (id 0). Kernels and copies of gradwire are queued on the current stream of
//     their tensors' device; StreamGuard makes a stream current for a scope. Work on one
//     stream runs in order; NewStream makes a stream that runs concurrently with the others.
//   - Memory: Allocator(device) is that device's caching allocator (device_allocator.h),
//     made on first use and kept for the process. Tensors on a GPU take their memory from
//     it on the current stream; a tensor used on another stream too must be recorded there
//     (RecordStream) so its memory is not reused too early.
//   - Copies between the CPU and a GPU go through a per-device cache of pinned host
//     buffers; a copy to the CPU returns when the data is there.
#ifndef GRADWIRE_TENSOR_CUDA_H_
#define GRADWIRE_TENSOR_CUDA_H_

#include <string>

#include "gradwire/tensor/device.h"
#include "gradwire/tensor/device_allocator.h"

namespace gw {
class Tensor;
}

namespace gw::cuda {

// Compiled with CUDA support (the toolkit was found at build time).
bool Compiled();
bool Available();
int DeviceCount();
// Empty when Available().
std::string UnavailableReason();
// Throws gw::Error ("<op>: cuda:1: no GPU is present: ...", or "...: only 1 GPU is visible")
// unless `device` is a GPU this process can use.
void CheckDevice(std::string_view op, Device device);
// The device's name and memory, e.g. "NVIDIA H200, 139.8 GiB, compute capability 9.0".
std::string Describe(Device device);

struct Stream {
  Device device = Cuda(0);
  StreamId id = 0;
  bool operator==(const Stream&) const = default;
};

Stream CurrentStream(Device device);
void SetCurrentStream(Stream stream);
// A new non-blocking stream of `device`, kept for the process.
Stream NewStream(Device device);
// Waits until the work queued on `stream` has run; throws gw::Error naming a failed kernel.
void Synchronize(Stream stream);
void SynchronizeDevice(Device device);

class StreamGuard {
 public:
  explicit StreamGuard(Stream stream) : previous_(CurrentStream(stream.device)) { SetCurrentStream(stream); }
  ~StreamGuard() { SetCurrentStream(previous_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

CachingDeviceAllocator& Allocator(Device device);
// The tensor's memory is used on `stream` too (see the contract).
void RecordStream(const Tensor& t, Stream stream);

}  // namespace gw::cuda

#endif  // GRADWIRE_TENSOR_CUDA_H_
