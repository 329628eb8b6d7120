// Fault-injecting decorator of any Transport (internal header; MakeTransport wraps the
// named backend with it when TransportOptions::faults is set). gradwire/rpc/faults.h
// says what each fault does; this is the link protocol that hides the recoverable ones.
//
// Protocol, on top of the inner connection (each inner message's header starts with a
// type byte and a crc32, then the type's fields; integers little-endian):
//   'H' hello    magic u32 "GWFL" | the sender's worker name. The dialer sends it first,
//                the acceptor answers with its own; a partition closes the connection
//                right after. Anything else first is refused (DATA_LOSS).
//   'D' data     seq u64 | ack u64 | the user's header (+ the user's tensors). seq counts
//                from 1 in each direction; ack piggybacks the cumulative ack of the other
//                direction.
//   'A' ack      ack u64: every data frame up to `ack` arrived. Sent at the end of a read
//                (the inner on_flush) when data arrived and no data frame carried the ack.
//   'C' goodbye  reason: the sender closes because of a fault (close_after, partition, a
//                bad checksum); the receiver closes too, UNAVAILABLE, naming it and the
//                reason. The sender closes when the receiver did, or after 200 ms.
// The crc32 covers the tensors (dtype, sizes, bytes), the user's header, the type byte
// and the fields; a mismatch closes the connection with DATA_LOSS naming the peer.
//
// Sender: a data frame (with private copies of its tensors, so the caller may modify
// them once Send returns) is kept until acknowledged. Every `rto` a scan retransmits the
// frames whose timeout passed: max(rto, SRTT + 4 RTTVAR) as TCP measures it (Karn: only
// frames sent once are timed), plus 4 ms per MiB of the frame, doubled per retransmission
// up to 8x. on_sent reports OK once the peer's decorator acknowledged the frame, or the
// close reason if the connection closes first; exactly once.
// Receiver: data frames are delivered in sequence order, exactly once, on the inner
// connection's I/O thread; later ones wait in a reorder buffer, duplicates are dropped
// and acknowledged again.
// Timers: one TimerQueue thread per transport; each connection keeps one timer armed at
// its next deadline (a delayed frame, a reorder window, the end of a stall, the next
// retransmission scan). No thread per connection, no sleeping.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_FAULT_FAULT_TRANSPORT_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_FAULT_FAULT_TRANSPORT_H_

#include <memory>

#include "gradwire/rpc/faults.h"
#include "gradwire/rpc/transport.h"

namespace gw::rpc {

// REQUIRES: faults != nullptr. options.self_name names this worker in hellos.
std::unique_ptr<Transport> MakeFaultTransport(std::unique_ptr<Transport> inner, std::shared_ptr<FaultInjector> faults,
                                              const TransportOptions& options);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_FAULT_FAULT_TRANSPORT_H_
