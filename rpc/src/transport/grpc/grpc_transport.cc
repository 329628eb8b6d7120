#include "transport/grpc/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gradwire/proto/transport.grpc.pb.h"
#include "security/connection_rate.h"
#include "security/grpc_credentials.h"
#include "security/handshake.h"
#include "security/refusal_log.h"
#include "transport/host_address.h"

namespace gw::rpc {
namespace {

namespace pb = ::gradwire::proto;

// gRPC's limits leave room for the chunk's protobuf framing.
constexpr int kMaxGrpcMessageBytes = static_cast<int>(2 * kGrpcChunkBytes);

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  return absl::ToChronoTime(std::clamp(t, absl::Now(), absl::Now() + absl::Hours(24 * 365)));
}

// gRPC names peers "ipv4:127.0.0.1:5000" or "ipv6:[::1]:5000" (possibly %-escaped);
// gradwire names them "host:port".
std::string PeerFromGrpc(const std::string& grpc_peer) {
  std::string peer = grpc_peer;
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (absl::StartsWith(peer, scheme)) {
      peer = peer.substr(5);
      break;
    }
  }
  return absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}});
}

// The job secret's challenge-response (handshake.h) as the first chunks of a Stream call,
// before any frame: `read` and `write` move one chunk; `cancel` ends the call, which a
// watchdog does when the peer has not answered within `timeout`.
absl::Status RunHandshake(internal::Handshake::Role role, const std::string& secret, absl::Duration timeout,
                          const std::string& peer, const std::function<bool(pb::FrameChunk*)>& read,
                          const std::function<bool(const pb::FrameChunk&)>& write,
                          const std::function<void()>& cancel) {
  internal::Handshake hs(role, secret, "rpc");
  absl::Notification finished;
  bool timed_out = false;
  std::thread watchdog([&] {
    if (!finished.WaitForNotificationWithTimeout(timeout)) {
      timed_out = true;
      cancel();
    }
  });
  absl::Status status;
  pb::FrameChunk chunk;
  while (true) {
    if (std::string out = hs.TakeOutput(); !out.empty()) {
      chunk.set_data(std::move(out));
      if (!write(chunk) && status.ok()) status = absl::UnavailableError("the stream closed");
    }
    if (!status.ok() || hs.wanted() == 0) break;
    if (!read(&chunk)) {
      status = absl::UnavailableError("the stream closed (the peer refused our proof, or does not authenticate)");
      break;
    }
    if (chunk.data().size() != hs.wanted()) {
      status = absl::UnauthenticatedError(
          absl::StrCat("the peer's message of ", chunk.data().size(), " bytes is not the handshake's next ",
                       hs.wanted(), ": it does not authenticate (no job secret?)"));
      break;
    }
    status = hs.OnInput(chunk.data());  // a refusing server still sends its verdict above
  }
  finished.Notify();
  watchdog.join();
  if (timed_out) {
    status = absl::DeadlineExceededError(absl::StrCat("no answer within ", absl::FormatDuration(timeout),
                                                      " (Security::handshake_timeout)"));
  }
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("authentication with ", peer, " failed: ", status.message()));
}

// One Connection = one Stream call. The subclasses (dialing / listening side) supply the
// stream operations; this class owns the send queue, the writer thread, the decoder and
// the close protocol.
class GrpcConnection : public Connection, public std::enable_shared_from_this<GrpcConnection> {
 public:
  GrpcConnection(std::string peer, ConnectionCallbacks callbacks, FrameLimits limits)
      : peer_(std::move(peer)), callbacks_(std::move(callbacks)), limits_(limits),
        decoder_(limits) {}

