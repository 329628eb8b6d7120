#include "transport/tcp/admission.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "security/handshake.h"
#include "transport/host_address.h"

namespace gw::rpc::internal {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

class Admission : public std::enable_shared_from_this<Admission> {
 public:
  using Done = std::function<void(absl::StatusOr<AdmittedSocket>)>;

  Admission(tcp::socket socket, Side side, TlsContext* tls, const std::string& secret, absl::Duration timeout,
            Done done)
      : strand_(asio::make_strand(socket.get_executor())), timer_(socket.get_executor()), side_(side),
        timeout_(timeout), done_(std::move(done)) {
    boost::system::error_code ec;
    const tcp::endpoint ep = socket.remote_endpoint(ec);
    peer_ = ec ? "unknown peer" : JoinHostPort(ep.address().to_string(), ep.port());
    if (tls != nullptr) {
      tls_ = std::make_unique<SslStream>(std::move(socket), tls->context());
    } else {
      plain_ = std::make_unique<tcp::socket>(std::move(socket));
    }
    if (!secret.empty()) {
      handshake_.emplace(side == Side::kDialer ? Handshake::Role::kClient : Handshake::Role::kServer, secret, "rpc");
    }
  }

  void Start() {
    asio::post(strand_, [self = shared_from_this()] {
      self->timer_.expires_after(absl::ToChronoNanoseconds(self->timeout_));
      self->timer_.async_wait(asio::bind_executor(self->strand_, [self](const boost::system::error_code& ec) {
        if (!ec) self->TimedOut();
      }));
      if (self->tls_ == nullptr) return self->Step();
      self->tls_->async_handshake(
          self->side_ == Side::kDialer ? asio::ssl::stream_base::client : asio::ssl::stream_base::server,
          asio::bind_executor(self->strand_, [self](const boost::system::error_code& ec) {
            if (ec) {
              return self->Finish(self->IoError(
                  "TLS handshake", ec,
                  " (the peer's certificate is not signed by this job's CA, ours is not by its, or it does not "
                  "speak TLS: check GRADWIRE_TLS_CERT, GRADWIRE_TLS_KEY and GRADWIRE_TLS_CA on both)"));
            }
            self->Step();
          }));
    });
  }

 private:
  tcp::socket& lowest() { return tls_ != nullptr ? tls_->next_layer() : *plain_; }

  template <typename Buffer, typename Handler>
  void Transfer(bool write, Buffer buffer, Handler handler) {
    auto h = asio::bind_executor(strand_, std::move(handler));
    if (tls_ != nullptr) {
      write ? asio::async_write(*tls_, buffer, std::move(h)) : asio::async_read(*tls_, buffer, std::move(h));
    } else {
      write ? asio::async_write(*plain_, buffer, std::move(h)) : asio::async_read(*plain_, buffer, std::move(h));
    }
  }

  // Sends what the handshake has to say, then reads what it wants next.
  void Step(absl::Status after_write = absl::OkStatus()) {
    if (!handshake_) return Finish(absl::OkStatus());
    out_ = handshake_->TakeOutput();
    if (out_.empty()) return Read(after_write);
    Transfer(true, asio::buffer(out_), [self = shared_from_this(), after_write](const boost::system::error_code& ec, size_t) {
      if (ec) return self->Finish(after_write.ok() ? self->IoError("authentication", ec, "") : after_write);
      self->Read(after_write);
    });
  }

  void Read(const absl::Status& after_write) {
    if (!after_write.ok() || handshake_->wanted() == 0) {
      return Finish(after_write.ok() && !handshake_->done()
                        ? absl::InternalError("handshake stopped before it finished")
                        : after_write);
    }
    in_.assign(handshake_->wanted(), '\0');
    Transfer(false, asio::buffer(in_), [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
      if (ec) {
        return self->Finish(self->IoError(
            "authentication", ec,
            ec == asio::error::eof ? " (it closed the connection: it refused our proof, or does not authenticate)"
                                   : ""));
      }
      absl::Status s = self->handshake_->OnInput(self->in_);
      if (!s.ok()) {
        s = absl::Status(s.code(), absl::StrCat("authentication with ", self->peer_, " failed: ", s.message()));
      }
      self->Step(s);  // a refusing listener still sends its verdict
    });
  }

