// Internal: Admission, what a TCP connection goes through before its first frame: the
// TLS handshake with mutual certificates (when TLS is configured) and then the job
// secret's challenge-response (handshake.h; when the job authenticates), both bounded by
// Security::handshake_timeout. The tcp transport (and the shm transport above it) makes
// a Connection only from a socket that was admitted.
//
// Contract
//   - Admit(...) (the listening side) runs on the socket's io_context and calls `done`
//     exactly once there: with the admitted stream, or with the reason it was refused
//     (PERMISSION_DENIED for a wrong secret or certificate, UNAUTHENTICATED for a peer
//     that did not authenticate at all, DEADLINE_EXCEEDED when the peer stalled,
//     UNAVAILABLE when it went away).
//   - AdmitDialed(...) (the dialing side) returns the same on the calling thread, by
//     `deadline`. Without TLS it reads and writes the socket itself (poll), so a dial from
//     one of the transport's own I/O threads (an inline handler calling a peer not yet
//     connected) works; with TLS the handshakes run on the socket's io_context, which
//     `pump` (true on one of its own threads) has a helper thread run meanwhile. It never
//     waits past the deadline, also when the io_context is stopped (shutdown).
//   - TlsContext::Make loads certificate, key and CA once per transport (INVALID_ARGUMENT
//     naming the file that does not load); peers must present a certificate the CA
//     signed (both directions); TLS 1.2 or later.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_TCP_ADMISSION_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_TCP_ADMISSION_H_

#include <utility>  // before Asio: its awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/security.h"

namespace gw::rpc::internal {

using SslStream = boost::asio::ssl::stream<boost::asio::ip::tcp::socket>;

class TlsContext {
 public:
  static absl::StatusOr<std::unique_ptr<TlsContext>> Make(const TlsOptions& tls);
  boost::asio::ssl::context& context() { return context_; }

 private:
  TlsContext() : context_(boost::asio::ssl::context::tls) {}
  boost::asio::ssl::context context_;
};

// An admitted connection: a plain socket, or a TLS stream when TLS is on.
struct AdmittedSocket {
  std::unique_ptr<boost::asio::ip::tcp::socket> plain;
  std::unique_ptr<SslStream> tls;
};

enum class Side { kDialer, kListener };

// `tls` may be null (no TLS); `secret` empty: no challenge-response.
void Admit(boost::asio::ip::tcp::socket socket, Side side, TlsContext* tls, const std::string& secret,
           absl::Duration timeout, std::function<void(absl::StatusOr<AdmittedSocket>)> done);
absl::StatusOr<AdmittedSocket> AdmitDialed(boost::asio::ip::tcp::socket socket, TlsContext* tls,
                                           const std::string& secret, absl::Time deadline, bool pump);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_TCP_ADMISSION_H_
