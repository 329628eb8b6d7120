#include "transport/tcp/tls_connection.h"

#include <atomic>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "host_address.h"

namespace gw::rpc::internal {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kStagingBytes = 64 << 10;
constexpr size_t kMaxBuffered = 64 << 20;  // senders wait while more is buffered
constexpr absl::Duration kSendTimeout = absl::Seconds(60);

class TlsConnection final : public Connection, public std::enable_shared_from_this<TlsConnection> {
 public:
  TlsConnection(std::unique_ptr<SslStream> stream, ConnectionCallbacks callbacks, FrameLimits limits)
      : stream_(std::move(stream)), strand_(asio::make_strand(stream_->get_executor())),
        callbacks_(std::move(callbacks)), limits_(limits), decoder_(limits), staging_(kStagingBytes) {
    boost::system::error_code ec;
    stream_->next_layer().set_option(tcp::no_delay(true), ec);
    const tcp::endpoint ep = stream_->next_layer().remote_endpoint(ec);
    peer_ = ec ? "unknown peer" : JoinHostPort(ep.address().to_string(), ep.port());
  }

  void Start() {
    asio::post(strand_, [self = shared_from_this()] { self->ReadMore(); });
  }

  void Send(Message message, std::function<void(absl::Status)> on_sent) override {
    absl::StatusOr<EncodedFrame> frame = EncodeFrame(message, limits_);
    if (!frame.ok()) {
      if (on_sent) on_sent(frame.status());
      return;
    }
    absl::Status closed;
    {
      absl::MutexLock lock(&mu_);
      if (!strand_.running_in_this_thread() && !closed_ && pending_.size() > kMaxBuffered) {
        // Backpressure, as the plain connection's blocking write gives it: wait for the
        // I/O thread to drain what is buffered (never on the I/O thread itself).
        auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || pending_.size() <= kMaxBuffered; };
        if (!mu_.AwaitWithTimeout(absl::Condition(&room), kSendTimeout)) {
          mu_.Unlock();
          Close(absl::DeadlineExceededError(absl::StrCat("send to ", peer_, " made no progress for ",
                                                         absl::FormatDuration(kSendTimeout))));
          mu_.Lock();
        }
      }
      if (!closed_) {
        pending_.append(frame->prefix);
        for (const auto& s : frame->spans) pending_.append(s.data(), s.size());
        if (on_sent) pending_done_.push_back(std::move(on_sent));
        if (!writing_) {
          writing_ = true;
          asio::post(strand_, [self = shared_from_this()] { self->WriteNext(); });
        }
        return;
      }
      closed = close_reason_;
    }
    if (on_sent) on_sent(closed);
  }

  void Close(absl::Status reason) override {
    asio::post(strand_, [self = shared_from_this(), reason] { self->CloseOnStrand(reason); });
  }

  std::string peer() const override { return peer_; }
  bool closed() const override { return closed_flag_.load(std::memory_order_acquire); }

 private:
  // On the strand: writes everything buffered since the last write.
  void WriteNext() {
    {
      absl::MutexLock lock(&mu_);
      if (closed_ || pending_.empty()) {
        writing_ = false;
        return;
      }
      writing_buf_.swap(pending_);
      pending_.clear();
      writing_done_.swap(pending_done_);
    }
    asio::async_write(*stream_, asio::buffer(writing_buf_),
                      asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        std::vector<std::function<void(absl::Status)>> done;
                        done.swap(self->writing_done_);
                        self->writing_buf_.clear();
                        absl::Status status;
                        if (ec) {
                          absl::MutexLock lock(&self->mu_);  // closed meanwhile: the close's reason
                          status = self->closed_ ? self->close_reason_
                                                 : absl::UnavailableError(absl::StrCat("send to ", self->peer_,
                                                                                       " failed: ", ec.message()));
                        }
                        for (auto& cb : done) cb(status);
                        if (!status.ok()) return self->CloseOnStrand(status);
                        self->WriteNext();
                      }));
  }

  void ReadMore() {
    if (closed()) return;
    stream_->async_read_some(asio::buffer(staging_),
                             asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec,
                                                                                      size_t n) { self->OnRead(ec, n); }));
  }

  void OnRead(const boost::system::error_code& ec, size_t n) {
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      const bool eof = ec == asio::error::eof || ec == asio::ssl::error::stream_truncated;
      CloseOnStrand(absl::UnavailableError(eof ? absl::StrCat("connection to ", peer_, " was closed by the peer")
                                               : absl::StrCat("connection to ", peer_, " failed: ", ec.message())));
      return;
    }
    absl::Span<const char> data(staging_.data(), n);
    bool delivered = false;
    while (!data.empty()) {
      absl::StatusOr<size_t> used = decoder_.Consume(data);
      if (!used.ok()) {
        CloseOnStrand(absl::DataLossError(absl::StrCat("closing the connection to ", peer_, ": ", used.status().message())));
        return;
      }
      data.remove_prefix(*used);
      if (!decoder_.HasMessage()) continue;
      Message m = decoder_.TakeMessage();  // always: the decoder waits for it before reading on
      if (callbacks_.on_message && !closed()) {
        callbacks_.on_message(shared_from_this(), std::move(m));
        delivered = true;
      }
    }
    if (delivered && callbacks_.on_flush) callbacks_.on_flush(shared_from_this());
    ReadMore();
  }

  void CloseOnStrand(const absl::Status& reason) {
    std::vector<std::function<void(absl::Status)>> failed;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
      closed_flag_.store(true, std::memory_order_release);
      close_reason_ = reason;
      failed.swap(pending_done_);
      pending_.clear();
    }
    boost::system::error_code ignored;
    stream_->next_layer().shutdown(tcp::socket::shutdown_both, ignored);
    stream_->next_layer().close(ignored);
    for (auto& cb : failed) cb(reason);
    if (callbacks_.on_close) callbacks_.on_close(shared_from_this(), reason);
  }

  std::unique_ptr<SslStream> stream_;
  asio::strand<asio::any_io_executor> strand_;
  const ConnectionCallbacks callbacks_;
  const FrameLimits limits_;
  std::string peer_;

  // Strand only.
  FrameDecoder decoder_;
  std::vector<char> staging_;
  std::string writing_buf_;
  std::vector<std::function<void(absl::Status)>> writing_done_;

  absl::Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(absl::Status)>> pending_done_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> closed_flag_{false};
  absl::Status close_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<Connection> StartTlsConnection(std::unique_ptr<SslStream> stream, ConnectionCallbacks callbacks,
                                               FrameLimits limits) {
  auto c = std::make_shared<TlsConnection>(std::move(stream), std::move(callbacks), limits);
  c->Start();
  return c;
}

}  // namespace gw::rpc::internal
