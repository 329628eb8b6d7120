// Same-host transport: TCP for control and small tensors; large tensors through a
// shared-memory arena (shm_arena.h), or by cross-memory attach (CMA, process_vm_readv)
// when the arena is full or cannot be mapped (internal header; use MakeTransport("shm")).
//
// Protocol, on top of a TCP connection (each message's header starts with a type byte):
//   'H' hello      both sides, first: pid, boot id, the address + value of a random
//                  cookie in the sender's memory, its arena (fd, size, cookie), and its
//                  network namespace (the inode of /proc/self/ns/net).
//   'K' can        flags: kCanRead "I read your cookie with process_vm_readv: send me
//                  large tensors by address"; kMappedArena "I mapped your arena (through
//                  /proc/<pid>/fd) and found its cookie: put large tensors there". Sent
//                  only when boot id and network namespace equal the receiver's and a
//                  check passed: processes in different network namespaces stand for
//                  different hosts (containers, the tests' simulated hosts) even where
//                  they could read each other's memory. Until then (or if never: other
//                  host or namespace, no permission) every tensor goes inline over TCP.
//                  Transport::stats() counts the connections a 'K' opened and the
//                  tensors sent through shared memory.
//   'D' data       the wrapped message: tensors of kArenaThreshold bytes or more are
//                  copied into the sender's arena and replaced by (index, dtype, sizes,
//                  offset) descriptors; the receiver wraps the block without copying and
//                  delivers at once. Without room in the arena, tensors of kCmaThreshold
//                  bytes or more are replaced by (index, dtype, sizes, address) under a
//                  token and take the round trip below.
//   'A' ack        the receiver copied the token's tensors into its own storage.
//   'C' confirm    the sender checked that none of them was modified in place since it
//                  was sent (storage versions); the receiver then delivers the message.
//   'R' resend     one was modified: here are the current bytes inline; deliver those.
// The arena path copies at Send, so the caller may modify its tensors once Send returns;
// the CMA path keeps the tensors alive until the ack and reports on_sent only then, so a
// caller that mutates a tensor after sending it never makes the receiver see a torn copy.
// Messages are delivered in order: a message waits behind an unconfirmed earlier one.
// Either way each large tensor crosses memory once instead of twice through the kernel's
// socket buffers, and the arena path needs no round trip.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_TRANSPORT_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_TRANSPORT_H_

#include <cstddef>
#include <memory>

#include "gradwire/rpc/transport.h"

namespace gw::rpc {

inline constexpr size_t kArenaThreshold = 64 << 10;
inline constexpr size_t kCmaThreshold = 256 << 10;

absl::StatusOr<std::unique_ptr<Transport>> MakeShmTransport(TransportOptions options);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_SHM_SHM_TRANSPORT_H_
