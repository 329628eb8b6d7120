// Internal: Handshake, the mutual challenge-response that opens every authenticated
// connection (security.h): both sides prove they hold the job's secret without sending
// it, over fresh nonces of both, so a recorded handshake is worthless.
//
// Contract
//   - Four messages of fixed sizes, in order:
//       client -> server  hello      "GWAUTH01" | client nonce (32 bytes)
//       server -> client  challenge  "GWAUTH01" | server nonce (32) |
//                                    HMAC(secret, "gradwire server" | purpose | cn | sn)
//       client -> server  proof      HMAC(secret, "gradwire client" | purpose | sn | cn)
//       server -> client  verdict    "GWAUTHOK" or "GWAUTHNO"
//     The labels keep one side's proof from passing for the other's (reflection), the
//     purpose ("rpc", "store") keeps a proof of one protocol out of another, and each
//     side's fresh nonce makes the other's proof new every time (replay). Proofs are
//     compared in constant time (CRYPTO_memcmp); nonces come from RAND_bytes.
//   - A pure state machine over bytes, driven by a transport: TakeOutput() is what to
//     send now (possibly empty), then wanted() bytes are to be read and given to
//     OnInput() at once (0 when finished). OnInput fails with PERMISSION_DENIED
//     (UNAUTHENTICATED for input that is not a handshake at all) saying what the peer did
//     wrong; the server then still has a verdict to send ("GWAUTHNO") before it closes.
//   - done() once both sides are proven; session_key() is then a key both sides derived
//     from the nonces (for per-call MACs of the store, store.cc).
//   - Not thread-safe; one object per connection.
#ifndef GRADWIRE_RPC_SRC_SECURITY_HANDSHAKE_H_
#define GRADWIRE_RPC_SRC_SECURITY_HANDSHAKE_H_

#include <cstddef>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace gw::rpc::internal {

class Handshake {
 public:
  enum class Role { kClient, kServer };
  static constexpr size_t kNonceBytes = 32;
  static constexpr size_t kMacBytes = 32;
  static constexpr size_t kHelloBytes = 8 + kNonceBytes;
  static constexpr size_t kChallengeBytes = 8 + kNonceBytes + kMacBytes;
  static constexpr size_t kProofBytes = kMacBytes;
  static constexpr size_t kVerdictBytes = 8;

  Handshake(Role role, std::string secret, std::string purpose);

  std::string TakeOutput();
  size_t wanted() const { return wanted_; }
  // REQUIRES: input.size() == wanted() > 0.
  absl::Status OnInput(absl::string_view input);
  bool done() const { return done_; }
  const std::string& session_key() const { return session_key_; }

  // HMAC-SHA256(key, data).
  static std::string Mac(absl::string_view key, absl::string_view data);
  // Constant-time equality of two MACs.
  static bool SameMac(absl::string_view a, absl::string_view b);
  static std::string RandomBytes(size_t n);

 private:
  absl::Status OnHello(absl::string_view in);
  absl::Status OnChallenge(absl::string_view in);
  absl::Status OnProof(absl::string_view in);
  absl::Status OnVerdict(absl::string_view in);
  std::string ServerProof() const;
  std::string ClientProof() const;
  void Finish();

  const Role role_;
  const std::string secret_;
  const std::string purpose_;
  std::string client_nonce_;
  std::string server_nonce_;
  std::string output_;
  size_t wanted_ = 0;
  int step_ = 0;
  bool done_ = false;
  std::string session_key_;
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_SECURITY_HANDSHAKE_H_
