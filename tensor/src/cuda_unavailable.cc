// gw::cuda in a build without the CUDA toolkit: no device is available, and everything that
// needs one says so. No CUDA tensor can exist here (Storage::Allocate refuses), so the
// internal kernels below are unreachable from gradwire's own kernels.
#include "cuda/cuda_kernels.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/error.h"

namespace gw::cuda {
namespace {

constexpr char kReason[] =
    "no GPU is present: this build of gradwire has no CUDA support (the CUDA toolkit was not found "
    "when it was built, or GRADWIRE_CUDA=OFF)";

[[noreturn]] void Unavailable(std::string_view op, Device device) {
  internal::Fail(op, device.ToString(), ": ", kReason);
}

}  // namespace

bool Compiled() { return false; }
bool Available() { return false; }
int DeviceCount() { return 0; }
std::string UnavailableReason() { return kReason; }
void CheckDevice(std::string_view op, Device device) { Unavailable(op, device); }
std::string Describe(Device device) { Unavailable("cuda::Describe", device); }
Stream CurrentStream(Device device) { Unavailable("cuda::CurrentStream", device); }
void SetCurrentStream(Stream stream) { Unavailable("cuda::SetCurrentStream", stream.device); }
Stream NewStream(Device device) { Unavailable("cuda::NewStream", device); }
void Synchronize(Stream stream) { Unavailable("cuda::Synchronize", stream.device); }
void SynchronizeDevice(Device device) { Unavailable("cuda::SynchronizeDevice", device); }
CachingDeviceAllocator& Allocator(Device device) { Unavailable("cuda::Allocator", device); }
void RecordStream(const Tensor&, Stream stream) { Unavailable("cuda::RecordStream", stream.device); }

}  // namespace gw::cuda

namespace gw::internal::cuda {

void Binary(BinaryOp, const Tensor& out, const Tensor&, const Tensor&, double) {
  gw::cuda::CheckDevice("cuda::Binary", out.device());
}
void Unary(UnaryOp, const Tensor& out, const Tensor&, double) { gw::cuda::CheckDevice("cuda::Unary", out.device()); }
void SumKeepDims(const Tensor& out, const Tensor&) { gw::cuda::CheckDevice("cuda::Sum", out.device()); }
void Gemm(bool, bool, double, const Tensor&, const Tensor&, double, const Tensor& out) {
  gw::cuda::CheckDevice("cuda::Gemm", out.device());
}
void SoftmaxRows(const Tensor& out, const Tensor&, int64_t, int64_t, bool) {
  gw::cuda::CheckDevice("cuda::Softmax", out.device());
}
void CopyBytes(const Tensor& dst, const Tensor&) { gw::cuda::CheckDevice("cuda::CopyBytes", dst.device()); }

}  // namespace gw::internal::cuda
