// Transport and Connection: moving Messages between processes.
//
// Contract
//   - A Transport listens for and dials Connections; each backend lives in
//     rpc/src/transport/<name>/ and passes the conformance suite in
//     rpc/tests/transport_test.cc:
//       tcp   Boost.Asio sockets, scatter-gather writes, payloads read into tensors;
//       shm   tcp plus, between processes on one host, a shared-memory arena for large
//             tensors (one copy by the sender, none by the receiver, no round trip) and
//             cross-memory attach when the arena is full; tcp when neither is permitted;
//       grpc  the same frames over a gRPC bidirectional stream (HTTP/2 networks, TLS).
//   - Connection::Send queues a message and writes it in order with the connection's
//     other messages; the tensors' bytes are written from their own storage
//     (scatter-gather), and on_sent reports the outcome exactly once. Send may write on
//     the calling thread when the socket has room (no thread hop on the hot path).
//   - SendMany(messages) sends several messages in order as one gather-write where the
//     backend can (one syscall instead of one each); failures close the connection.
//     SendCoalesced(message) lets the backend hold a small message until its I/O thread
//     next runs, to write it together with the messages sent meanwhile.
//   - Incoming messages are delivered to ConnectionCallbacks::on_message on a transport
//     I/O thread, in order; callbacks must not block. After a run of on_message calls
//     (everything decoded from one read) and before the I/O thread waits for more input,
//     on_flush (optional) runs on the same thread: consumers that batch work per read
//     hand it off there. on_close runs exactly once, after the last on_message and
//     on_flush, with the reason (peer closed, reset, malformed frame, local Close);
//     every pending send then fails with that reason.
//   - A malformed frame closes only that connection, with a DATA_LOSS reason naming the
//     peer; the process and its other connections carry on.
//   - Listen(host, advertise_host) binds `host` (an address of this host, or a wildcard:
//     0.0.0.0 / ::) on a port the OS picks and returns "advertise_host:port" (the host as
//     given, IPv6 literals bracketed; empty advertise_host: `host`), the address peers
//     dial. The transport does not check that peers can reach it: choosing the advertised
//     host is the caller's business (the agent's: AgentOptions::advertise_host).
//   - stats() counts what went through shared memory (shm; zero for tcp and grpc), so
//     tests and diagnostics can tell which path a job took.
//   - Shutdown() closes the listener and every connection and joins the I/O threads.
//     REQUIRES: Connections do not outlive the Transport that made them.
//     Thread-safe.
//   - TransportOptions::faults wraps the backend in the fault-injecting decorator
//     (faults.h; rpc/src/transport/fault/): a link protocol of its own under the same
//     contract, with on_sent reporting OK once the peer's decorator acknowledged the
//     message. Without it nothing is wrapped.
#ifndef GRADWIRE_RPC_TRANSPORT_H_
#define GRADWIRE_RPC_TRANSPORT_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/frame.h"
#include "gradwire/rpc/security.h"

namespace gw::rpc {

class Connection;
class FaultInjector;

struct ConnectionCallbacks {
  std::function<void(const std::shared_ptr<Connection>&, Message)> on_message;
  std::function<void(const std::shared_ptr<Connection>&, const absl::Status&)> on_close;
  std::function<void(const std::shared_ptr<Connection>&)> on_flush;
};

class Connection {
 public:
  virtual ~Connection() = default;
  virtual void Send(Message message, std::function<void(absl::Status)> on_sent = nullptr) = 0;
  virtual void SendMany(std::vector<Message> messages) {
    for (Message& m : messages) Send(std::move(m));
  }
  // Like Send, for pipelined traffic: the message may wait for one pass of the I/O
  // thread so that messages sent close together leave in one write. Tensors the caller
  // still references are copied first.
  virtual void SendCoalesced(Message message, std::function<void(absl::Status)> on_sent = nullptr) {
    Send(std::move(message), std::move(on_sent));
  }
  virtual void Close(absl::Status reason) = 0;
  // "host:port" of the other end.
  virtual std::string peer() const = 0;
  virtual bool closed() const = 0;
};

struct TransportOptions {
  FrameLimits limits;
  int io_threads = 1;
  // shm: size of this process's shared-memory arena for outgoing large tensors (virtual;
  // memory is used only as far as tensors in flight ever reached). 0 disables it (large
  // tensors then go by cross-memory attach).
  size_t shm_arena_bytes = size_t{1} << 30;
  // Faults to inject (faults.h), shared with whoever controls them; null: none.
  std::shared_ptr<FaultInjector> faults;
  // This worker's name, which the fault decorator tells its peers (for partitions).
  std::string self_name;
  // Authentication, TLS and the connection rate per peer (security.h). Every connection
  // is admitted (handshakes done) before its first frame; the default authenticates
  // nothing, as no secret is set: the agent sets its job's.
  Security security;
};

// Totals since the transport was made (Transport::stats()).
struct TransportStats {
  // Connections on which the peer proved it shares this process's memory (same boot,
  // same network namespace, our cookie read), so that large tensors may go through
  // shared memory to it.
  int64_t shared_memory_connections = 0;
  // Tensors sent through the shared-memory arena or by cross-memory attach.
  int64_t shared_memory_tensors = 0;
  // The arena of outgoing large tensors (TransportOptions::shm_arena_bytes): its size, the
  // most of it ever used, and its blocks that receivers have not released yet.
  int64_t shared_memory_arena_bytes = 0;
  int64_t shared_memory_arena_high_water_bytes = 0;
  int64_t shared_memory_arena_blocks_in_use = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // Starts accepting on `host` (port chosen by the OS); returns the address peers dial,
  // "advertise_host:port" (empty advertise_host: `host`). Accepted connections report
  // through `callbacks`.
  virtual absl::StatusOr<std::string> Listen(const std::string& host, const std::string& advertise_host,
                                             ConnectionCallbacks callbacks) = 0;
  // Dials `address`, retrying until `deadline` while the peer is not yet listening.
  virtual absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address,
                                                              ConnectionCallbacks callbacks,
                                                              absl::Time deadline) = 0;
  virtual void Shutdown() = 0;
  virtual TransportStats stats() const { return {}; }
};

// Transports by name: "tcp", "shm", "grpc"; wrapped in the fault decorator when
// options.faults is set.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name,
                                                         TransportOptions options = {});

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_TRANSPORT_H_
