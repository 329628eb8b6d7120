#include "transport/fault/fault_transport.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/timer_queue.h"
#include "gradwire/tensor/kernels.h"

namespace gw::rpc {
namespace {

using OnSent = std::function<void(absl::Status)>;

// Frame types (the first byte of every inner message's header).
constexpr char kHello = 'H';
constexpr char kData = 'D';
constexpr char kAck = 'A';
constexpr char kGoodbye = 'C';

constexpr size_t kCrcOffset = 1;
constexpr size_t kFieldsOffset = 5;                    // after the type and the crc
constexpr size_t kAckFieldsEnd = kFieldsOffset + 8;    // ack
constexpr size_t kDataFieldsEnd = kFieldsOffset + 16;  // seq, ack; the user's header follows
constexpr size_t kHelloFieldsEnd = kFieldsOffset + 4;  // magic; the name follows
constexpr uint32_t kHelloMagic = 0x4c465747;           // "GWFL"

constexpr absl::Duration kReorderHold = absl::Milliseconds(1);  // longest wait for a window to fill
constexpr absl::Duration kSlackPerMiB = absl::Milliseconds(4);  // time to write and checksum a frame
constexpr int kMaxBackoffShift = 3;                             // timeouts double up to 8x
constexpr absl::Duration kGoodbyeGrace = absl::Milliseconds(200);

template <typename T>
void PutAt(std::string& s, size_t offset, T v) {
  std::memcpy(s.data() + offset, &v, sizeof(T));
}
template <typename T>
T GetAt(const std::string& s, size_t offset) {
  T v;
  std::memcpy(&v, s.data() + offset, sizeof(T));
  return v;
}

// Where a frame's fields end: the user's header follows in a data frame; in the others
// everything after the crc is fields.
size_t FieldsEnd(const std::string& header) { return header[0] == kData ? kDataFieldsEnd : header.size(); }

// Whether the header is long enough for its type (unknown types are refused later).
bool WellFormed(const std::string& header) {
  if (header.size() < kFieldsOffset) return false;
  switch (header[0]) {
    case kData: return header.size() >= kDataFieldsEnd;
    case kAck: return header.size() == kAckFieldsEnd;
    case kHello: return header.size() >= kHelloFieldsEnd;
    default: return true;
  }
}

uint32_t Crc(uint32_t crc, const void* data, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

// The crc32 of what the sender knows before it numbers the frame: the tensors (dtype,
// sizes, bytes) and the header after the link fields.
uint32_t PayloadCrc(const std::vector<Tensor>& tensors, const std::string& header, size_t fields_end) {
  uint32_t crc = 0;
  for (const Tensor& t : tensors) {
    if (!t.defined()) {
      const uint8_t none = 0xff;
      crc = Crc(crc, &none, 1);
      continue;
    }
    const uint8_t meta[2] = {static_cast<uint8_t>(t.dtype()), static_cast<uint8_t>(t.dim())};
    crc = Crc(crc, meta, sizeof(meta));
    crc = Crc(crc, t.sizes().data(), t.sizes().size() * sizeof(int64_t));
    const Tensor c = kernels::Contiguous(t);
    crc = Crc(crc, c.raw_data(), c.nbytes());
  }
  return Crc(crc, header.data() + fields_end, header.size() - fields_end);
}

// Adds the type byte and the fields to a PayloadCrc.
uint32_t FinishCrc(uint32_t crc, const std::string& header, size_t fields_end) {
  crc = Crc(crc, header.data(), 1);
  return Crc(crc, header.data() + kFieldsOffset, fields_end - kFieldsOffset);
}

void Seal(std::string& header, uint32_t payload_crc) {
  PutAt<uint32_t>(header, kCrcOffset, FinishCrc(payload_crc, header, FieldsEnd(header)));
}

bool Intact(const Message& m) {
  const size_t end = FieldsEnd(m.header);
  return GetAt<uint32_t>(m.header, kCrcOffset) == FinishCrc(PayloadCrc(m.tensors, m.header, end), m.header, end);
}

// A hello, ack or goodbye: the type, its crc and `fields`.
Message ControlFrame(char type, const std::string& fields) {
  std::string header(kFieldsOffset, '\0');
  header[0] = type;
  header += fields;
  Seal(header, 0);
  return Message{std::move(header), {}};
}

// The tensors as the sender keeps them for retransmission: contiguous, and referenced by
// nobody else (a caller may modify its tensors once Send returns), copied only if needed.
std::vector<Tensor> PrivateCopies(std::vector<Tensor> tensors) {
  for (Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (t.is_contiguous() && t.storage().use_count() == 1 && t.impl_ptr().use_count() == 1) continue;
    t = kernels::Clone(t);
  }
  return tensors;
}

class FaultTransport;

class FaultConnection final : public Connection, public std::enable_shared_from_this<FaultConnection> {
 public:
  FaultConnection(FaultTransport* transport, ConnectionCallbacks user, bool dialer);

  void Attach(std::shared_ptr<Connection> inner) {
    absl::MutexLock lock(&mu_);
    inner_ = std::move(inner);
  }
  void SendHello();

  void Send(Message message, OnSent on_sent) override {
    std::optional<absl::Status> fault = Submit(std::move(message), std::move(on_sent));
    Kick();
    if (fault) FaultClose(*fault);
  }
  // (SendCoalesced is Send: frames released together already leave in one SendMany.)
  void SendMany(std::vector<Message> messages) override {
    std::optional<absl::Status> fault;
    for (Message& m : messages) {
      // After the last frame close_after allows, the rest is lost with the connection.
      if (fault = Submit(std::move(m), nullptr); fault) break;
    }
    Kick();
    if (fault) FaultClose(*fault);
  }
  void Close(absl::Status reason) override {
    if (std::shared_ptr<Connection> inner = BeginClose(reason)) inner->Close(std::move(reason));
  }
  std::string peer() const override {
    absl::MutexLock lock(&mu_);
    return inner_ ? inner_->peer() : "unknown peer";
  }
  // True once on_close is reported, as with tcp. While a goodbye waits for the peer (an
  // RTT, at most 200 ms) the connection still counts as open and sends made then fail at
  // on_close: a caller does not replace it before its close was handled (the agent fails
  // a peer's calls only on the close of its current connection).
  bool closed() const override {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  // Inner connection events (its I/O strand).
  void OnMessage(const std::shared_ptr<Connection>& inner, Message m);
  void OnFlush();
  void OnClose(const absl::Status& inner_reason);
  // Changes of the plan (Partition, Stall, ...), on the thread that made them.
  void OnFaultsChanged();

 private:
  struct Unacked {
    Message frame;
    OnSent on_sent;
    absl::Time sent_at;
    int retransmits = 0;
    size_t bytes = 0;
  };
  struct Delayed {
    absl::Time at;
    Message frame;
  };

  // Numbers a data frame, keeps it until acknowledged and puts it on the link. Returns a
  // close_after reason when this frame was the connection's last.
  std::optional<absl::Status> Submit(Message message, OnSent on_sent);
  // Moves what is due onto the inner connection and arms the timer for what is not.
  void Kick();
  void Tick(absl::Time armed_for);
  void ArmTimer(absl::Time when);
  // Writes the frames released to the wire, in order, one writer at a time.
  void Pump();

  void OnHello(const std::string& header);
  void OnAck(uint64_t ack);
  void OnData(Message m);
  void DeliverReady();
  void SendAckIfOwed();

  // Marks the connection closing with `reason` (the first reason wins); returns the
  // inner connection to close, or null if it was closing already.
  std::shared_ptr<Connection> BeginClose(const absl::Status& reason);
  // Closes because of a fault: the peer gets a goodbye with the reason.
  void FaultClose(const absl::Status& reason);
  void ProtocolError(absl::string_view what);
  std::string Describe() const;

  // ---- link: the faulty medium between this end and the peer's (mu_ held) ----
  void LinkPushLocked(Message frame, const FaultSpec& plan, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWindowLocked(const FaultSpec& plan, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DelayLocked(Message frame, const FaultSpec& plan, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceLocked(const FaultSpec& plan, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetransmitLocked(const FaultSpec& plan, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time NextDeadlineLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration TimeoutLocked(const Unacked& u, const FaultSpec& plan) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateRttLocked(absl::Duration sample) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stalls: this connection's own (stall:D) or the injector's (Stall()).
  bool StalledLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After Unstall(): this connection's stall of stall:D is over, or will not come.
  void ObserveUnstallLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time StallEndLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a data frame sent or delivered: starts the stall of stall_after, returns the
  // close_after reason when the count is reached.
  std::optional<absl::Status> CarriedLocked(const FaultSpec& plan, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLinkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Chance(double p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Message CorruptedLocked(Message frame) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  FaultTransport* const transport_;
  FaultInjector& faults_;
  const ConnectionCallbacks user_;
  const bool dialer_;

  mutable absl::Mutex mu_;
  std::shared_ptr<Connection> inner_ ABSL_GUARDED_BY(mu_);
  std::string peer_name_ ABSL_GUARDED_BY(mu_);  // from its hello
  bool closing_ ABSL_GUARDED_BY(mu_) = false;    // no more sends or deliveries
  bool closed_ ABSL_GUARDED_BY(mu_) = false;     // the inner connection reported its close
  absl::Status close_reason_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  int64_t carried_ ABSL_GUARDED_BY(mu_) = 0;  // data frames sent plus delivered
  // Sending side.
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Unacked> unacked_ ABSL_GUARDED_BY(mu_);
  std::vector<OnSent> closing_sends_ ABSL_GUARDED_BY(mu_);  // sent while closing: fail at on_close
  absl::Time retransmit_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // next scan
  bool has_rtt_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration srtt_ ABSL_GUARDED_BY(mu_);
  absl::Duration rttvar_ ABSL_GUARDED_BY(mu_);
  // Receiving side.
  uint64_t expected_ ABSL_GUARDED_BY(mu_) = 1;  // next seq to deliver; expected_ - 1 is the ack
  bool ack_owed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Message> reorder_buffer_ ABSL_GUARDED_BY(mu_);
  // The link, in the order frames pass: a reorder window, then the delay line (release
  // times never decrease), then `out_`, released to the inner connection by Pump.
  std::vector<Message> window_ ABSL_GUARDED_BY(mu_);
  absl::Time window_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::deque<Delayed> delay_line_ ABSL_GUARDED_BY(mu_);
  absl::Time last_release_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<Message> out_ ABSL_GUARDED_BY(mu_);
  bool pumping_ ABSL_GUARDED_BY(mu_) = false;
  // Stalls.
  absl::Time stall_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stalled_once_ ABSL_GUARDED_BY(mu_) = false;
  bool was_stalled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t unstalls_seen_ ABSL_GUARDED_BY(mu_) = 0;
  // The one armed timer (InfiniteFuture: none).
  absl::Time timer_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  TimerQueue::Handle timer_ ABSL_GUARDED_BY(mu_);

  // I/O strand only.
  bool peer_hello_ = false;
  bool delivered_ = false;  // on_message ran since the last on_flush
};

class FaultTransport final : public Transport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, std::shared_ptr<FaultInjector> faults,
                 const TransportOptions& options)
      : inner_(std::move(inner)), faults_(std::move(faults)), self_name_(options.self_name),
        limits_(options.limits), timers_("gw-faults") {
    observer_ = faults_->AddObserver([this] { OnFaultsChanged(); });
  }
  ~FaultTransport() override { Shutdown(); }

  std::string name() const override { return absl::StrCat(inner_->name(), "+faults"); }

  absl::StatusOr<std::string> Listen(const std::string& host, const std::string& advertise_host,
                                     ConnectionCallbacks callbacks) override {
    accept_callbacks_ = std::move(callbacks);
    return inner_->Listen(host, advertise_host, Forwarding(/*dialed=*/{}));
  }

  absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address, ConnectionCallbacks callbacks,
                                                      absl::Time deadline) override {
    auto conn = std::make_shared<FaultConnection>(this, std::move(callbacks), /*dialer=*/true);
    absl::StatusOr<std::shared_ptr<Connection>> inner = inner_->Connect(address, Forwarding(conn), deadline);
    if (!inner.ok()) return inner.status();
    conn->Attach(*inner);
    {
      absl::MutexLock lock(&mu_);
      connections_[inner->get()] = conn;
    }
    conn->SendHello();
    return std::shared_ptr<Connection>(conn);
  }

  void Shutdown() override {
    if (shutting_down_.exchange(true)) return;
    faults_->RemoveObserver(observer_);
    inner_->Shutdown();
    timers_.Shutdown();  // timers still pending run now and find their connections closed
    absl::flat_hash_map<Connection*, std::shared_ptr<FaultConnection>> gone;
    absl::MutexLock lock(&mu_);
    gone.swap(connections_);  // released after the lock
  }

  FaultInjector& faults() const { return *faults_; }
  const std::string& self_name() const { return self_name_; }
  const FrameLimits& limits() const { return limits_; }
  TimerQueue& timers() { return timers_; }
  bool shutting_down() const { return shutting_down_.load(std::memory_order_acquire); }

 private:
  // Callbacks that forward an inner connection's events to its wrapper: `dialed` (held
  // weakly: the wrapper owns the inner connection), or if none the wrapper of an accepted
  // connection, made on its first event (also when that is its close).
  ConnectionCallbacks Forwarding(std::weak_ptr<FaultConnection> dialed) {
    const bool accepted = dialed.expired();
    auto wrapper = [this, dialed = std::move(dialed), accepted](const std::shared_ptr<Connection>& inner) {
      return accepted ? Accepted(inner) : dialed.lock();
    };
    return {[wrapper](const std::shared_ptr<Connection>& inner, Message m) {
              if (auto w = wrapper(inner)) w->OnMessage(inner, std::move(m));
            },
            [this, wrapper](const std::shared_ptr<Connection>& inner, const absl::Status& s) {
              if (auto w = wrapper(inner)) w->OnClose(s);
              Forget(inner.get());
            },
            [wrapper](const std::shared_ptr<Connection>& inner) {
              if (auto w = wrapper(inner)) w->OnFlush();
            }};
  }
  std::shared_ptr<FaultConnection> Accepted(const std::shared_ptr<Connection>& inner) {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<FaultConnection>& w = connections_[inner.get()];
    if (w == nullptr) {
      w = std::make_shared<FaultConnection>(this, accept_callbacks_, /*dialer=*/false);
      w->Attach(inner);
    }
    return w;
  }
  void Forget(Connection* inner) {
    absl::MutexLock lock(&mu_);
    connections_.erase(inner);
  }
  void OnFaultsChanged() {
    std::vector<std::shared_ptr<FaultConnection>> all;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [inner, conn] : connections_) all.push_back(conn);
    }
    for (auto& conn : all) conn->OnFaultsChanged();
  }

  const std::unique_ptr<Transport> inner_;
  const std::shared_ptr<FaultInjector> faults_;
  const std::string self_name_;
  const FrameLimits limits_;
  TimerQueue timers_;
  uint64_t observer_ = 0;
  std::atomic<bool> shutting_down_{false};
  ConnectionCallbacks accept_callbacks_;  // set by Listen, before any connection exists
  absl::Mutex mu_;
  absl::flat_hash_map<Connection*, std::shared_ptr<FaultConnection>> connections_ ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------------ FaultConnection

FaultConnection::FaultConnection(FaultTransport* transport, ConnectionCallbacks user, bool dialer)
    : transport_(transport), faults_(transport->faults()), user_(std::move(user)), dialer_(dialer),
      rng_(transport->faults().NextSeed()) {
  absl::MutexLock lock(&mu_);
  unstalls_seen_ = faults_.unstalls();
}

void FaultConnection::SendHello() {
  std::string fields(4, '\0');
  PutAt<uint32_t>(fields, 0, kHelloMagic);
  fields += transport_->self_name();
  {
    absl::MutexLock lock(&mu_);
    out_.push_back(ControlFrame(kHello, fields));  // control frames skip the faulty link
  }
  Pump();
}

std::optional<absl::Status> FaultConnection::Submit(Message message, OnSent on_sent) {
  std::string header(kDataFieldsEnd, '\0');
  header[0] = kData;
  header += message.header;
  Message frame{std::move(header), PrivateCopies(std::move(message.tensors))};
  // What the inner connection would refuse fails here, before it is numbered.
  if (absl::StatusOr<EncodedFrame> encoded = EncodeFrame(frame, transport_->limits()); !encoded.ok()) {
    if (on_sent) on_sent(encoded.status());
    return std::nullopt;
  }
  const size_t bytes = frame.header.size() + [&] {
    size_t n = 0;
    for (const Tensor& t : frame.tensors) n += t.nbytes();
    return n;
  }();
  const uint32_t payload_crc = PayloadCrc(frame.tensors, frame.header, kDataFieldsEnd);
  std::shared_ptr<const FaultSpec> plan = faults_.plan();
  absl::Status refused;
  std::optional<absl::Status> fault;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      refused = close_reason_;
    } else if (closing_) {
      // The close is under way (a goodbye waits for the peer): fail with it when it is
      // reported, so that a caller sees the connection closed, not a burst of failures.
      if (on_sent) closing_sends_.push_back(std::move(on_sent));
    } else {
      const absl::Time now = absl::Now();
      const uint64_t seq = next_seq_++;
      PutAt<uint64_t>(frame.header, kFieldsOffset, seq);
      PutAt<uint64_t>(frame.header, kFieldsOffset + 8, expected_ - 1);
      ack_owed_ = false;  // piggybacked
      Seal(frame.header, payload_crc);
      if (unacked_.empty()) retransmit_at_ = now + plan->rto;
      unacked_[seq] = Unacked{frame, std::move(on_sent), now, 0, bytes};
      faults_.Count(&FaultStats::frames_sent);
      fault = CarriedLocked(*plan, now);  // first: a stall it starts holds this frame too
      LinkPushLocked(std::move(frame), *plan, now);
    }
  }
  if (!refused.ok() && on_sent) on_sent(refused);
  return fault;
}

void FaultConnection::Kick() {
  absl::Time next;
  {
    std::shared_ptr<const FaultSpec> plan = faults_.plan();
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    const absl::Time now = absl::Now();
    AdvanceLocked(*plan, now);
    next = NextDeadlineLocked(now);
  }
  Pump();
  ArmTimer(next);
}

void FaultConnection::Tick(absl::Time armed_for) {
  if (transport_->shutting_down()) return;
  {
    absl::MutexLock lock(&mu_);
    if (timer_at_ == armed_for) timer_at_ = absl::InfiniteFuture();  // else a later timer is armed
  }
  Kick();
}

// Never called with a lock held: a TimerQueue that has shut down runs the callback at once.
void FaultConnection::ArmTimer(absl::Time when) {
  if (when == absl::InfiniteFuture() || transport_->shutting_down()) return;
  TimerQueue::Handle old;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || when >= timer_at_) return;
    old = timer_;
    timer_at_ = when;
  }
  TimerQueue& timers = transport_->timers();
  timers.Cancel(old);
  std::weak_ptr<FaultConnection> weak = weak_from_this();
  TimerQueue::Handle handle = timers.At(when, [weak, when] {
    if (auto self = weak.lock()) self->Tick(when);
  });
  absl::MutexLock lock(&mu_);
  if (timer_at_ == when) timer_ = handle;
}

void FaultConnection::Pump() {
  while (true) {
    std::vector<Message> batch;
    std::shared_ptr<Connection> inner;
    {
      absl::MutexLock lock(&mu_);
      if (pumping_ || out_.empty() || inner_ == nullptr) return;
      pumping_ = true;
      batch.swap(out_);
      inner = inner_;
    }
    // A failed write closes the inner connection; its on_close fails what is unacked.
    if (batch.size() == 1) {
      inner->Send(std::move(batch.front()));
    } else {
      inner->SendMany(std::move(batch));
    }
    absl::MutexLock lock(&mu_);
    pumping_ = false;
  }
}

// ---- link

bool FaultConnection::Chance(double p) {
  return p > 0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p;
}

void FaultConnection::LinkPushLocked(Message frame, const FaultSpec& plan, absl::Time now) {
  if (Chance(plan.drop)) {
    faults_.Count(&FaultStats::dropped);
    return;
  }
  if (Chance(plan.corrupt)) {
    frame = CorruptedLocked(std::move(frame));
    faults_.Count(&FaultStats::corrupted);
  }
  const int copies = Chance(plan.duplicate) ? 2 : 1;
  if (copies == 2) faults_.Count(&FaultStats::duplicated);
  if (StalledLocked(now)) faults_.Count(&FaultStats::stalled, static_cast<uint64_t>(copies));
  for (int i = 0; i < copies; ++i) {
    Message copy = i + 1 < copies ? frame : std::move(frame);
    if (plan.reorder <= 1) {
      DelayLocked(std::move(copy), plan, now);
      continue;
    }
    if (window_.empty()) window_deadline_ = now + kReorderHold;
    window_.push_back(std::move(copy));
    if (window_.size() >= static_cast<size_t>(plan.reorder)) ReleaseWindowLocked(plan, now);
  }
}

void FaultConnection::ReleaseWindowLocked(const FaultSpec& plan, absl::Time now) {
  std::vector<size_t> order(window_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng_);
  uint64_t moved = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    moved += order[i] != i;
    DelayLocked(std::move(window_[order[i]]), plan, now);
  }
  if (moved > 0) faults_.Count(&FaultStats::reordered, moved);
  window_.clear();
  window_deadline_ = absl::InfiniteFuture();
}

void FaultConnection::DelayLocked(Message frame, const FaultSpec& plan, absl::Time now) {
  absl::Duration delay = plan.delay_min;
  if (plan.delay_max > plan.delay_min) {
    delay = absl::Nanoseconds(std::uniform_int_distribution<int64_t>(
        absl::ToInt64Nanoseconds(plan.delay_min), absl::ToInt64Nanoseconds(plan.delay_max))(rng_));
  }
  // In order: a frame never leaves before the one ahead of it.
  last_release_ = std::max(now + delay, last_release_);
  delay_line_.push_back(Delayed{last_release_, std::move(frame)});
}

void FaultConnection::ObserveUnstallLocked() {
  if (const uint64_t unstalls = faults_.unstalls(); unstalls != unstalls_seen_) {
    unstalls_seen_ = unstalls;
    stall_until_ = absl::InfinitePast();  // Unstall ends stall:D too, and spends it
    stalled_once_ = true;
  }
}

void FaultConnection::AdvanceLocked(const FaultSpec& plan, absl::Time now) {
  ObserveUnstallLocked();
  const bool stalled = StalledLocked(now);
  if (was_stalled_ && !stalled) {
    // Frames held by the stall leave now: time them from now.
    for (auto& [seq, u] : unacked_) u.sent_at = now;
    if (!unacked_.empty()) retransmit_at_ = now + plan.rto;
  }
  was_stalled_ = stalled;
  if (!window_.empty() && now >= window_deadline_) ReleaseWindowLocked(plan, now);
  if (stalled) return;
  if (now >= retransmit_at_) RetransmitLocked(plan, now);
  while (!delay_line_.empty() && delay_line_.front().at <= now) {
    out_.push_back(std::move(delay_line_.front().frame));
    delay_line_.pop_front();
  }
}

void FaultConnection::RetransmitLocked(const FaultSpec& plan, absl::Time now) {
  uint64_t resent = 0;
  for (auto& [seq, u] : unacked_) {
    if (now - u.sent_at < TimeoutLocked(u, plan)) continue;
    u.sent_at = now;
    ++u.retransmits;
    ++resent;
    LinkPushLocked(u.frame, plan, now);
  }
  if (resent > 0) faults_.Count(&FaultStats::retransmitted, resent);
  retransmit_at_ = unacked_.empty() ? absl::InfiniteFuture() : now + plan.rto;
}

absl::Duration FaultConnection::TimeoutLocked(const Unacked& u, const FaultSpec& plan) const {
  absl::Duration timeout = has_rtt_ ? std::max(plan.rto, srtt_ + 4 * rttvar_) : plan.rto + 2 * plan.delay_max;
  if (plan.reorder > 1) timeout += 2 * kReorderHold;
  timeout += kSlackPerMiB * (static_cast<double>(u.bytes) / (1 << 20));
  return timeout * (1 << std::min(u.retransmits, kMaxBackoffShift));
}

void FaultConnection::UpdateRttLocked(absl::Duration sample) {
  if (!has_rtt_) {
    srtt_ = sample;
    rttvar_ = sample / 2;
    has_rtt_ = true;
    return;
  }
  rttvar_ = rttvar_ * 0.75 + absl::AbsDuration(srtt_ - sample) * 0.25;
  srtt_ = srtt_ * 0.875 + sample * 0.125;
}

absl::Time FaultConnection::NextDeadlineLocked(absl::Time now) const {
  absl::Time next = window_.empty() ? absl::InfiniteFuture() : window_deadline_;
  if (StalledLocked(now)) return std::min(next, StallEndLocked(now));
  if (!delay_line_.empty()) next = std::min(next, delay_line_.front().at);
  if (!unacked_.empty()) next = std::min(next, retransmit_at_);
  return next;
}

bool FaultConnection::StalledLocked(absl::Time now) const {
  return now < stall_until_ || now < faults_.stalled_until();
}

absl::Time FaultConnection::StallEndLocked(absl::Time now) const {
  const absl::Time injector = faults_.stalled_until();
  return std::max(stall_until_ > now ? stall_until_ : now, injector > now ? injector : now);
}

std::optional<absl::Status> FaultConnection::CarriedLocked(const FaultSpec& plan, absl::Time now) {
  ++carried_;
  ObserveUnstallLocked();
  if (plan.stall > absl::ZeroDuration() && !stalled_once_ && carried_ > plan.stall_after) {
    stalled_once_ = true;
    stall_until_ = plan.stall == absl::InfiniteDuration() ? absl::InfiniteFuture() : now + plan.stall;
  }
  if (plan.close_after > 0 && carried_ >= plan.close_after) {
    return absl::UnavailableError(absl::StrCat("connection closed by fault injection after ", carried_,
                                               carried_ == 1 ? " frame" : " frames", " (peer ", DescribeLocked(), ")"));
  }
  return std::nullopt;
}

Message FaultConnection::CorruptedLocked(Message frame) {
  size_t total = frame.header.size();
  for (const Tensor& t : frame.tensors) total += t.defined() ? t.nbytes() : 0;
  size_t at = std::uniform_int_distribution<size_t>(0, total - 1)(rng_);
  const char bit = static_cast<char>(1 << std::uniform_int_distribution<int>(0, 7)(rng_));
  if (at < frame.header.size()) {
    frame.header[at] ^= bit;
    return frame;
  }
  at -= frame.header.size();
  for (Tensor& t : frame.tensors) {
    const size_t n = t.defined() ? t.nbytes() : 0;
    if (at < n) {
      t = kernels::Clone(t);  // the kept frame (and the caller's data) stay intact
      static_cast<char*>(t.raw_data())[at] ^= bit;
      break;
    }
    at -= n;
  }
  return frame;
}

void FaultConnection::DropLinkLocked() {
  window_.clear();
  delay_line_.clear();
}

// ---- receiving

void FaultConnection::OnMessage(const std::shared_ptr<Connection>& inner, Message m) {
  absl::Status closing;
  {
    absl::MutexLock lock(&mu_);
    if (inner_ == nullptr) inner_ = inner;  // a frame that raced Connect's Attach
    if (closing_) closing = close_reason_;
  }
  if (!closing.ok()) {
    // Both ends closed for a fault (a partition): the goodbyes crossed, close now.
    if (!m.header.empty() && m.header[0] == kGoodbye) inner->Close(closing);
    return;
  }
  if (!WellFormed(m.header)) return ProtocolError("a malformed frame");
  if (!Intact(m)) {
    if (!peer_hello_) return ProtocolError("a frame that is not the fault link's hello (does the peer run with faults?)");
    faults_.Count(&FaultStats::corruptions_detected);
    return FaultClose(absl::DataLossError(absl::StrCat("fault transport: a frame from ", Describe(),
                                                       " failed its checksum (corrupted on the link)")));
  }
  switch (m.header[0]) {
    case kHello: return OnHello(m.header);
    case kGoodbye: {
      const absl::Status reason = absl::UnavailableError(
          absl::StrCat(Describe(), " closed the connection: ", m.header.substr(kFieldsOffset)));
      if (std::shared_ptr<Connection> closing = BeginClose(reason)) closing->Close(reason);
      return;
    }
    default: break;
  }
  if (!peer_hello_) return ProtocolError("a frame before the fault link's hello");
  {
    absl::MutexLock lock(&mu_);
    if (StalledLocked(absl::Now())) {  // lost on the stalled link: the peer sends it again
      faults_.Count(&FaultStats::stalled);
      return;
    }
  }
  switch (m.header[0]) {
    case kAck: return OnAck(GetAt<uint64_t>(m.header, kFieldsOffset));
    case kData: return OnData(std::move(m));
    default: return ProtocolError(absl::StrCat("a frame of unknown type ", static_cast<int>(m.header[0])));
  }
}

void FaultConnection::OnHello(const std::string& header) {
  if (peer_hello_) return ProtocolError("a second hello");
  if (GetAt<uint32_t>(header, kFieldsOffset) != kHelloMagic) return ProtocolError("a hello of another protocol");
  const std::string name = header.substr(kHelloFieldsEnd);
  {
    absl::MutexLock lock(&mu_);
    peer_name_ = name;
  }
  peer_hello_ = true;
  if (!dialer_) SendHello();
  if (faults_.Partitioned(transport_->self_name(), name)) {
    FaultClose(absl::UnavailableError(absl::StrCat(transport_->self_name(), " cannot reach ", Describe(),
                                                   ": partitioned by fault injection")));
  }
}

void FaultConnection::OnAck(uint64_t ack) {
  std::vector<OnSent> done;
  bool bogus = false;
  {
    absl::MutexLock lock(&mu_);
    bogus = ack >= next_seq_;
    const absl::Time now = absl::Now();
    auto end = bogus ? unacked_.begin() : unacked_.upper_bound(ack);
    std::optional<absl::Duration> sample;
    for (auto it = unacked_.begin(); it != end; ++it) {
      if (it->second.retransmits == 0) sample = now - it->second.sent_at;  // Karn: never a resent one
      done.push_back(std::move(it->second.on_sent));
    }
    unacked_.erase(unacked_.begin(), end);
    if (sample) UpdateRttLocked(*sample);
    if (unacked_.empty()) retransmit_at_ = absl::InfiniteFuture();
  }
  if (bogus) return ProtocolError("an ack of frames never sent");
  for (OnSent& cb : done) {
    if (cb) cb(absl::OkStatus());
  }
}

void FaultConnection::OnData(Message m) {
  const uint64_t seq = GetAt<uint64_t>(m.header, kFieldsOffset);
  OnAck(GetAt<uint64_t>(m.header, kFieldsOffset + 8));
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    ack_owed_ = true;  // also for a duplicate: the ack that would have stopped it was lost
    if (seq < expected_ || reorder_buffer_.contains(seq)) {
      faults_.Count(&FaultStats::duplicates_discarded);
      return;
    }
    m.header.erase(0, kDataFieldsEnd);
    reorder_buffer_.emplace(seq, std::move(m));
  }
  DeliverReady();
}

void FaultConnection::DeliverReady() {
  while (true) {
    Message m;
    std::optional<absl::Status> fault;
    {
      std::shared_ptr<const FaultSpec> plan = faults_.plan();
      absl::MutexLock lock(&mu_);
      if (closing_ || reorder_buffer_.empty() || reorder_buffer_.begin()->first != expected_) return;
      m = std::move(reorder_buffer_.begin()->second);
      reorder_buffer_.erase(reorder_buffer_.begin());
      ++expected_;
      faults_.Count(&FaultStats::frames_delivered);
      fault = CarriedLocked(*plan, absl::Now());
    }
    if (user_.on_message) user_.on_message(shared_from_this(), std::move(m));
    delivered_ = true;
    if (fault) return FaultClose(*fault);
  }
}

void FaultConnection::OnFlush() {
  SendAckIfOwed();
  if (!delivered_) return;
  delivered_ = false;
  if (user_.on_flush) user_.on_flush(shared_from_this());
}

void FaultConnection::SendAckIfOwed() {
  {
    std::shared_ptr<const FaultSpec> plan = faults_.plan();
    absl::MutexLock lock(&mu_);
    if (closing_ || !ack_owed_) return;
    ack_owed_ = false;
    std::string fields(8, '\0');
    PutAt<uint64_t>(fields, 0, expected_ - 1);
    LinkPushLocked(ControlFrame(kAck, fields), *plan, absl::Now());
  }
  Kick();
}

void FaultConnection::OnClose(const absl::Status& inner_reason) {
  std::map<uint64_t, Unacked> failed;
  std::vector<OnSent> refused;
  absl::Status reason;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    if (!closing_) close_reason_ = inner_reason;
    closing_ = true;
    reason = close_reason_;
    failed.swap(unacked_);
    refused.swap(closing_sends_);
    reorder_buffer_.clear();
    DropLinkLocked();
    out_.clear();
  }
  if (delivered_) OnFlush();  // the layer above hears of everything delivered before the close
  for (auto& [seq, u] : failed) {
    if (u.on_sent) u.on_sent(reason);
  }
  for (OnSent& cb : refused) cb(reason);
  if (user_.on_close) user_.on_close(shared_from_this(), reason);
}

