#include "transport/tcp/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "security/connection_rate.h"
#include "security/refusal_log.h"
#include "transport/host_address.h"
#include "transport/tcp/admission.h"
#include "transport/tcp/stream_connection.h"
#include "transport/tcp/tls_connection.h"

namespace gw::rpc {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr int kMaxIov = 64;
constexpr size_t kCoalesceBytes = 16 << 10;  // larger frames are written at once

absl::StatusOr<tcp::endpoint> ParseAddress(const std::string& address) {
  absl::StatusOr<internal::HostPort> hp = internal::SplitHostPort(address);
  if (!hp.ok()) return hp.status();
  boost::system::error_code ec;
  asio::ip::address ip = asio::ip::make_address(hp->host == "localhost" ? "127.0.0.1" : hp->host, ec);
  if (ec) {
    asio::io_context io;
    tcp::resolver resolver(io);
    auto results = resolver.resolve(hp->host, std::to_string(hp->port), ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot resolve host '", hp->host, "': ", ec.message()));
    }
    return results.begin()->endpoint();
  }
  return tcp::endpoint(ip, static_cast<uint16_t>(hp->port));
}

std::string EndpointString(const tcp::endpoint& ep) {
  return internal::JoinHostPort(ep.address().to_string(), ep.port());
}

// A connection over a plain socket: frames leave by gather-writes (sendmsg) straight from
// the caller's tensors, on the caller's thread while the socket takes them; the I/O thread
// finishes what it did not take (stream_connection.h: reads and the close).
class TcpConnection final : public internal::StreamConnection<TcpConnection, tcp::socket> {
 public:
  TcpConnection(tcp::socket socket, ConnectionCallbacks callbacks, FrameLimits limits)
      : StreamConnection(std::make_unique<tcp::socket>(std::move(socket)), std::move(callbacks), limits) {
    boost::system::error_code ec;
    this->socket().non_blocking(true, ec);
    fd_ = this->socket().native_handle();
  }

  void Send(Message message, std::function<void(absl::Status)> on_sent) override {
    absl::StatusOr<EncodedFrame> frame = EncodeFrame(message, limits_);
    if (!frame.ok()) {
      if (on_sent) on_sent(frame.status());
      return;
    }
    std::deque<Pending> frames;
    frames.push_back(Pending{std::move(*frame), 0, std::move(on_sent)});
    Write(std::move(frames));
  }