  absl::Status IoError(const char* what, const boost::system::error_code& ec, absl::string_view hint) {
    if (timed_out_) {
      return absl::DeadlineExceededError(absl::StrCat(what, " with ", peer_, " did not finish within ",
                                                      absl::FormatDuration(timeout_),
                                                      " (Security::handshake_timeout)"));
    }
    const bool tls_error = ec.category() == asio::error::get_ssl_category();
    return tls_error ? absl::PermissionDeniedError(absl::StrCat(what, " with ", peer_, " failed: ", ec.message(), hint))
                     : absl::UnavailableError(absl::StrCat(what, " with ", peer_, " failed: ", ec.message(), hint));
  }

  void TimedOut() {
    if (finished_) return;  // the timer fired as the handshakes finished: the socket is handed on
    timed_out_ = true;
    boost::system::error_code ignored;
    lowest().close(ignored);  // fails the pending read or write
  }

  void Finish(absl::Status status) {
    if (finished_) return;
    finished_ = true;
    timer_.cancel();
    Done done = std::move(done_);
    if (!status.ok()) {
      boost::system::error_code ignored;
      lowest().close(ignored);
      return done(std::move(status));
    }
    AdmittedSocket admitted;
    admitted.plain = std::move(plain_);
    admitted.tls = std::move(tls_);
    done(std::move(admitted));
  }

  asio::strand<asio::any_io_executor> strand_;
  asio::steady_timer timer_;
  const Side side_;
  const absl::Duration timeout_;
  Done done_;
  std::string peer_;
  std::unique_ptr<tcp::socket> plain_;
  std::unique_ptr<SslStream> tls_;
  std::optional<Handshake> handshake_;
  std::string out_;
  std::string in_;
  bool timed_out_ = false;
  bool finished_ = false;
};

// The dialing side's challenge-response over a plain socket, on this thread: poll and
// send/recv on its descriptor, each bounded by the deadline.
class BlockingExchange {
 public:
  BlockingExchange(int fd, std::string peer, absl::Time deadline) : fd_(fd), peer_(std::move(peer)), deadline_(deadline) {}

  absl::Status Run(Handshake& hs) {
    while (true) {
      if (std::string out = hs.TakeOutput(); !out.empty()) {
        if (absl::Status s = Write(out); !s.ok()) return s;
      }
      if (hs.wanted() == 0) {
        return hs.done() ? absl::OkStatus() : absl::InternalError("handshake stopped before it finished");
      }
      std::string in(hs.wanted(), '\0');
      if (absl::Status s = Read(in); !s.ok()) return s;
      if (absl::Status s = hs.OnInput(in); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("authentication with ", peer_, " failed: ", s.message()));
      }
    }
  }

