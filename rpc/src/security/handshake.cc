#include "security/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gw::rpc::internal {
namespace {

constexpr absl::string_view kMagic = "GWAUTH01";
constexpr absl::string_view kAccepted = "GWAUTHOK";
constexpr absl::string_view kRefused = "GWAUTHNO";
constexpr absl::string_view kFrameMagic = "GWFR";  // frame.h's kFrameMagic, little-endian

}  // namespace

Handshake::Handshake(Role role, std::string secret, std::string purpose)
    : role_(role), secret_(std::move(secret)), purpose_(std::move(purpose)) {
  if (role_ == Role::kClient) {
    client_nonce_ = RandomBytes(kNonceBytes);
    output_ = absl::StrCat(kMagic, client_nonce_);
    wanted_ = kChallengeBytes;
  } else {
    wanted_ = kHelloBytes;
  }
}

std::string Handshake::TakeOutput() { return std::exchange(output_, {}); }

absl::Status Handshake::OnInput(absl::string_view input) {
  if (input.size() != wanted_ || wanted_ == 0) {
    return absl::InternalError(absl::StrCat("handshake: got ", input.size(), " bytes, wanted ", wanted_));
  }
  wanted_ = 0;
  const int step = step_++;
  if (role_ == Role::kServer) return step == 0 ? OnHello(input) : OnProof(input);
  return step == 0 ? OnChallenge(input) : OnVerdict(input);
}

absl::Status Handshake::OnHello(absl::string_view in) {
  if (!absl::StartsWith(in, kMagic)) {
    if (absl::StartsWith(in, kFrameMagic)) {
      return absl::UnauthenticatedError(
          "the peer sent frames without authenticating: it runs without the job's secret (set "
          "GRADWIRE_SECRET_FILE or GRADWIRE_SECRET as the job's other workers have it, or start it with "
          "`gradwire launch`)");
    }
    return absl::UnauthenticatedError("the peer's first bytes are not a gradwire handshake");
  }
  client_nonce_ = std::string(in.substr(kMagic.size()));
  server_nonce_ = RandomBytes(kNonceBytes);
  output_ = absl::StrCat(kMagic, server_nonce_, ServerProof());
  wanted_ = kProofBytes;
  return absl::OkStatus();
}

absl::Status Handshake::OnChallenge(absl::string_view in) {
  if (!absl::StartsWith(in, kMagic)) {
    return absl::UnauthenticatedError("the peer's answer is not a gradwire handshake");
  }
  server_nonce_ = std::string(in.substr(kMagic.size(), kNonceBytes));
  if (!SameMac(in.substr(kMagic.size() + kNonceBytes), ServerProof())) {
    return absl::PermissionDeniedError(
        "the peer did not prove it holds this job's secret (it belongs to another job, or is an impostor)");
  }
  output_ = ClientProof();
  wanted_ = kVerdictBytes;
  return absl::OkStatus();
}

absl::Status Handshake::OnProof(absl::string_view in) {
  if (!SameMac(in, ClientProof())) {
    output_ = std::string(kRefused);
    return absl::PermissionDeniedError(
        "the peer did not prove it holds this job's secret (another job's secret, or a replayed handshake)");
  }
  output_ = std::string(kAccepted);
  Finish();
  return absl::OkStatus();
}

absl::Status Handshake::OnVerdict(absl::string_view in) {
  if (in == kAccepted) {
    Finish();
    return absl::OkStatus();
  }
  if (in == kRefused) {
    return absl::PermissionDeniedError(
        "the peer refused our proof: its job secret differs from ours (check GRADWIRE_SECRET_FILE / "
        "GRADWIRE_SECRET on both)");
  }
  return absl::UnauthenticatedError("the peer's verdict is not a gradwire handshake");
}

std::string Handshake::ServerProof() const {
  return Mac(secret_, absl::StrCat("gradwire server|", purpose_, "|", client_nonce_, server_nonce_));
}

std::string Handshake::ClientProof() const {
  return Mac(secret_, absl::StrCat("gradwire client|", purpose_, "|", server_nonce_, client_nonce_));
}

void Handshake::Finish() {
  done_ = true;
  session_key_ = Mac(secret_, absl::StrCat("gradwire session|", purpose_, "|", client_nonce_, server_nonce_));
}

std::string Handshake::Mac(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), out, &len) == nullptr) {
    std::abort();  // only on an OpenSSL without SHA-256: nothing could be authenticated
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool Handshake::SameMac(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string Handshake::RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    std::abort();  // no entropy: a predictable nonce would make handshakes replayable
  }
  return out;
}

}  // namespace gw::rpc::internal
