// Internal: StreamConnection<Derived, Stream>, what the tcp transport's two connections
// share (the plain socket's, tcp_transport.cc, and the TLS stream's, tls_connection.cc):
// the strand every read and close runs on, the read loop that feeds the frame decoder,
// and one sticky close.
//
// Contract
//   - Derived (CRTP) is `final` and owns the write side: Send and friends, under mu_,
//     checking closed_ (and answering close_reason_ when set). It provides
//       std::vector<std::function<void(absl::Status)>> TakeUnsent()
//           ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
//     the completions of every frame not yet written, which the close fails with its
//     reason after the socket closed.
//   - Start() begins reading on the strand. A read of a frame payload with at least
//     kDirectReadBytes still to come goes straight into the message's tensors
//     (FrameDecoder::NextBuffer); smaller reads go through a 64 KiB staging buffer. Each
//     complete message goes to on_message on the strand; on_flush follows the messages
//     of one read (the dispatcher's batching boundary).
//   - The first close wins, and its reason sticks: Close(reason) (any thread) and every
//     failure on the strand (a read error: UNAVAILABLE "was closed by the peer" at EOF,
//     "failed: ..." otherwise; a malformed frame: DATA_LOSS naming the peer; a write error,
//     reported by Derived through CloseOnStrand) close once: closed() turns true, the
//     socket is shut down and closed, the unsent frames' completions and on_close run with
//     that reason, on the strand.
//   - closing_ turns true as soon as a close is asked for (before it runs on the strand),
//     so that a sender blocked in a write lets go of mu_.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_TCP_STREAM_CONNECTION_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_TCP_STREAM_CONNECTION_H_

#include <utility>  // before Asio: its awaitable.hpp uses std::exchange without it

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/rpc/frame.h"
#include "gradwire/rpc/transport.h"
#include "transport/host_address.h"

namespace gw::rpc::internal {

template <typename Derived, typename Stream>
class StreamConnection : public Connection, public std::enable_shared_from_this<Derived> {
 public:
  static constexpr size_t kStagingBytes = 64 << 10;
  static constexpr size_t kDirectReadBytes = 64 << 10;
  static constexpr absl::Duration kSendTimeout = absl::Seconds(60);  // a send that makes no progress

  void Start() {
    boost::asio::post(strand_, [self = this->shared_from_this()] { self->ReadMore(); });
  }

  void Close(absl::Status reason) override {
    closing_.store(true, std::memory_order_release);
    boost::asio::post(strand_,
                      [self = this->shared_from_this(), reason = std::move(reason)] { self->CloseOnStrand(reason); });
  }

  std::string peer() const override { return peer_; }
  bool closed() const override { return closed_flag_.load(std::memory_order_acquire); }

 protected:
  using Strand = boost::asio::strand<boost::asio::any_io_executor>;

  StreamConnection(std::unique_ptr<Stream> stream, ConnectionCallbacks callbacks, FrameLimits limits)
      : stream_(std::move(stream)),
        strand_(boost::asio::make_strand(stream_->get_executor())),
        callbacks_(std::move(callbacks)),
        limits_(limits),
        decoder_(limits),
        staging_(kStagingBytes) {
    boost::system::error_code ec;
    socket().set_option(boost::asio::ip::tcp::no_delay(true), ec);
    const boost::asio::ip::tcp::endpoint ep = socket().remote_endpoint(ec);
    peer_ = ec ? "unknown peer" : JoinHostPort(ep.address().to_string(), ep.port());
  }

  Stream& stream() { return *stream_; }
  // The TCP socket under the stream (the stream itself for a plain socket).
  typename Stream::lowest_layer_type& socket() { return stream_->lowest_layer(); }

  // On the strand (any failure of the connection, or Close's post).
  void CloseOnStrand(const absl::Status& reason) {
    closing_.store(true, std::memory_order_release);  // a blocked sender lets go of mu_
    std::vector<std::function<void(absl::Status)>> unsent;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
      closed_flag_.store(true, std::memory_order_release);
      close_reason_ = reason;
      unsent = static_cast<Derived*>(this)->TakeUnsent();
    }
    boost::system::error_code ignored;
    socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
    socket().close(ignored);
    for (auto& done : unsent) {
      if (done) done(reason);
    }
    if (callbacks_.on_close) callbacks_.on_close(this->shared_from_this(), reason);
  }

  const std::unique_ptr<Stream> stream_;
  Strand strand_;
  const ConnectionCallbacks callbacks_;
  const FrameLimits limits_;
  std::string peer_;  // set once, in the constructor

  std::atomic<bool> closing_{false};
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_reason_ ABSL_GUARDED_BY(mu_);  // the first close's

 private:
  void ReadMore() {
    if (closed()) return;
    auto self = this->shared_from_this();
    const bool direct = decoder_.payload_remaining() >= kDirectReadBytes;
    const absl::Span<char> dst = direct ? decoder_.NextBuffer() : absl::Span<char>(staging_.data(), staging_.size());
    stream_->async_read_some(
        boost::asio::buffer(dst.data(), dst.size()),
        boost::asio::bind_executor(
            strand_, [self, direct](const boost::system::error_code& ec, size_t n) { self->OnRead(ec, n, direct); }));
  }

  void OnRead(const boost::system::error_code& ec, size_t n, bool direct) {
    if (ec) {
      if (ec == boost::asio::error::operation_aborted) return;
      const bool eof = ec == boost::asio::error::eof || ec == boost::asio::ssl::error::stream_truncated;
      CloseOnStrand(absl::UnavailableError(eof ? absl::StrCat("connection to ", peer_, " was closed by the peer")
                                               : absl::StrCat("connection to ", peer_, " failed: ", ec.message())));
      return;
    }
    absl::Status status;
    if (direct) {
      status = decoder_.Advance(n);
      if (status.ok()) DeliverIfReady();
    } else {
      size_t used = 0;
      while (status.ok() && used < n) {
        absl::StatusOr<size_t> c = decoder_.Consume(absl::Span<const char>(staging_.data() + used, n - used));
        if (!c.ok()) {
          status = c.status();
          break;
        }
        used += *c;
        DeliverIfReady();
      }
    }
    if (delivered_ && callbacks_.on_flush) callbacks_.on_flush(this->shared_from_this());
    delivered_ = false;
    if (!status.ok()) {
      CloseOnStrand(absl::DataLossError(absl::StrCat("closing the connection to ", peer_, ": ", status.message())));
      return;
    }
    ReadMore();
  }

  void DeliverIfReady() {
    if (!decoder_.HasMessage()) return;
    Message m = decoder_.TakeMessage();  // always: the decoder waits for it before reading on
    if (callbacks_.on_message && !closed()) {
      callbacks_.on_message(this->shared_from_this(), std::move(m));
      delivered_ = true;
    }
  }

  // Strand only.
  FrameDecoder decoder_;
  std::vector<char> staging_;
  bool delivered_ = false;  // on_message ran since the last on_flush

  std::atomic<bool> closed_flag_{false};  // closed_, for closed() without the lock (asked per send)
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_TCP_STREAM_CONNECTION_H_
