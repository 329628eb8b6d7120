// libFuzzer target: arbitrary bytes into the frame decoder and, for every frame it
// accepts, the envelope decoder and the typed records of the agent's own protocols (the
// hello, the RRef messages); the same bytes as the peer's side of the job secret's
// handshake (handshake.h: a client's hello and proof to the server, a server's challenge
// and verdict to the client) and as a store call's session metadata (store_sessions.h).
// None may crash, hang, or allocate beyond the limits.
// Build and run with scripts/fuzz (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>

#include "cluster/peers.h"
#include "gradwire/rpc/frame.h"
#include "rref/rref_messages.h"
#include "security/handshake.h"
#include "store/store_sessions.h"
#include "wire/codec.h"

namespace {

template <typename... M>
void DecodeAs(const gw::rpc::Value& payload) {
  (void(gw::rpc::ValueTraits<M>::From(payload)), ...);
}

// Feeds `in` to a handshake in the pieces it asks for, as a transport would.
void Handshake(gw::rpc::internal::Handshake::Role role, absl::string_view in) {
  gw::rpc::internal::Handshake hs(role, "fuzz secret", "rpc");
  while (hs.wanted() > 0 && in.size() >= hs.wanted()) {
    (void)hs.TakeOutput();
    const absl::string_view piece = in.substr(0, hs.wanted());
    in.remove_prefix(piece.size());
    if (!hs.OnInput(piece).ok()) break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  Handshake(gw::rpc::internal::Handshake::Role::kServer, bytes);
  Handshake(gw::rpc::internal::Handshake::Role::kClient, bytes);
  {
    static gw::rpc::internal::StoreSessions sessions("fuzz secret", absl::Seconds(1));
    const size_t a = size / 4, b = size / 2;
    (void)sessions.Authorize(bytes.substr(0, a), bytes.substr(a, b - a), bytes.substr(b), "Set", bytes);
    if (size >= gw::rpc::internal::Handshake::kHelloBytes) {
      (void)sessions.Hello("fuzzer", bytes.substr(0, gw::rpc::internal::Handshake::kHelloBytes));
    }
  }
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