void FaultConnection::OnFaultsChanged() {
  std::string peer_name;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    peer_name = peer_name_;
  }
  if (faults_.Partitioned(transport_->self_name(), peer_name)) {
    return FaultClose(absl::UnavailableError(
        absl::StrCat(transport_->self_name(), " cannot reach ", Describe(), ": partitioned by fault injection")));
  }
  Kick();  // a stall may have ended
}

// ---- closing

std::shared_ptr<Connection> FaultConnection::BeginClose(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (closing_) return nullptr;
  closing_ = true;
  close_reason_ = reason;
  DropLinkLocked();  // frames still on the faulty link are lost with it
  return inner_;
}

void FaultConnection::FaultClose(const absl::Status& reason) {
  std::shared_ptr<Connection> inner = BeginClose(reason);
  if (inner == nullptr) return;
  faults_.Count(&FaultStats::connections_closed);
  {
    absl::MutexLock lock(&mu_);
    out_.push_back(ControlFrame(kGoodbye, std::string(reason.message())));
  }
  Pump();
  // The peer closes when it reads the goodbye; if it does not, close anyway.
  transport_->timers().After(kGoodbyeGrace, [inner, reason] { inner->Close(reason); });
}

void FaultConnection::ProtocolError(absl::string_view what) {
  const absl::Status reason =
      absl::DataLossError(absl::StrCat("fault transport: ", what, " from ", Describe()));
  if (std::shared_ptr<Connection> inner = BeginClose(reason)) inner->Close(reason);
}

std::string FaultConnection::Describe() const {
  absl::MutexLock lock(&mu_);
  return DescribeLocked();
}

std::string FaultConnection::DescribeLocked() const {
  const std::string address = inner_ ? inner_->peer() : "unknown peer";
  return peer_name_.empty() ? address : absl::StrCat(peer_name_, " at ", address);
}

}  // namespace

std::unique_ptr<Transport> MakeFaultTransport(std::unique_ptr<Transport> inner, std::shared_ptr<FaultInjector> faults,
                                              const TransportOptions& options) {
  return std::make_unique<FaultTransport>(std::move(inner), std::move(faults), options);
}

}  // namespace gw::rpc
