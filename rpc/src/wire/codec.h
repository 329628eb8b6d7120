// Internal: the Envelope of one call or reply, and its conversion to and from a frame
// Message (protobuf header + out-of-band tensors).
#ifndef GRADWIRE_RPC_SRC_WIRE_CODEC_H_
#define GRADWIRE_RPC_SRC_WIRE_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gradwire/rpc/device_map.h"
#include "gradwire/rpc/frame.h"
#include "gradwire/rpc/value.h"

namespace gw::rpc::internal {

// kPing / kPong are heartbeats (liveness.h): no id, function or payload.
enum class Kind { kRequest = 1, kResponse = 2, kHello = 3, kPing = 4, kPong = 5 };

struct Envelope {
  uint64_t id = 0;
  Kind kind = Kind::kRequest;
  std::string function;
  Value payload;
  absl::Status status;     // of a response
  int64_t timeout_ms = 0;  // caller's budget, informational
  Value meta;              // filled and read by CallHooks (call_hooks.h)
  bool has_rrefs = false;  // decoding met an RRef (the agent must adopt it)
};

// The reply to call `id`: its value, or its error.
Envelope ReplyEnvelope(uint64_t id, const absl::StatusOr<Value>& result);

// Tensors on a GPU cross through host memory (staged: copied to the CPU here, once the
// work queued on them has run, and to their device on arrival). `map` is this worker's
// map toward the receiver: a request's tensors arrive on map->Forward(their device) (on
// the CPU without a map); a response says where its tensors were, and the caller places
// them (DecodeEnvelope).
absl::StatusOr<Message> EncodeEnvelope(const Envelope& envelope, const DeviceMap* map = nullptr);

// Where the tensors of a decoded frame go: `map` is the receiver's map toward the sender
// (a response's tensors arrive on map->Inverse(where they were); without a map on the
// CPU); `gpus` is how many GPUs the receiver has.
struct Placement {
  const DeviceMap* map = nullptr;
  int gpus = 0;
};
// Validates tensor indices, nesting depth, enum values and devices (a frame that puts a
// tensor on a GPU this worker does not have is DATA_LOSS); never trusts the peer.
absl::StatusOr<Envelope> DecodeEnvelope(Message message, Placement placement = {});

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_WIRE_CODEC_H_