 private:
  absl::Status Wait(short events) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline_ - absl::Now());
    pollfd p{fd_, events, 0};
    const int r = ms <= 0 ? 0 : ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (r > 0) return absl::OkStatus();
    if (r < 0 && errno == EINTR) return Wait(events);
    return absl::DeadlineExceededError(absl::StrCat("authentication with ", peer_,
                                                    " did not finish in time (Security::handshake_timeout)"));
  }
  absl::Status Write(const std::string& bytes) {
    for (size_t done = 0; done < bytes.size();) {
      if (absl::Status s = Wait(POLLOUT); !s.ok()) return s;
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) return Failed(std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status Read(std::string& into) {
    for (size_t done = 0; done < into.size();) {
      if (absl::Status s = Wait(POLLIN); !s.ok()) return s;
      const ssize_t n = ::recv(fd_, into.data() + done, into.size() - done, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n == 0) return Failed("it closed the connection: it refused our proof, or does not authenticate");
      if (n < 0) return Failed(std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status Failed(absl::string_view why) {
    return absl::UnavailableError(absl::StrCat("authentication with ", peer_, " failed: ", why));
  }

  const int fd_;
  const std::string peer_;
  const absl::Time deadline_;
};

// What a dial waiting on the io_context learns, kept alive by whichever side ends last.
struct DialOutcome {
  absl::Mutex mu;
  std::optional<absl::StatusOr<AdmittedSocket>> result ABSL_GUARDED_BY(mu);
  absl::Notification done;
};

}  // namespace

absl::StatusOr<AdmittedSocket> AdmitDialed(tcp::socket socket, TlsContext* tls, const std::string& secret,
                                           absl::Time deadline, bool pump) {
  boost::system::error_code ec;
  const tcp::endpoint ep = socket.remote_endpoint(ec);
  const std::string peer = ec ? "unknown peer" : JoinHostPort(ep.address().to_string(), ep.port());
  if (tls == nullptr) {
    if (!secret.empty()) {
      Handshake hs(Handshake::Role::kClient, secret, "rpc");
      absl::Status s = BlockingExchange(socket.native_handle(), peer, deadline).Run(hs);
      if (!s.ok()) return s;
    }
    AdmittedSocket admitted;
    admitted.plain = std::make_unique<tcp::socket>(std::move(socket));
    return admitted;
  }
  auto& io = static_cast<asio::io_context&>(socket.get_executor().context());
  const absl::Duration timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
  auto outcome = std::make_shared<DialOutcome>();
  Admit(std::move(socket), Side::kDialer, tls, secret, timeout, [outcome](absl::StatusOr<AdmittedSocket> r) {
    absl::MutexLock lock(&outcome->mu);
    outcome->result = std::move(r);
    outcome->done.Notify();
  });
  std::thread helper;
  if (pump) {  // this thread is one of io's: another runs it while this one waits
    helper = std::thread([&io, outcome] {
      while (!outcome->done.HasBeenNotified() && !io.stopped()) io.run_one_for(std::chrono::milliseconds(20));
    });
  }
  // The admission's own timer ends it by `timeout`; the margin covers a stopped io_context.
  const bool finished = outcome->done.WaitForNotificationWithTimeout(timeout + absl::Seconds(1));
  if (helper.joinable()) helper.join();
  absl::MutexLock lock(&outcome->mu);
  if (!finished || !outcome->result) {
    return absl::UnavailableError(absl::StrCat("TLS handshake with ", peer, " did not finish: the transport is shutting down"));
  }
  return std::move(*outcome->result);
}

absl::StatusOr<std::unique_ptr<TlsContext>> TlsContext::Make(const TlsOptions& tls) {
  std::unique_ptr<TlsContext> t(new TlsContext());
  asio::ssl::context& c = t->context_;
  c.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  auto check = [&](const char* what, const std::string& file) -> absl::Status {
    if (!ec) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("TLS ", what, " '", file, "' does not load: ", ec.message()));
  };
  c.use_certificate_chain_file(tls.cert_file, ec);
  if (absl::Status s = check("certificate", tls.cert_file); !s.ok()) return s;
  c.use_private_key_file(tls.key_file, asio::ssl::context::pem, ec);
  if (absl::Status s = check("key", tls.key_file); !s.ok()) return s;
  c.load_verify_file(tls.ca_file, ec);
  if (absl::Status s = check("CA", tls.ca_file); !s.ok()) return s;
  c.set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert, ec);
  if (absl::Status s = check("verify mode for", tls.ca_file); !s.ok()) return s;
  return t;
}

void Admit(tcp::socket socket, Side side, TlsContext* tls, const std::string& secret, absl::Duration timeout,
           std::function<void(absl::StatusOr<AdmittedSocket>)> done) {
  if (tls == nullptr && secret.empty()) {
    AdmittedSocket admitted;
    admitted.plain = std::make_unique<tcp::socket>(std::move(socket));
    return done(std::move(admitted));
  }
  std::make_shared<Admission>(std::move(socket), side, tls, secret, timeout, std::move(done))->Start();
}


}  // namespace gw::rpc::internal
