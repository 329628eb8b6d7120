// Internal: StoreSessions, how the rendezvous store (store.cc) knows its clients hold the
// job's secret, and CallSigner, how a client proves it on every call.
//
// Contract
//   - A client opens a session with two calls carrying handshake.h's challenge-response
//     (Hello: its hello -> the challenge and a handshake id; Prove: its proof -> the
//     verdict and a session id). Every later call carries metadata gw-session (the id),
//     gw-seq (a number the client never uses twice in the session) and gw-mac
//     (HMAC-SHA256 under the session key of "method|seq|request bytes", hex). Authorize
//     accepts a call only with a known session, a correct MAC and a sequence number not
//     seen before: a recorded call replayed, or altered, is refused (UNAUTHENTICATED,
//     saying why); so is a handshake replayed (its challenge is new each time).
//   - Handshake and session ids are random 64-bit numbers (a stranger cannot guess one to
//     spoil another client's handshake).
//   - Bounded memory: at most 256 handshakes pending per client address (more are refused
//     with RESOURCE_EXHAUSTED; the client tries again until its deadline) and 1,024 in all (the oldest dropped; each
//     expires after the handshake timeout); 16,384 sessions (past that one is dropped: its client gets UNAUTHENTICATED
//     "unknown session" and opens a new one, as GrpcStore does by itself). A session remembers the last 4,096 sequence
//     numbers; older ones are refused.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_SRC_STORE_STORE_SESSIONS_H_
#define GRADWIRE_RPC_SRC_STORE_STORE_SESSIONS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "security/handshake.h"

namespace gw::rpc::internal {

inline constexpr absl::string_view kStorePurpose = "store";

class StoreSessions {
 public:
  StoreSessions(std::string secret, absl::Duration handshake_timeout);

  struct Challenge {
    std::string bytes;
    uint64_t handshake = 0;
  };
  // `from`: the client's address (its IP), for the cap of handshakes pending per client.
  absl::StatusOr<Challenge> Hello(const std::string& from, absl::string_view hello);
  struct Verdict {
    std::string bytes;
    uint64_t session = 0;  // 0: refused
    absl::Status refused;
  };
  Verdict Prove(uint64_t handshake, absl::string_view proof);

  absl::Status Authorize(absl::string_view session, absl::string_view seq, absl::string_view mac,
                         absl::string_view method, absl::string_view body);

 private:
  struct Pending {
    std::unique_ptr<Handshake> handshake;
    absl::Time expires;
    std::string from;
  };
  uint64_t NewId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Session {
    std::string key;
    uint64_t max_seq = 0;
    absl::flat_hash_set<uint64_t> recent;
  };

  const std::string secret_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

// The client's side of a session: signs calls.
class CallSigner {
 public:
  CallSigner(uint64_t session, std::string key) : session_(session), key_(std::move(key)) {}
  struct Signature {
    std::string session, seq, mac;
  };
  Signature Sign(absl::string_view method, absl::string_view body);

 private:
  const uint64_t session_;
  const std::string key_;
  absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
};

std::string CallMac(absl::string_view key, absl::string_view method, uint64_t seq, absl::string_view body);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_STORE_STORE_SESSIONS_H_
