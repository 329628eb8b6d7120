// gw::cuda on the CUDA runtime: devices, per-thread current streams, the caching allocator's
// backend (cudaMalloc, CUDA events).
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda/cuda_util.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/tensor.h"

namespace gw::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct Devices {
  int count = 0;
  std::string reason;  // why there is none
};

const Devices& Probe() {
  static const Devices devices = [] {
    Devices d;
    const cudaError_t e = cudaGetDeviceCount(&d.count);
    if (e != cudaSuccess) {
      d.count = 0;
      d.reason = absl::StrCat("no GPU is present (", cudaGetErrorString(e), ")");
      cudaGetLastError();
    } else if (d.count == 0) {
      d.reason = "no GPU is present (the CUDA runtime sees no device)";
    }
    d.count = std::min(d.count, kMaxDevices);
    return d;
  }();
  return devices;
}

thread_local std::array<StreamId, kMaxDevices> current_streams{};

class CudaMemoryBackend final : public DeviceMemoryBackend {
 public:
  explicit CudaMemoryBackend(Device device) : device_(device) {}
  Device device() const override { return device_; }

  void* Malloc(size_t nbytes) override {
    internal::DeviceGuard guard(device_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, nbytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clears the sticky-free error so the retry can succeed
      return nullptr;
    }
    internal::CudaCheck(e, "cudaMalloc", device_);
    return p;
  }
  void Free(void* p) override {
    internal::DeviceGuard guard(device_);
    internal::CudaCheck(cudaFree(p), "cudaFree", device_);
  }
  StreamId CurrentStream() override { return current_streams[device_.index]; }
  EventId RecordEvent(StreamId stream) override {
    internal::DeviceGuard guard(device_);
    cudaEvent_t event = nullptr;
    internal::CudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate", device_);
    internal::CudaCheck(cudaEventRecord(event, internal::ToCudaStream(stream)), "cudaEventRecord", device_);
    return reinterpret_cast<EventId>(event);
  }
  bool EventDone(EventId event) override {
    const cudaError_t e = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    internal::CudaCheck(e, "cudaEventQuery", device_);
    return true;
  }
  void DestroyEvent(EventId event) override { cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event)); }

 private:
  const Device device_;
};

}  // namespace

bool Compiled() { return true; }
bool Available() { return Probe().count > 0; }
int DeviceCount() { return Probe().count; }
std::string UnavailableReason() { return Probe().reason; }

void CheckDevice(std::string_view op, Device device) {
  GW_CHECK(device.is_cuda(), op, device.ToString(), " is not a GPU");
  const Devices& d = Probe();
  GW_CHECK(d.count > 0, op, device.ToString(), ": ", d.reason);
  GW_CHECK(device.index >= 0 && device.index < d.count, op, device.ToString(), ": only ", d.count,
           d.count == 1 ? " GPU is" : " GPUs are", " visible (cuda:0..cuda:", d.count - 1, ")");
}

std::string Describe(Device device) {
  CheckDevice("cuda::Describe", device);
  cudaDeviceProp prop{};
  internal::CudaCheck(cudaGetDeviceProperties(&prop, device.index), "cudaGetDeviceProperties", device);
  return absl::StrFormat("%s, %.1f GiB, compute capability %d.%d", prop.name,
                         static_cast<double>(prop.totalGlobalMem) / (1 << 30), prop.major, prop.minor);
}

Stream CurrentStream(Device device) {
  CheckDevice("cuda::CurrentStream", device);
  return Stream{device, current_streams[device.index]};
}

void SetCurrentStream(Stream stream) {
  CheckDevice("cuda::SetCurrentStream", stream.device);
  current_streams[stream.device.index] = stream.id;
}

Stream NewStream(Device device) {
  CheckDevice("cuda::NewStream", device);
  internal::DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  internal::CudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", device);
  return Stream{device, reinterpret_cast<StreamId>(s)};
}

void Synchronize(Stream stream) {
  CheckDevice("cuda::Synchronize", stream.device);
  internal::DeviceGuard guard(stream.device);
  internal::CudaCheck(cudaStreamSynchronize(internal::ToCudaStream(stream.id)), "cudaStreamSynchronize", stream.device);
}

void SynchronizeDevice(Device device) {
  CheckDevice("cuda::SynchronizeDevice", device);
  internal::DeviceGuard guard(device);
  internal::CudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device);
}

CachingDeviceAllocator& Allocator(Device device) {
  CheckDevice("cuda::Allocator", device);
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<CachingDeviceAllocator*, kMaxDevices> allocators{};  // kept for the process
  std::call_once(once[device.index], [device] {
    allocators[device.index] = new CachingDeviceAllocator(std::make_unique<CudaMemoryBackend>(device));
  });
  return *allocators[device.index];
}

void RecordStream(const Tensor& t, Stream stream) {
  GW_CHECK(t.device() == stream.device, "cuda::RecordStream", "tensor on ", t.device().ToString(), ", stream of ",
           stream.device.ToString());
  if (t.storage()->data() == nullptr) return;
  Allocator(stream.device).RecordStream(t.storage()->data(), stream.id);
}

}  // namespace gw::cuda
