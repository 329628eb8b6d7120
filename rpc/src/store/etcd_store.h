// Internal: EtcdStore, the rendezvous Store (store.h) over etcd's v3 gRPC API, for jobs
// whose workers meet through an etcd cluster instead of a store hosted by rank 0.
//
// Contract
//   - Addresses: "etcd://HOST:PORT/JOB" (ParseEtcdUrl; HOST may be "[v6]"). JOB is
//     letters, digits, '.', '_' and '-'; it is the job's namespace: every key K lives in
//     etcd as "/gradwire/JOB/K", so jobs sharing one etcd never see each other's keys.
//     Anything else is INVALID_ARGUMENT saying the expected form. IsEtcdUrl tells an
//     etcd address from the built-in store's "host:port".
//   - ConnectEtcdStore(url, deadline) connects and checks that the server speaks etcd's
//     v3 API: UNAVAILABLE naming the address (and what to check) when nothing answers
//     by `deadline`, FAILED_PRECONDITION when something else answers there.
//   - Semantics are Store's (store.h), as the built-in store has them: Set overwrites;
//     Get and Wait block until the keys exist; Add adds to a decimal counter (created at
//     0), FAILED_PRECONDITION when the key holds something else; Delete says whether the
//     key existed. Get/Wait read once and, for keys still missing, watch them from the
//     next revision (etcd's Watch: woken by the Put, nothing polls); a timeout is
//     DEADLINE_EXCEEDED naming every missing key. A short timeout (even 0) still
//     reads once: a read may take up to a second whatever the timeout.
//   - Add is a compare-and-swap (Txn on the key's mod_revision), retried when another
//     client changed the key in between, so concurrent Adds from any number of clients
//     are atomic. It counts exactly once even when etcd fails while the Txn is in flight:
//     the same Txn writes a receipt ("/gradwire/JOB#adds/<client>" = the Add's number),
//     which the retry reads first; the client deletes its receipt when destroyed (a
//     crashed client leaves that one small key). Adds of one client are serialised.
//     Delete is not made exactly-once: one retried after its answer was lost may say
//     false for the key it removed.
//   - Every operation has a deadline: Get/Wait their timeout, the others kRpcTimeout.
//     Until then UNAVAILABLE (etcd down or restarting, no leader yet) is retried: calls
//     wait for the channel to reconnect (gRPC's wait_for_ready) after a short backoff
//     (RetryPolicy's), and watches are established again from a fresh read. So an etcd
//     that restarts on the same data dir is transparent to callers that wait long
//     enough. At the deadline an unreachable etcd is UNAVAILABLE "cannot reach etcd at
//     HOST:PORT ...", a reachable one that did not answer DEADLINE_EXCEEDED.
//   - DeletePrefix(p) removes every key that starts with p (within JOB) in one request;
//     the rendezvous uses it to remove a finished run's keys.
//   - Thread-safe: any number of threads may call any method at once.
#ifndef GRADWIRE_RPC_SRC_STORE_ETCD_STORE_H_
#define GRADWIRE_RPC_SRC_STORE_ETCD_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gradwire/rpc/store.h"

namespace gw::rpc::internal {

inline constexpr absl::string_view kEtcdScheme = "etcd://";

struct EtcdUrl {
  std::string url;       // as given
  std::string endpoint;  // "HOST:PORT", as gRPC dials it
  std::string host;      // without brackets
  std::string job;
  std::string prefix;  // "/gradwire/JOB/"
};

bool IsEtcdUrl(absl::string_view address);
absl::StatusOr<EtcdUrl> ParseEtcdUrl(absl::string_view address);

class EtcdStore : public Store {
 public:
  static constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

  ~EtcdStore() override = default;
  virtual absl::StatusOr<int64_t> DeletePrefix(const std::string& key_prefix) = 0;
};

// With tls.enabled(): over TLS, presenting the certificate and checking etcd's against
// the CA and its host name.
absl::StatusOr<std::unique_ptr<EtcdStore>> ConnectEtcdStore(const std::string& url, absl::Time deadline,
                                                            const TlsOptions& tls = {});

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_STORE_ETCD_STORE_H_
