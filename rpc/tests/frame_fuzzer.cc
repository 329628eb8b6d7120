// libFuzzer target: arbitrary bytes into the frame decoder and, for every frame it
// accepts, the envelope decoder and the typed records of the agent's own protocols (the
// hello, the RRef messages). None may crash, hang, or allocate beyond the limits.
// Build and run with scripts/fuzz (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>

#include "codec.h"
#include "gradwire/rpc/frame.h"
#include "peers.h"
#include "rref_messages.h"

namespace {

template <typename... M>
void DecodeAs(const gw::rpc::Value& payload) {
  (void(gw::rpc::ValueTraits<M>::From(payload)), ...);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gw::rpc::FrameLimits limits;
  limits.max_header_bytes = 1 << 20;
  limits.max_payload_bytes = 16 << 20;
  gw::rpc::FrameDecoder decoder(limits);
  absl::Span<const char> rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty()) {
    absl::StatusOr<size_t> used = decoder.Consume(rest);
    if (!used.ok()) break;
    rest.remove_prefix(*used);
    if (!decoder.HasMessage()) continue;
    absl::StatusOr<gw::rpc::internal::Envelope> env = gw::rpc::internal::DecodeEnvelope(decoder.TakeMessage());
    if (!env.ok()) continue;
    using namespace gw::rpc::internal;  // NOLINT: the protocols' records
    DecodeAs<HelloMessage, RRefRemote, RRefFetch, RRefCall, RRefFork, RRefAccept, RRefDelete>(env->payload);
  }
  return 0;
}
