// DataParallel: one module run on several devices of this process at once (PyTorch's
// torch.nn.DataParallel). Each Forward splits the batch over the devices, runs a replica
// of the module on each, concurrently, and joins the outputs on one device; backward
// sums the replicas' gradients into the module's own.
//
// Contract
//   - Create(module, make_replica, options) wraps `module` (registered as the child
//     "module", so parameter names read "module.0.weight", as PyTorch's). options.devices
//     lists the replicas' devices; module lives on devices[0] (INVALID_ARGUMENT otherwise:
//     move it first). Empty: every GPU this process sees, or, with none, the module's own
//     device alone. A device may repeat: replicas on one device run on threads of their
//     own (CPU replicas use several cores).
//   - With one device Forward is module->Forward, unchanged (moved to output_device when
//     that differs): the same program runs on a laptop.
//   - With more, make_replica builds a module of the same structure for each further
//     device, once, at Create (its values do not matter: a replica takes the module's
//     parameters and buffers, copied, at every Forward, as PyTorch broadcasts them).
//     Parameters that differ in name, shape or dtype are INVALID_ARGUMENT naming the first.
//   - Forward(x): x is split along dim 0 into at most devices.size() chunks (Chunk's
//     sizes: equal, the last smaller; a batch smaller than the device count uses fewer
//     replicas); each chunk goes to its device (gw::To, so gradients flow back to x), the
//     replicas run on threads (with the caller's gradient mode and training mode), and their
//     outputs are concatenated on options.output_device (default devices[0]) in chunk order.
//     An exception in a replica is rethrown as gw::Error naming its device.
//   - Backward: as soon as a replica's parameter gradient is complete (autograd's
//     post-accumulate hooks) it is added to the module's parameter gradient on the
//     module's device (inside a distributed-autograd context, to the context's), and the
//     replica's own is zeroed. So after autograd::Backward the module's .grad() holds the
//     gradient of the whole batch, as if the module had run it alone.
//   - Buffers changed by a forward (BatchNorm's running statistics) keep what replica 0,
//     the module itself, made of its chunk (as PyTorch's).
//   - Not thread-safe: one training loop drives it.
#ifndef GRADWIRE_PARALLEL_DATA_PARALLEL_H_
#define GRADWIRE_PARALLEL_DATA_PARALLEL_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/autograd/grad_hooks.h"
#include "gradwire/nn/module.h"

namespace gw::parallel {

struct DataParallelOptions {
  std::vector<Device> devices = {};                    // empty: every GPU, or the module's device
  std::optional<Device> output_device = std::nullopt;  // default: devices[0]
};

class DataParallel final : public nn::Module {
 public:
  using Options = DataParallelOptions;
  using ReplicaFactory = std::function<std::shared_ptr<nn::Module>()>;

  static absl::StatusOr<std::shared_ptr<DataParallel>> Create(std::shared_ptr<nn::Module> module,
                                                              ReplicaFactory make_replica, Options options = {});

  Tensor Forward(const Tensor& input) override;

  nn::Module& module() const { return *replicas_.front(); }
  const std::vector<Device>& devices() const { return devices_; }
  Device output_device() const { return output_device_; }

 private:
  DataParallel() : nn::Module("DataParallel") {}
  std::string ExtraRepr() const override;
  // Copies the module's parameters and buffers into replica i.
  void Refresh(size_t i);

  std::vector<Device> devices_;
  Device output_device_;
  std::vector<std::shared_ptr<nn::Module>> replicas_;  // [0]: the module
  std::vector<autograd::HookHandle> hooks_;
};

}  // namespace gw::parallel

#endif  // GRADWIRE_PARALLEL_DATA_PARALLEL_H_
