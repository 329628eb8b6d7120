#include "gradwire/parallel/data_parallel.h"

#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"

namespace gw::parallel {
namespace {

absl::Status CheckSameStructure(const nn::Module& module, const nn::Module& replica) {
  const nn::NamedTensors want = module.StateDict(), got = replica.StateDict();
  for (size_t i = 0; i < std::max(want.size(), got.size()); ++i) {
    if (i >= got.size() || i >= want.size() || want[i].first != got[i].first ||
        want[i].second.sizes() != got[i].second.sizes() || want[i].second.dtype() != got[i].second.dtype()) {
      auto describe = [](const nn::NamedTensors& state, size_t k) {
        if (k >= state.size()) return std::string("nothing");
        return absl::StrCat(state[k].first, " [", absl::StrJoin(state[k].second.sizes(), ", "), "] ",
                            DTypeName(state[k].second.dtype()));
      };
      return absl::InvalidArgumentError(
          absl::StrCat("DataParallel: make_replica built a module of another "
                       "structure: entry ",
                       i, " of its state is ", describe(got, i), ", the module's is ", describe(want, i)));
    }
  }
  return absl::OkStatus();
}

// Adds a replica's gradient of `original` into original's gradient (in the pass's sink when
// it has one), then zeroes the replica's, which the next pass accumulates into afresh.
void ForwardGradient(const Tensor& original, Tensor& replica_grad) {
  Tensor g = replica_grad.device() == original.device() ? kernels::Clone(replica_grad)
                                                        : kernels::ToDevice(replica_grad, original.device());
  if (!autograd::AccumulateInPassSink(original, g)) {
    Tensor current = original.grad();
    original.set_grad(Tensor());  // so that the slot's buffer can be adopted
    autograd::AccumulateGrad::Accumulate(&current, std::move(g));
    original.set_grad(current);
  }
  kernels::Fill(replica_grad, 0.0);
}

}  // namespace

absl::StatusOr<std::shared_ptr<DataParallel>> DataParallel::Create(std::shared_ptr<nn::Module> module,
                                                                   ReplicaFactory make_replica, Options options) {
  if (module == nullptr) return absl::InvalidArgumentError("DataParallel: no module");
  std::vector<Device> devices = std::move(options.devices);
  if (devices.empty()) {
    const int gpus = cuda::Available() ? cuda::DeviceCount() : 0;
    for (int i = 0; i < gpus; ++i) devices.push_back(Cuda(static_cast<int16_t>(i)));
    if (devices.empty()) devices.push_back(module->device());
  }
  for (const Device d : devices) {
    if (!d.is_cuda()) continue;
    try {
      cuda::CheckDevice("DataParallel", d);
    } catch (const Error& e) {
      return absl::InvalidArgumentError(e.what());
    }
  }
  if (module->device() != devices.front()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DataParallel: the module is on ", module->device().ToString(), " but devices[0] is ",
        devices.front().ToString(), ": move it there first (module->To(", devices.front().ToString(), "))"));
  }
  if (devices.size() > 1 && !make_replica) {
    return absl::InvalidArgumentError(absl::StrCat("DataParallel over ", devices.size(),
                                                   " devices needs make_replica, a function that builds a module "
                                                   "of the same structure for each further device"));
  }
  std::shared_ptr<DataParallel> dp(new DataParallel());
  dp->devices_ = devices;
  dp->output_device_ = options.output_device.value_or(devices.front());
  dp->replicas_.push_back(module);
  dp->RegisterModule("module", module);
  const nn::NamedTensors params = module->NamedParameters();
  for (size_t i = 1; i < devices.size(); ++i) {
    std::shared_ptr<nn::Module> replica = make_replica();
    if (replica == nullptr) return absl::InvalidArgumentError("DataParallel: make_replica returned no module");
    if (absl::Status s = CheckSameStructure(*module, *replica); !s.ok()) return s;
    try {
      replica->To(devices[i]);
    } catch (const Error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("DataParallel: cannot place a replica on ", devices[i].ToString(), ": ", e.what()));
    }
    const nn::NamedTensors replica_params = replica->NamedParameters();
    for (size_t p = 0; p < params.size(); ++p) {
      const Tensor& original = params[p].second;
      Tensor rp = replica_params[p].second;
      if (!original.requires_grad()) {
        rp.set_requires_grad(false);
        continue;
      }
      dp->hooks_.push_back(autograd::AddPostAccumulateHook(
          rp, [original](const Tensor&, Tensor& grad) { ForwardGradient(original, grad); }));
    }
    dp->replicas_.push_back(std::move(replica));
  }
  return dp;
}

void DataParallel::Refresh(size_t i) {
  autograd::NoGradGuard no_grad;
  const nn::NamedTensors from = replicas_.front()->StateDict(), to = replicas_[i]->StateDict();
  for (size_t k = 0; k < from.size(); ++k) kernels::CopyInPlace(to[k].second, from[k].second);
  replicas_[i]->Train(is_training());
}

Tensor DataParallel::Forward(const Tensor& input) {
  if (replicas_.size() == 1) return gw::To(replicas_.front()->Forward(gw::To(input, devices_.front())), output_device_);
  GW_CHECK(input.dim() >= 1 && input.size(0) >= 1, "DataParallel", "the input needs a batch dimension (dim 0)");
  const std::vector<Tensor> chunks = Chunk(input, static_cast<int64_t>(replicas_.size()), 0);
  const size_t n = chunks.size();
  std::vector<Tensor> inputs(n), outputs(n);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) Refresh(i);
    inputs[i] = gw::To(chunks[i], devices_[i]);
  }
  std::vector<std::exception_ptr> errors(n);
  const bool grad_enabled = autograd::GradMode::IsEnabled();
  auto run = [&](size_t i) {
    autograd::GradMode::SetEnabled(grad_enabled);
    try {
      outputs[i] = replicas_[i]->Forward(inputs[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) threads.emplace_back(run, i);
  run(0);
  for (std::thread& t : threads) t.join();
  autograd::GradMode::SetEnabled(grad_enabled);
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const std::exception& e) {
      throw Error(absl::StrCat("DataParallel: the replica on ", devices_[i].ToString(), " (chunk ", i, " of ", n,
                               ") failed: ", e.what()));
    }
  }
  for (Tensor& out : outputs) out = gw::To(out, output_device_);
  return Cat(outputs, 0);
}

std::string DataParallel::ExtraRepr() const {
  return absl::StrCat("devices=[",
                      absl::StrJoin(devices_, ", ", [](std::string* out, Device d) { out->append(d.ToString()); }),
                      "], output_device=", output_device_.ToString());
}

}  // namespace gw::parallel
