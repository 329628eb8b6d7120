// Internal: TlsConnection, a Connection over a TLS stream (the tcp transport's, with
// Security::tls set; admission.h made the stream).
//
// Contract (transport.h's, with these differences from the plain TCP connection)
//   - Send copies the frame, with its tensors' bytes, into the connection's outgoing
//     buffer at once (the caller may modify its tensors as soon as Send returns); the
//     I/O thread encrypts and writes everything buffered meanwhile as one write
//     (OpenSSL cannot encrypt from a gather list without a copy, so the copy is made once,
//     here). on_sent runs once the bytes were handed to the socket.
//   - Reads decrypt into a 64 KiB staging buffer and feed the frame decoder.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_TCP_TLS_CONNECTION_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_TCP_TLS_CONNECTION_H_

#include <memory>

#include "gradwire/rpc/transport.h"
#include "transport/tcp/admission.h"

namespace gw::rpc::internal {

// Starts reading at once.
std::shared_ptr<Connection> StartTlsConnection(std::unique_ptr<SslStream> stream, ConnectionCallbacks callbacks,
                                               FrameLimits limits);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_TCP_TLS_CONNECTION_H_
