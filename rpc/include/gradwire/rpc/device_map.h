// Device maps: on which device a tensor sent to a peer arrives (PyTorch's
// TensorPipeRpcBackendOptions.set_device_map), and how its bytes travel there.
//
// Contract
//   - A DeviceMap belongs to one ordered pair of workers (from -> to) and lists
//     (local device -> peer device) entries. A tensor on a mapped local device arrives on the
//     peer's mapped device; a tensor on any other device (the CPU, an unmapped GPU) arrives
//     on the peer's CPU. A GPU tensor is never sent to a device nobody asked for.
//   - What comes back (a call's reply, the gradients of distributed autograd) takes the
//     inverse of the caller's map: a tensor on peer device d arrives on the caller's device
//     that maps to d, or on the caller's CPU when none does. So a round trip lands where it
//     started.
//   - Make validates the map itself: one-to-one (a local device listed once, no two local
//     devices onto one peer device), devices that can exist (the CPU, cuda:N). CheckDevices
//     validates it against the GPUs each side has (local devices on `from`, peer devices on
//     `to`). Every error is INVALID_ARGUMENT naming the pair and the device, e.g.
//     "device map worker0 -> worker1: cuda:0 and cuda:1 both map to cuda:0 (a map is one-to-one)".
//   - DeviceMaps is a worker's maps toward each peer; Parse reads the launcher's text form
//     "PEER=LOCAL->REMOTE,LOCAL->REMOTE;PEER=..." (e.g. "worker1=cuda:0->cuda:1,cpu->cpu").
//   - ChoosePath says how a tensor's bytes cross for one (sender device, receiver device)
//     pair: kHost when neither is a GPU; kCudaIpc between GPUs of one host when CUDA IPC
//     works there (the receiver maps the sender's memory and copies device to device; no
//     bytes on the wire); kStaged otherwise (device -> pinned host memory -> transport ->
//     device, whichever ends are GPUs).
//   - Plain values, copyable, thread-compatible.
#ifndef GRADWIRE_RPC_DEVICE_MAP_H_
#define GRADWIRE_RPC_DEVICE_MAP_H_

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradwire/tensor/device.h"

namespace gw::rpc {

class DeviceMap {
 public:
  using Entries = std::vector<std::pair<Device, Device>>;

  DeviceMap() = default;  // empty: every tensor arrives on the CPU
  static absl::StatusOr<DeviceMap> Make(std::string_view from, std::string_view to, Entries entries);

  // Where a tensor on `local` (on `from`) arrives on `to`.
  Device Forward(Device local) const;
  // Where a tensor on `remote` (on `to`) arrives back on `from`.
  Device Inverse(Device remote) const;

  // `from` has local_gpus GPUs, `to` has remote_gpus.
  absl::Status CheckDevices(int local_gpus, int remote_gpus) const;

  bool empty() const { return entries_.empty(); }
  const Entries& entries() const { return entries_; }
  const std::string& from() const { return from_; }
  const std::string& to() const { return to_; }
  // "cuda:0->cuda:1,cuda:1->cuda:0" (Parse's form of one peer's entries).
  std::string ToString() const;

 private:
  std::string from_, to_;
  Entries entries_;
};

class DeviceMaps {
 public:
  // REQUIRES: map.from() is this worker. Replaces an earlier map toward map.to().
  void Set(DeviceMap map);
  // The map toward `peer` (an empty one when none was set).
  const DeviceMap& Toward(std::string_view peer) const;
  const std::map<std::string, DeviceMap, std::less<>>& all() const { return maps_; }
  bool empty() const { return maps_.empty(); }
  std::string ToString() const;

  // `self` is this worker's name; INVALID_ARGUMENT naming the text that does not parse.
  static absl::StatusOr<DeviceMaps> Parse(std::string_view self, std::string_view text);

 private:
  std::map<std::string, DeviceMap, std::less<>> maps_;
};

enum class TensorPath { kHost, kCudaIpc, kStaged };
std::string_view TensorPathName(TensorPath path);
TensorPath ChoosePath(Device sender, Device receiver, bool same_host, bool ipc_available);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_DEVICE_MAP_H_
