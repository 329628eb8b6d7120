// Security: who may talk to a worker (the job secret), how its connections are
// encrypted (TLS with mutual certificates), and what one peer may do (limits).
//
// Contract
//   - Authentication is on by default. A job has a secret (any bytes; `gradwire launch`
//     makes 32 random ones per job and hands them to its workers in a file readable by the
//     user only); every connection of every transport, and every client of the
//     rendezvous store, starts with a mutual challenge-response over fresh nonces of both
//     sides (HMAC-SHA256 keyed by the secret, compared in constant time; handshake.h)
//     before any frame is read. A peer without the secret, with another one, or replaying
//     a recorded handshake is disconnected with a logged reason; it never reaches a
//     handler, the RRef layer or a shared-memory arena.
//   - The secret proves membership of the job, not confidentiality: without TLS a
//     connection's bytes can be read, and an attacker on the path between two workers
//     could take over an authenticated TCP stream. TLS (tls.enabled()) encrypts and
//     protects every byte: the tcp and shm transports through OpenSSL (Asio's SSL), the
//     grpc transport, the store and etcd through gRPC's SSL credentials. Both sides
//     present a certificate that the job's CA (ca_file) signed, and refuse a peer whose
//     certificate it did not sign; host names are not checked (the CA is the job's: it
//     signs only the job's workers). The secret is checked inside TLS as well.
//   - Same-host shared memory (the shm transport's arena and cross-memory attach) is used
//     only on connections that authenticated, and bypasses TLS: its bytes never leave the
//     host. A receiver maps a sender's arena read-only but for the blocks it was given.
//   - Limits bound what one peer may make this worker hold (PeerLimits); past a limit
//     the peer's call fails with RESOURCE_EXHAUSTED naming the limit (connections: closed
//     before the handshake), and every other peer goes on being served.
//   - FromEnv() reads GRADWIRE_SECRET (the secret itself), GRADWIRE_SECRET_FILE (a regular
//     file holding it, at most 64 KiB; `gradwire launch` sets this one to
//     /proc/self/fd/N, a memfd the worker inherits, which becomes close-on-exec once read
//     so that what the worker starts does not inherit it), GRADWIRE_AUTH=off (authenticate =
//     false: for a trusted network only), GRADWIRE_TLS_CERT, GRADWIRE_TLS_KEY,
//     GRADWIRE_TLS_CA (all three, or none), GRADWIRE_MAX_CALLS_IN_FLIGHT,
//     GRADWIRE_MAX_RREFS_PER_PEER, GRADWIRE_MAX_CONTEXTS_PER_PEER and
//     GRADWIRE_MAX_CONNECTIONS_PER_SECOND. INVALID_ARGUMENT for a malformed value, an
//     unreadable or empty secret file, or TLS files named partly.
#ifndef GRADWIRE_RPC_SECURITY_H_
#define GRADWIRE_RPC_SECURITY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gw::rpc {

// Certificate, key and CA as PEM files.
struct TlsOptions {
  std::string cert_file;  // this worker's certificate, signed by the job's CA
  std::string key_file;   // its private key
  std::string ca_file;    // the job's CA: peers must present a certificate it signed
  // The name gRPC's clients (grpc transport, store) check in the server's certificate
  // instead of its address (scripts/make-certs puts it in every certificate it makes).
  std::string server_name = "gradwire";
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// What one peer may make this worker hold. 0: no limit.
struct PeerLimits {
  // Calls from one peer being handled at once (later ones: RESOURCE_EXHAUSTED; gradwire's
  // own protocol messages count but are never refused).
  int max_calls_in_flight = 8192;
  // RRefs one peer may have this worker own for it (created by its remote() calls).
  int64_t max_rrefs = 1 << 20;
  // Distributed autograd contexts one peer may have open on this worker.
  int64_t max_contexts = 1 << 16;
  // New connections accepted per second from one IP address (burst: twice as many);
  // more are closed before their handshake.
  int max_connections_per_second = 200;
};

struct Security {
  // The job's secret. Empty with authenticate: the agent refuses to form a group of more
  // than one worker (FAILED_PRECONDITION saying where a secret comes from).
  std::string secret;
  // false: peers are not authenticated (anyone who reaches the port may call every
  // function). Only for a network where every process is trusted.
  bool authenticate = true;
  TlsOptions tls;
  // A connection that has not finished its handshakes by then is closed.
  absl::Duration handshake_timeout = absl::Seconds(10);
  PeerLimits limits;

  // True when connections run the challenge-response.
  bool authenticates() const { return authenticate && !secret.empty(); }
  // INVALID_ARGUMENT for TLS files named partly or unreadable.
  absl::Status Validate() const;

  static absl::StatusOr<Security> FromEnv();
};

// 32 random bytes from OpenSSL's generator, as 64 hex digits: a fresh job secret.
std::string MakeJobSecret();

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_SECURITY_H_
