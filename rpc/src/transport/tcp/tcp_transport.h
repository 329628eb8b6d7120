// TCP transport on Boost.Asio (internal header; use MakeTransport("tcp")).
//
// One io_context served by TransportOptions::io_threads threads. Frames are read into a
// 64 KiB staging buffer, except tensor payloads of 64 KiB or more, which are received
// straight into the destination tensor's storage. Sends try a non-blocking sendmsg() of
// the whole frame (prefix + tensor buffers as iovecs) on the calling thread and hand
// whatever did not fit to the I/O thread. TCP_NODELAY is set on every socket.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"

#include "gradwire/rpc/transport.h"

namespace gw::rpc {

// INVALID_ARGUMENT when TLS is configured and its files do not load.
absl::StatusOr<std::unique_ptr<Transport>> MakeTcpTransport(TransportOptions options);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_TCP_TCP_TRANSPORT_H_