  void Send(Message message, std::function<void(absl::Status)> on_sent) override {
    absl::StatusOr<EncodedFrame> frame = EncodeFrame(message, limits_);
    if (!frame.ok()) {
      if (on_sent) on_sent(frame.status());
      return;
    }
    // The writer thread copies the bytes later: take them now, so that the caller may
    // modify its tensors as soon as Send returns.
    frame->Snapshot();
    absl::Status reason;
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        queue_.push_back(Pending{std::move(*frame), 0, std::move(on_sent)});
        return;
      }
      reason = close_reason_;
    }
    if (on_sent) on_sent(reason);
  }

  void Close(absl::Status reason) override { CloseWith(std::move(reason)); }

  std::string peer() const override { return peer_; }

  bool closed() const override {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  // True once the reader has delivered on_close and every thread of the connection has
  // finished its work (Join() then returns at once).
  bool finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

  // Joins the threads this object started (not the gRPC server thread of a Stream call).
  virtual void Join() = 0;

 protected:
  // Stream operations. ReadChunk and WriteChunk run on the reader and writer thread
  // respectively (concurrently, which gRPC's sync streams allow); CancelCall runs under
  // mu_ and only while call_live_.
  virtual bool ReadChunk(pb::FrameChunk* chunk) = 0;
  virtual bool WriteChunk(const pb::FrameChunk& chunk) = 0;
  virtual void CancelCall() = 0;
  // After the writer has been joined: completes the call (client side).
  virtual void FinishCall() {}

  void StartWriter() {
    writer_ = std::thread([this] { WriterLoop(); });
  }

  // Runs on the reader thread until the stream ends; then closes the connection, joins
  // the writer and reports on_close.
  void ReaderLoop() {
    pb::FrameChunk chunk;
    while (ReadChunk(&chunk)) {
      if (absl::Status s = Deliver(chunk.data()); !s.ok()) {
        CloseWith(absl::DataLossError(
            absl::StrCat("closing the connection to ", peer_, ": ", s.message())));
        break;
      }
      if (closed()) break;
    }
    CloseWith(absl::UnavailableError(
        absl::StrCat("connection to ", peer_, " was closed by the peer")));
    if (writer_.joinable()) writer_.join();
    FinishCall();
    absl::Status reason;
    {
      absl::MutexLock lock(&mu_);
      call_live_ = false;
      reason = close_reason_;
    }
    if (callbacks_.on_close) callbacks_.on_close(shared_from_this(), reason);
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }

  const std::string peer_;

 private:
  struct Pending {
    EncodedFrame frame;
    size_t offset;  // bytes of the frame already put into chunks
    std::function<void(absl::Status)> on_sent;
  };

  // The first reason wins; cancelling the call wakes the reader and the writer.
  void CloseWith(absl::Status reason) {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    close_reason_ = std::move(reason);
    if (call_live_) CancelCall();
  }

  absl::Status Deliver(const std::string& bytes) {
    absl::Span<const char> data(bytes.data(), bytes.size());
    bool delivered = false;
    while (!data.empty()) {
      absl::StatusOr<size_t> used = decoder_.Consume(data);
      if (!used.ok()) return used.status();
      data.remove_prefix(*used);
      if (decoder_.HasMessage()) {
        Message m = decoder_.TakeMessage();
        if (callbacks_.on_message && !closed()) {
          callbacks_.on_message(shared_from_this(), std::move(m));
          delivered = true;
        }
      }
    }
    if (delivered && callbacks_.on_flush) callbacks_.on_flush(shared_from_this());
    return absl::OkStatus();
  }

  bool WriterShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !queue_.empty();
  }

  // Appends up to `room` bytes of p's frame (from p.offset) to out; true when p is done.
  static bool AppendFrameBytes(Pending& p, size_t room, std::string* out) {
    size_t skip = p.offset;
    auto take = [&](const char* data, size_t len) {
      if (room == 0) return;
      if (skip >= len) {
        skip -= len;
        return;
      }
      const size_t n = std::min(len - skip, room);
      out->append(data + skip, n);
      p.offset += n;
      room -= n;
      skip = 0;
    };
    take(p.frame.prefix.data(), p.frame.prefix.size());
    for (const auto& s : p.frame.spans) take(s.data(), s.size());
    return p.offset == p.frame.total_bytes();
  }

  // Packs queued frames into chunks of at most kGrpcChunkBytes and writes them in order;
  // a frame's on_sent runs once the chunk holding its last byte was written.
  void WriterLoop() {
    std::deque<Pending> active;  // taken from queue_, in order; front may be partly sent
    pb::FrameChunk chunk;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (active.empty()) mu_.Await(absl::Condition(this, &GrpcConnection::WriterShouldWake));
        if (closed_) break;
        while (!queue_.empty()) {
          active.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      std::string* data = chunk.mutable_data();
      data->clear();
      std::vector<std::function<void(absl::Status)>> done;
      while (!active.empty() && data->size() < kGrpcChunkBytes) {
        if (!AppendFrameBytes(active.front(), kGrpcChunkBytes - data->size(), data)) break;
        done.push_back(std::move(active.front().on_sent));
        active.pop_front();
      }
      if (!WriteChunk(chunk)) {
        CloseWith(absl::UnavailableError(
            absl::StrCat("send to ", peer_, " failed: the stream was closed")));
        for (auto& cb : done) {
          if (cb) cb(CloseReason());
        }
        break;
      }
      for (auto& cb : done) {
        if (cb) cb(absl::OkStatus());
      }
    }
    // Closed: fail everything not yet written. Send() fails by itself from now on.
    absl::Status reason;
    {
      absl::MutexLock lock(&mu_);
      reason = close_reason_;
      while (!queue_.empty()) {
        active.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    for (auto& p : active) {
      if (p.on_sent) p.on_sent(reason);
    }
  }

  absl::Status CloseReason() const {
    absl::MutexLock lock(&mu_);
    return close_reason_;
  }

  const ConnectionCallbacks callbacks_;
  const FrameLimits limits_;
  FrameDecoder decoder_;  // reader thread only
  std::thread writer_;

 protected:
  mutable absl::Mutex mu_;
  bool call_live_ ABSL_GUARDED_BY(mu_) = true;

 private:
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_reason_ ABSL_GUARDED_BY(mu_);
};

// The dialing side: owns its channel, call and reader thread.
class GrpcClientConnection final : public GrpcConnection {
 public:
  GrpcClientConnection(std::string address, std::shared_ptr<grpc::Channel> channel,
                       ConnectionCallbacks callbacks, FrameLimits limits)
      : GrpcConnection(std::move(address), std::move(callbacks), limits),
        channel_(std::move(channel)), stub_(pb::FrameStream::NewStub(channel_)) {}

  ~GrpcClientConnection() override { Join(); }

  // Opens the stream (sends the call's headers; may block briefly).
  void Open() { stream_ = stub_->Stream(&context_); }

  // The challenge-response, before Start. REQUIRES: Open() was called.
  absl::Status Authenticate(const std::string& secret, absl::Duration timeout) {
    return RunHandshake(
        internal::Handshake::Role::kClient, secret, timeout, peer_,
        [this](pb::FrameChunk* c) { return stream_->Read(c); },
        [this](const pb::FrameChunk& c) { return stream_->Write(c); }, [this] { context_.TryCancel(); });
  }

  // Starts the reader and writer threads. REQUIRES: Open() was called.
  void Start() {
    StartWriter();
    reader_ = std::thread([this] { ReaderLoop(); });
  }

  // Ends an opened stream whose threads were never started.
  void Abandon() {
    context_.TryCancel();
    stream_->Finish().IgnoreError();
    absl::MutexLock lock(&mu_);
    call_live_ = false;
  }

  void Join() override {
    if (reader_.joinable() && reader_.get_id() != std::this_thread::get_id()) reader_.join();
  }

 private:
  bool ReadChunk(pb::FrameChunk* chunk) override { return stream_->Read(chunk); }
  bool WriteChunk(const pb::FrameChunk& chunk) override { return stream_->Write(chunk); }
  void CancelCall() override { context_.TryCancel(); }
  void FinishCall() override { stream_->Finish().IgnoreError(); }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::FrameStream::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::FrameChunk, pb::FrameChunk>> stream_;
  std::thread reader_;
};

// The listening side: lives in the gRPC server thread running the Stream call, which is
// its reader thread; the call's context and stream are valid until Run() returns.
class GrpcServerConnection final : public GrpcConnection {
 public:
  using Stream = grpc::ServerReaderWriter<pb::FrameChunk, pb::FrameChunk>;

  GrpcServerConnection(grpc::ServerContext* context, Stream* stream,
                       ConnectionCallbacks callbacks, FrameLimits limits)
      : GrpcConnection(PeerFromGrpc(context->peer()), std::move(callbacks), limits),
        context_(context), stream_(stream) {}

  // Serves the call until it ends (joins the writer before returning).
  void Run() {
    StartWriter();
    ReaderLoop();
  }

  void Join() override {}

 private:
  bool ReadChunk(pb::FrameChunk* chunk) override { return stream_->Read(chunk); }
  bool WriteChunk(const pb::FrameChunk& chunk) override { return stream_->Write(chunk); }
  void CancelCall() override { context_->TryCancel(); }

  grpc::ServerContext* const context_;
  Stream* const stream_;
};

class GrpcTransport final : public Transport {
 public:
  explicit GrpcTransport(TransportOptions options)
      : options_(options), rate_(options.security.limits.max_connections_per_second), service_(this) {}
  ~GrpcTransport() override { Shutdown(); }

  std::string name() const override { return "grpc"; }

  absl::StatusOr<std::string> Listen(const std::string& host, const std::string& advertise_host,
                                     ConnectionCallbacks callbacks) override {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::FailedPreconditionError("grpc transport is shut down");
    if (server_) return absl::FailedPreconditionError("grpc transport is already listening");
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
        internal::ServerCredentials(options_.security.tls);
    if (!creds.ok()) return creds.status();
    accept_callbacks_ = std::move(callbacks);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(internal::JoinHostPort(host, 0), *creds, &port);
    builder.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
    builder.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (!server_ || port == 0) {
      server_.reset();
      return absl::UnavailableError(absl::StrCat("cannot listen on ", host, " (grpc transport)"));
    }
    return internal::JoinHostPort(advertise_host.empty() ? host : advertise_host, port);
  }

  absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address,
                                                      ConnectionCallbacks callbacks,
                                                      absl::Time deadline) override {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return ShutDownError(address);
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
    // Each Connection gets its own HTTP/2 connection, released with the Connection.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
    args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        internal::ChannelCredentials(options_.security.tls, &args);
    if (!creds.ok()) return creds.status();
    auto channel = grpc::CreateCustomChannel(address, *creds, args);
    if (!channel->WaitForConnected(ToChrono(deadline))) {
      return absl::UnavailableError(absl::StrCat(
          "cannot connect to ", address, ": no gRPC server answered before the deadline",
          options_.security.tls.enabled() ? " (or the TLS handshake failed: is the server's certificate signed by "
                                            "this job's CA, and does it name TlsOptions::server_name?)"
                                          : ""));
    }
    auto conn = std::make_shared<GrpcClientConnection>(address, std::move(channel),
                                                       std::move(callbacks), options_.limits);
    conn->Open();
    if (options_.security.authenticates()) {
      const absl::Duration timeout =
          std::max(absl::Milliseconds(1), std::min(options_.security.handshake_timeout, deadline - absl::Now()));
      if (absl::Status s = conn->Authenticate(options_.security.secret, timeout); !s.ok()) {
        conn->Abandon();
        return s;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (!shut_down_) {
        ReapLocked();
        connections_.push_back(conn);
        conn->Start();  // under mu_: Shutdown() sees either no connection or its threads
        return std::shared_ptr<Connection>(conn);
      }
    }
    conn->Abandon();
    return ShutDownError(address);
  }

  void Shutdown() override {
    std::vector<std::shared_ptr<GrpcConnection>> conns;
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return;
      shut_down_ = true;
      conns.swap(connections_);
    }
    for (auto& c : conns) c->Close(absl::CancelledError("transport shut down"));
    // Every Stream call was cancelled above, so their handlers return promptly.
    std::unique_ptr<grpc::Server> server;
    {
      absl::MutexLock lock(&mu_);
      server.swap(server_);
    }
    if (server) {
      server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      server->Wait();
    }
    for (auto& c : conns) c->Join();
  }

 private:
  class Service final : public pb::FrameStream::Service {
   public:
    explicit Service(GrpcTransport* transport) : transport_(transport) {}
    grpc::Status Stream(grpc::ServerContext* context,
                        grpc::ServerReaderWriter<pb::FrameChunk, pb::FrameChunk>* stream) override {
      return transport_->Serve(context, stream);
    }

   private:
    GrpcTransport* const transport_;
  };

  grpc::Status Serve(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<pb::FrameChunk, pb::FrameChunk>* stream) {
    const std::string peer = PeerFromGrpc(context->peer());
    if (!rate_.Take(peer.substr(0, peer.rfind(':')), absl::Now())) {
      absl::Status s = absl::ResourceExhaustedError(
          absl::StrCat("more than ", options_.security.limits.max_connections_per_second,
                       " new connections per second from its address (PeerLimits::max_connections_per_second)"));
      refusals_.Refused(peer, s);
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(s.message()));
    }
    if (options_.security.authenticates()) {
      // Each stream in its handshake holds a server thread: a bounded number at once.
      if (authenticating_.fetch_add(1) >= kMaxAuthenticating) {
        authenticating_.fetch_sub(1);
        absl::Status s = absl::ResourceExhaustedError(
            absl::StrCat(kMaxAuthenticating, " connections are already in their handshake"));
        refusals_.Refused(peer, s);
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(s.message()));
      }
      absl::Status s = RunHandshake(
          internal::Handshake::Role::kServer, options_.security.secret, options_.security.handshake_timeout, peer,
          [stream](pb::FrameChunk* c) { return stream->Read(c); },
          [stream](const pb::FrameChunk& c) { return stream->Write(c); }, [context] { context->TryCancel(); });
      authenticating_.fetch_sub(1);
      if (!s.ok()) {
        refusals_.Refused(peer, s);
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(s.message()));
      }
    }
    std::shared_ptr<GrpcServerConnection> conn;
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "transport shut down");
      conn = std::make_shared<GrpcServerConnection>(context, stream, accept_callbacks_,
                                                    options_.limits);
      ReapLocked();
      connections_.push_back(conn);
    }
    conn->Run();
    // The call was cancelled on every path out of Run().
    return grpc::Status(grpc::StatusCode::CANCELLED, "connection closed");
  }

  static absl::Status ShutDownError(const std::string& address) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", address, ": the grpc transport is shut down"));
  }

  // Forgets connections that have finished, joining their threads.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::erase_if(connections_, [](const std::shared_ptr<GrpcConnection>& c) {
      if (!c->finished()) return false;
      c->Join();
      return true;
    });
  }

  const TransportOptions options_;
  internal::ConnectionRate rate_;
  internal::RefusalLog refusals_{"a connection"};
  static constexpr int kMaxAuthenticating = 64;
  std::atomic<int> authenticating_{0};
  Service service_;
  absl::Mutex mu_;
  ConnectionCallbacks accept_callbacks_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<GrpcConnection>> connections_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeGrpcTransport(TransportOptions options) {
  if (absl::Status s = options.security.Validate(); !s.ok()) return s;
  return std::make_unique<GrpcTransport>(options);
}

}  // namespace gw::rpc
