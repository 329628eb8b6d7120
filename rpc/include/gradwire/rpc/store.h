// Store: the rendezvous key-value store, and the gRPC server that hosts it.
//
// Contract
//   - A Store maps string keys to byte-string values. Get and Wait block until the keys
//     exist or the timeout passes (DEADLINE_EXCEEDED naming the missing key); Add
//     atomically adds to a decimal counter (creating it at 0) and returns the new value.
//   - StoreServer hosts the store over gRPC (rank 0 does by default, at MASTER_ADDR:
//     MASTER_PORT). ConnectStore() returns a client; it is how workers find each other,
//     and user code may use it too.
//   - ConnectStore("etcd://HOST:PORT/JOB") is a client of an etcd cluster (v3 API, etcd
//     3.4 or later) instead: the same semantics, every key K stored in etcd as
//     "/gradwire/JOB/K" (JOB: letters, digits, '.', '_', '-'; jobs on one etcd never mix
//     keys). Get and Wait watch the keys they wait for (no polling); Add is an atomic
//     compare-and-swap that counts once even when etcd fails meanwhile. Until an
//     operation's deadline (its timeout; 10 s for Set, Add and Delete) the client rides
//     out an etcd that restarts: it reconnects and watches again. Nobody hosts such a
//     store, and its keys outlive the job: Agent's rendezvous removes a run's own keys
//     at a graceful shutdown (agent.h).
//   - An unreachable server is UNAVAILABLE with the address in the message (for etcd,
//     also what to check); a malformed etcd:// address is INVALID_ARGUMENT showing the
//     expected form; a Get or Wait that times out is DEADLINE_EXCEEDED naming a missing
//     key (etcd's client names every one).
//   - Authentication (security.h): a store started with a secret serves only clients that
//     opened a session by the secret's challenge-response, and only calls signed with the
//     session's key, each sequence number once (store_sessions.h: replayed or altered
//     calls are refused with UNAUTHENTICATED and logged). The values themselves travel in
//     the clear unless TLS is on.
//   - Thread-safe: clients and the server may be used from many threads.
#ifndef GRADWIRE_RPC_STORE_H_
#define GRADWIRE_RPC_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/security.h"

namespace gw::rpc {

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  virtual absl::StatusOr<bool> Delete(const std::string& key) = 0;
};

class StoreServer {
 public:
  // Listens on host:port (port 0 picks a free one). With security.authenticates(), every
  // client must prove it holds the secret (and every call is signed, below); with TLS,
  // clients must present a certificate signed by the CA.
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host, int port,
                                                            const Security& security = {});
  virtual ~StoreServer() = default;
  virtual int port() const = 0;
  virtual std::string address() const = 0;
  // Fails pending waits with CANCELLED and stops serving. Idempotent.
  virtual void Shutdown() = 0;
};

// A client of the store at `address` ("host:port", or "etcd://HOST:PORT/JOB" for etcd),
// connected (or UNAVAILABLE) by `deadline`; authenticated by security's secret
// (PERMISSION_DENIED / UNAUTHENTICATED when the store refuses it or cannot prove it
// holds the secret too), over TLS when security.tls is set (etcd: TLS only, checking
// etcd's certificate against the CA and its host name; etcd's own client-certificate
// authentication then keeps others out).
absl::StatusOr<std::unique_ptr<Store>> ConnectStore(const std::string& address, absl::Time deadline,
                                                    const Security& security = {});

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_STORE_H_