  void SendCoalesced(Message message, std::function<void(absl::Status)> on_sent) override {
    absl::StatusOr<EncodedFrame> frame = EncodeFrame(message, limits_);
    if (!frame.ok()) {
      if (on_sent) on_sent(frame.status());
      return;
    }
    if (frame->total_bytes() > kCoalesceBytes) {
      std::deque<Pending> frames;
      frames.push_back(Pending{std::move(*frame), 0, std::move(on_sent)});
      Write(std::move(frames));
      return;
    }
    absl::Status closed;
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        frame->Snapshot();
        queue_.push_back(Pending{std::move(*frame), 0, std::move(on_sent)});
        if (!io_writing_) {
          io_writing_ = true;
          asio::post(strand_, [self = shared_from_this()] { self->OnWritable({}); });
        }
        return;
      }
      closed = close_reason_;
    }
    if (on_sent) on_sent(closed);
  }

  void SendMany(std::vector<Message> messages) override {
    std::deque<Pending> frames;
    for (Message& m : messages) {
      absl::StatusOr<EncodedFrame> frame = EncodeFrame(m, limits_);
      if (frame.ok()) frames.push_back(Pending{std::move(*frame), 0, nullptr});
    }
    if (!frames.empty()) Write(std::move(frames));
  }

 private:
  friend StreamConnection;

  struct Pending {
    EncodedFrame frame;
    size_t offset;  // bytes of the frame already written
    std::function<void(absl::Status)> on_sent;
  };
  enum class WriteResult { kDone, kBlocked, kError };

  // Writes frames in order, as one gather-write per syscall (several frames per
  // sendmsg when they are queued together), on the calling thread when nothing is queued.
  void Write(std::deque<Pending> frames) {
    std::vector<std::function<void(absl::Status)>> done;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) {
        result = close_reason_;
      } else if (io_writing_ || !queue_.empty()) {
        for (Pending& w : frames) {
          w.frame.Snapshot();  // written later by the I/O thread
          queue_.push_back(std::move(w));
        }
        return;
      } else {
        switch (TryWrite(frames, done)) {
          case WriteResult::kDone:
            break;
          case WriteResult::kBlocked:
            if (!strand_.running_in_this_thread()) {
              // Finish the frames on this thread, so that every byte has left the
              // caller's tensors when Send returns (they may be modified right after).
              result = WriteBlocking(frames, done);
              break;
            }
            // On the I/O thread we must not block (the peer may be sending to us too):
            // keep private copies and let the I/O thread finish.
            for (Pending& w : frames) {
              w.frame.Snapshot();
              queue_.push_back(std::move(w));
            }
            frames.clear();
            io_writing_ = true;
            asio::post(strand_, [self = shared_from_this()] { self->WaitWritable(); });
            break;
          case WriteResult::kError:
            result = absl::UnavailableError(absl::StrCat("send to ", peer_, " failed: ",
                                                         std::strerror(errno)));
            break;
        }
        if (!result.ok()) Close(result);
      }
    }
    for (auto& cb : done) {
      if (cb) cb(absl::OkStatus());
    }
    for (Pending& w : frames) {
      if (w.on_sent) w.on_sent(result);
    }
  }

  // Writes as much of `frames` (front first) as the socket takes without blocking;
  // completed frames leave the deque and their on_sent moves to `done`.
  WriteResult TryWrite(std::deque<Pending>& frames, std::vector<std::function<void(absl::Status)>>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!frames.empty()) {
      iovec iov[kMaxIov];
      int n = 0;
      for (Pending& w : frames) {
        size_t skip = w.offset;
        auto add = [&](const char* p, size_t len) {
          if (n == kMaxIov || len == 0) return;
          if (skip >= len) {
            skip -= len;
            return;
          }
          iov[n++] = {const_cast<char*>(p + skip), len - skip};
          skip = 0;
        };
        add(w.frame.prefix.data(), w.frame.prefix.size());
        for (const auto& s : w.frame.spans) add(s.data(), s.size());
        if (n == kMaxIov) break;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      const ssize_t sent = n == 0 ? 0 : ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return WriteResult::kBlocked;
        return WriteResult::kError;
      }
      size_t left = static_cast<size_t>(sent);
      while (!frames.empty()) {
        Pending& w = frames.front();
        const size_t take = std::min(left, w.frame.total_bytes() - w.offset);
        w.offset += take;
        left -= take;
        if (w.offset < w.frame.total_bytes()) break;
        done.push_back(std::move(w.on_sent));
        frames.pop_front();
      }
    }
    return WriteResult::kDone;
  }

  // Writes the rest of `frames`, waiting for the socket to drain (bounded by
  // kSendTimeout, and abandoned when the connection is being closed).
  absl::Status WriteBlocking(std::deque<Pending>& frames, std::vector<std::function<void(absl::Status)>>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time deadline = absl::Now() + kSendTimeout;
    while (true) {
      pollfd pfd{fd_, POLLOUT, 0};
      const int r = ::poll(&pfd, 1, 100);
      if (closing_.load(std::memory_order_acquire)) return absl::CancelledError("connection closing");
      if (r < 0 && errno != EINTR) break;
      if (r > 0) {
        const WriteResult wr = TryWrite(frames, done);
        if (wr == WriteResult::kDone) return absl::OkStatus();
        if (wr == WriteResult::kError) break;
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("send to ", peer_, " made no progress for ",
                                                        absl::FormatDuration(kSendTimeout)));
      }
    }
    return absl::UnavailableError(absl::StrCat("send to ", peer_, " failed: ", std::strerror(errno)));
  }

  // On the strand: waits until the socket is writable, then drains the queue.
  void WaitWritable() {
    socket().async_wait(tcp::socket::wait_write,
                        asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec) {
                          self->OnWritable(ec);
                        }));
  }

  void OnWritable(const boost::system::error_code& ec) {
    std::vector<std::function<void(absl::Status)>> done;
    bool again = false;
    absl::Status error;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      if (ec) {
        error = absl::UnavailableError(absl::StrCat("send to ", peer_, " failed: ", ec.message()));
      } else {
        const WriteResult r = TryWrite(queue_, done);
        if (r == WriteResult::kBlocked) {
          again = true;
        } else if (r == WriteResult::kError) {
          error = absl::UnavailableError(absl::StrCat("send to ", peer_, " failed: ", std::strerror(errno)));
        }
        io_writing_ = again;
      }
    }
    for (auto& cb : done) {
      if (cb) cb(absl::OkStatus());
    }
    if (!error.ok()) {
      CloseOnStrand(error);
    } else if (again) {
      WaitWritable();
    }
  }

  // StreamConnection's close: the frames not written yet fail with its reason.
  std::vector<std::function<void(absl::Status)>> TakeUnsent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::function<void(absl::Status)>> unsent;
    for (Pending& w : queue_) unsent.push_back(std::move(w.on_sent));
    queue_.clear();
    return unsent;
  }

  int fd_ = -1;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool io_writing_ ABSL_GUARDED_BY(mu_) = false;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(TransportOptions options, std::unique_ptr<internal::TlsContext> tls)
      : options_(options), secret_(options.security.authenticates() ? options.security.secret : ""),
        tls_(std::move(tls)), rate_(options.security.limits.max_connections_per_second),
        work_(asio::make_work_guard(io_)), acceptor_(io_) {
    for (int i = 0; i < std::max(1, options_.io_threads); ++i) {
      threads_.emplace_back([this] {
        t_io_of_ = this;
        io_.run();
      });
    }
  }
  ~TcpTransport() override { Shutdown(); }

  std::string name() const override { return "tcp"; }

  absl::StatusOr<std::string> Listen(const std::string& host, const std::string& advertise_host,
                                     ConnectionCallbacks callbacks) override {
    absl::StatusOr<tcp::endpoint> ep = ParseAddress(internal::JoinHostPort(host, 0));
    if (!ep.ok()) return ep.status();
    boost::system::error_code ec;
    acceptor_.open(ep->protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(*ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ": ", ec.message()));
    accept_callbacks_ = std::move(callbacks);
    Accept();
    return internal::JoinHostPort(advertise_host.empty() ? host : advertise_host, acceptor_.local_endpoint().port());
  }

  absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address,
                                                      ConnectionCallbacks callbacks,
                                                      absl::Time deadline) override {
    absl::StatusOr<tcp::endpoint> ep = ParseAddress(address);
    if (!ep.ok()) return ep.status();
    std::string last_error = "deadline passed";
    while (true) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      socket.open(ep->protocol(), ec);
      if (ec) return absl::UnavailableError(absl::StrCat("cannot create a socket: ", ec.message()));
      socket.non_blocking(true, ec);
      socket.connect(*ep, ec);
      if (ec == asio::error::would_block || ec == asio::error::in_progress) {
        pollfd pfd{socket.native_handle(), POLLOUT, 0};
        const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
        const int r = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
        if (r <= 0) {
          ec = asio::error::timed_out;
        } else {
          int err = 0;
          socklen_t len = sizeof(err);
          ::getsockopt(socket.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
          ec = boost::system::error_code(err, boost::system::system_category());
        }
      }
      if (!ec) return AdmitDialed(std::move(socket), std::move(callbacks), deadline);
      last_error = ec.message();
      if (absl::Now() + absl::Milliseconds(20) >= deadline) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address, ": ", last_error));
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    asio::post(io_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      accept_retry_.cancel();
    });
    std::vector<std::weak_ptr<Connection>> conns;
    {
      absl::MutexLock lock(&mu_);
      conns.swap(connections_);
    }
    for (auto& w : conns) {
      if (auto c = w.lock()) c->Close(absl::CancelledError("transport shut down"));
    }
    // Closing every socket completes every pending operation, so run() runs out of work;
    // stop() bounds that in case a connection was not tracked.
    work_.reset();
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (!io_.stopped() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    io_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;  // closed
      if (ec) {  // e.g. out of file descriptors: try again shortly, never stop listening
        refusals_.Refused("this listener", absl::ResourceExhaustedError(absl::StrCat("accept failed: ", ec.message())));
        accept_retry_.expires_after(std::chrono::milliseconds(100));
        accept_retry_.async_wait([this](const boost::system::error_code& e) {
          if (!e) Accept();
        });
        return;
      }
      Admit(std::move(socket));
      Accept();
    });
  }

  // The listening side of a new connection: refused past the connection rate of its
  // address or the handshakes in progress, else admitted (admission.h) on the I/O thread.
  void Admit(tcp::socket socket) {
    boost::system::error_code ignored;
    const tcp::endpoint from = socket.remote_endpoint(ignored);
    if (!rate_.Take(from.address().to_string(), absl::Now())) {
      refusals_.Refused(EndpointString(from),
                        absl::ResourceExhaustedError(absl::StrCat(
                            "more than ", options_.security.limits.max_connections_per_second,
                            " new connections per second from its address (PeerLimits::max_connections_per_second)")));
      return;  // the socket closes as it goes
    }
    if (admitting_.fetch_add(1) >= kMaxAdmitting) {
      admitting_.fetch_sub(1);
      refusals_.Refused(EndpointString(from), absl::ResourceExhaustedError(absl::StrCat(
                                                  kMaxAdmitting, " connections are already in their handshake")));
      return;
    }
    internal::Admit(std::move(socket), internal::Side::kListener, tls_.get(), secret_,
                    options_.security.handshake_timeout,
                    [this, from](absl::StatusOr<internal::AdmittedSocket> admitted) {
                      admitting_.fetch_sub(1);
                      if (!admitted.ok()) return refusals_.Refused(EndpointString(from), admitted.status());
                      Open(*std::move(admitted), accept_callbacks_);
                    });
  }

  // A connection from an admitted socket: plain TCP, or TLS.
  std::shared_ptr<Connection> Open(internal::AdmittedSocket admitted, ConnectionCallbacks callbacks) {
    std::shared_ptr<Connection> conn;
    if (admitted.tls != nullptr) {
      conn = internal::StartTlsConnection(std::move(admitted.tls), std::move(callbacks), options_.limits);
    } else {
      auto tcp = std::make_shared<TcpConnection>(std::move(*admitted.plain), std::move(callbacks), options_.limits);
      tcp->Start();
      conn = tcp;
    }
    Track(conn);
    return conn;
  }

  // Runs the dialing side's handshakes, on this thread (admission.h).
  absl::StatusOr<std::shared_ptr<Connection>> AdmitDialed(tcp::socket socket, ConnectionCallbacks callbacks,
                                                          absl::Time deadline) {
    const absl::Time by = std::min(deadline, absl::Now() + options_.security.handshake_timeout);
    absl::StatusOr<internal::AdmittedSocket> admitted =
        internal::AdmitDialed(std::move(socket), tls_.get(), secret_, by, /*pump=*/t_io_of_ == this);
    if (!admitted.ok()) return admitted.status();
    return Open(*std::move(admitted), std::move(callbacks));
  }



  void Track(const std::shared_ptr<Connection>& c) {
    {
      absl::MutexLock lock(&mu_);
      if (!shut_down_) {
        std::erase_if(connections_, [](const auto& w) { return w.expired(); });
        connections_.push_back(c);
        return;
      }
    }
    c->Close(absl::CancelledError("transport shut down"));  // admitted while it shut down
  }

  // The transport whose I/O thread this is (null on other threads).
  static thread_local const TcpTransport* t_io_of_;

  const TransportOptions options_;
  const std::string secret_;  // empty: no challenge-response
  const std::unique_ptr<internal::TlsContext> tls_;  // null: no TLS
  internal::ConnectionRate rate_;
  internal::RefusalLog refusals_{"a connection"};
  // Accepted connections still in their handshakes; past kMaxAdmitting new ones are closed.
  static constexpr int kMaxAdmitting = 256;
  std::atomic<int> admitting_{0};
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_{io_};
  ConnectionCallbacks accept_callbacks_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::vector<std::weak_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

thread_local const TcpTransport* TcpTransport::t_io_of_ = nullptr;

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeTcpTransport(TransportOptions options) {
  std::unique_ptr<internal::TlsContext> tls;
  if (options.security.tls.enabled()) {
    if (absl::Status s = options.security.Validate(); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<internal::TlsContext>> made = internal::TlsContext::Make(options.security.tls);
    if (!made.ok()) return made.status();
    tls = *std::move(made);
  }
  return std::make_unique<TcpTransport>(options, std::move(tls));
}

}  // namespace gw::rpc
