// Internal: ConnectionRate, which new connections a listener takes (PeerLimits::
// max_connections_per_second): a token bucket per remote IP address, refilled at the rate
// per second up to a burst of twice that. Memory stays bounded under a spray of addresses
// (past 65,536 of them the buckets that refilled are forgotten; all, if that is not
// enough). Thread-safe.
#ifndef GRADWIRE_RPC_SRC_SECURITY_CONNECTION_RATE_H_
#define GRADWIRE_RPC_SRC_SECURITY_CONNECTION_RATE_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gw::rpc::internal {

class ConnectionRate {
 public:
  explicit ConnectionRate(int per_second) : per_second_(per_second) {}
  // True if a connection from `ip` may be taken now (always, with no limit).
  bool Take(const std::string& ip, absl::Time now);

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time last;
  };
  const int per_second_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_SECURITY_CONNECTION_RATE_H_
