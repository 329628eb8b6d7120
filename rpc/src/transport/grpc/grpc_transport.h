// gRPC transport (internal header; use MakeTransport("grpc")): the same frames as the tcp
// backend, carried over one gRPC bidirectional stream per Connection, for networks where
// only HTTP/2 passes.
//
// Contract
//   - Listen runs a gRPC server (FrameStream service, proto/gradwire/proto/transport.proto)
//     on host:0 and reports "host:port"; every incoming Stream call is one accepted
//     Connection. Connect opens a channel of its own (own subchannel, so its own HTTP/2
//     connection) to the address, waits for it until the deadline, and opens one Stream.
//   - Each direction of a stream is the byte stream of encoded frames (EncodeFrame) cut
//     into FrameChunks of at most kGrpcChunkBytes; consecutive small frames share chunks.
//     The receiver feeds chunks to a FrameDecoder and delivers messages in order; a
//     malformed frame closes that connection with DATA_LOSS naming the peer. Bytes that
//     are not HTTP/2 never reach the transport: gRPC drops such sockets itself.
//   - Threads: per Connection one writer thread (sends are serialised through it; Send
//     never blocks on the network) and one reader thread, which on the listening side is
//     the gRPC server thread running the Stream call. Callbacks run on the reader thread.
//     A connection's threads are joined when it finishes (by the Stream call, or by the
//     transport on its next Connect/accept) and at Shutdown().
//   - Closing (locally, by the peer, on a malformed frame, at Shutdown) cancels the call;
//     on_close runs once on the reader thread, pending sends fail with the same reason.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include <cstddef>
#include <memory>

#include "gradwire/rpc/transport.h"

namespace gw::rpc {

// Largest FrameChunk payload; gRPC's message size limits are set to twice this.
inline constexpr size_t kGrpcChunkBytes = size_t{1} << 20;

absl::StatusOr<std::unique_ptr<Transport>> MakeGrpcTransport(TransportOptions options);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
