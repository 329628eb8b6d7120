// Same-host transport: TCP for control and small tensors, cross-memory attach (CMA,
// process_vm_readv) for large tensors (internal header; use MakeTransport("shm")).
//
// Protocol, on top of a TCP connection (each message's header starts with a type byte):
//   'H' hello      both sides, first: pid, boot id, and the address + value of a random
//                  cookie in the sender's memory.
//   'K' can-read   "I read your cookie with process_vm_readv: send me large tensors by
//                  address". Until then (or if never: other host, no ptrace permission)
//                  every tensor goes inline over TCP.
//   'D' data       the wrapped message: tensors of kCmaThreshold bytes or more are
//                  replaced by (index, dtype, sizes, address) descriptors under a token.
//   'A' ack        the receiver copied the token's tensors into its own storage.
//   'C' confirm    the sender checked that none of them was modified in place since it
//                  was sent (storage versions); the receiver then delivers the message.
//   'R' resend     one was modified: here are the current bytes inline; deliver those.
// The sender keeps the tensors alive until the ack and reports on_sent only then, so a
// caller that mutates a tensor after sending it never makes the receiver see a torn copy.
// Messages are delivered in order: a message waits behind an unconfirmed earlier one.
// Each large tensor crosses memory once (one copy) instead of twice through the kernel's
// socket buffers.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_TRANSPORT_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_TRANSPORT_H_

#include <cstddef>
#include <memory>

#include "gradwire/rpc/transport.h"

namespace gw::rpc {

inline constexpr size_t kCmaThreshold = 256 << 10;

std::unique_ptr<Transport> MakeShmTransport(TransportOptions options);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_TRANSPORT_H_
