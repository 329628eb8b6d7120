// Internal: the Envelope of one call or reply, and its conversion to and from a frame
// Message (protobuf header + out-of-band tensors).
#ifndef GRADWIRE_RPC_SRC_WIRE_CODEC_H_
#define GRADWIRE_RPC_SRC_WIRE_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
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

absl::StatusOr<Message> EncodeEnvelope(const Envelope& envelope);
// Validates tensor indices, nesting depth and enum values; never trusts the peer.
absl::StatusOr<Envelope> DecodeEnvelope(Message message);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_WIRE_CODEC_H_
