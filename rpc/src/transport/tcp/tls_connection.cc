#include "transport/tcp/tls_connection.h"

#include <atomic>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "transport/tcp/stream_connection.h"

namespace gw::rpc::internal {
namespace {

namespace asio = boost::asio;

constexpr size_t kMaxBuffered = 64 << 20;  // senders wait while more is buffered

class TlsConnection final : public StreamConnection<TlsConnection, SslStream> {
 public:
  TlsConnection(std::unique_ptr<SslStream> stream, ConnectionCallbacks callbacks, FrameLimits limits)
      : StreamConnection(std::move(stream), std::move(callbacks), limits) {}

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

 private:
  friend StreamConnection;

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
    asio::async_write(stream(), asio::buffer(writing_buf_),
                      asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec,
                                                                               size_t) {
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

  // StreamConnection's close: what is buffered and not written yet fails with its reason.
  std::vector<std::function<void(absl::Status)>> TakeUnsent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::function<void(absl::Status)>> unsent;
    unsent.swap(pending_done_);
    pending_.clear();
    return unsent;
  }

  // Strand only.
  std::string writing_buf_;
  std::vector<std::function<void(absl::Status)>> writing_done_;

  std::string pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(absl::Status)>> pending_done_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::shared_ptr<Connection> StartTlsConnection(std::unique_ptr<SslStream> stream, ConnectionCallbacks callbacks,
                                               FrameLimits limits) {
  auto c = std::make_shared<TlsConnection>(std::move(stream), std::move(callbacks), limits);
  c->Start();
  return c;
}

}  // namespace gw::rpc::internal
