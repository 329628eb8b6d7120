#include "transport/shm/shm_transport.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/tensor/kernels.h"
#include "transport/shm/shm_arena.h"
#include "transport/tcp/tcp_transport.h"

namespace gw::rpc {
namespace {

using internal::PeerArena;
using internal::ShmArena;

constexpr uint8_t kMaxDims = 16;

// Where a process runs, as its hello tells: processes may share memory only on the same
// boot of one kernel and in the same network namespace. Processes in different network
// namespaces stand for different hosts (containers; the tests' simulated hosts), even
// where the kernel would let them read each other's memory: their tensors go over TCP.
struct HostIdentity {
  std::string boot_id;
  uint64_t net_namespace = 0;  // inode of /proc/self/ns/net; 0: unknown

  static HostIdentity OfThisProcess() {
    HostIdentity id;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, id.boot_id);
    struct stat ns {};
    if (::stat("/proc/self/ns/net", &ns) == 0) id.net_namespace = static_cast<uint64_t>(ns.st_ino);
    return id;
  }
  // An unknown namespace (ours unreadable, or a peer that does not say) is never the same.
  bool SameHostAs(const HostIdentity& other) const {
    return !boot_id.empty() && net_namespace != 0 && boot_id == other.boot_id && net_namespace == other.net_namespace;
  }
};

// What the shm transport sent through shared memory (TransportStats).
struct SharedMemoryCounters {
  std::atomic<int64_t> connections{0};
  std::atomic<int64_t> tensors{0};
};

// Little-endian field writer and a bounds-checked reader for the wrapper headers.
class Writer {
 public:
  explicit Writer(char type) { out_.push_back(type); }
  template <typename T>
  Writer& Put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Writer& Bytes(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_ += s;
    return *this;
  }
  std::string Take() { return std::move(out_); }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s), pos_(1) {}
  template <typename T>
  bool Get(T* v) {
    if (s_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(std::string* out) {
    uint32_t n;
    if (!Get(&n) || s_.size() - pos_ < n) return false;
    out->assign(s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string Rest() const { return s_.substr(pos_); }

 private:
  const std::string& s_;
  size_t pos_;
};

// How a large tensor travels ('D' descriptors).
enum class Route : uint8_t {
  kCma = 0,    // address in the sender's memory: the receiver copies, the sender confirms
  kArena = 1,  // data offset in the sender's arena: the receiver wraps it, no copy
};

struct RemoteTensor {
  uint32_t index;
  Route route;
  DType dtype;
  Shape sizes;
  uint64_t address;  // kCma: address; kArena: offset
};

// 'K' flags: what the sender of the hello may do.
constexpr uint8_t kCanRead = 1;    // we read your memory: send large tensors by address
constexpr uint8_t kMappedArena = 2;  // we mapped your arena: put large tensors there

// Copies `bytes` from `address` in process `pid` into dst (one copy, by the kernel).
absl::Status CmaRead(pid_t pid, uint64_t address, void* dst, size_t bytes) {
  char* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < bytes) {
    iovec local{out + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("process_vm_readv from pid ", pid, " failed: ",
                                                 n < 0 ? std::strerror(errno) : "no progress"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

class ShmTransport;

// The optimistic read of a seqlock: a copy of t (contiguous) that may race with a
// writer and is kept only if t's storage version shows no write began or ended meanwhile.
Tensor SeqlockRead(const Tensor& t) {
  Tensor copy = Tensor::Empty(t.sizes(), t.dtype());
  internal::SeqlockCopy(copy.raw_data(), t.raw_data(), t.nbytes());
  return copy;
}

class ShmConnection final : public Connection, public std::enable_shared_from_this<ShmConnection> {
 public:
  ShmConnection(ShmTransport* transport, ConnectionCallbacks user, uint64_t id)
      : transport_(transport), user_(std::move(user)), id_(id) {}

  // Once, before the wrapper is handed to anyone.
  void Attach(std::shared_ptr<Connection> inner) {
    absl::MutexLock lock(&mu_);
    inner_raw_.store(inner.get(), std::memory_order_release);
    inner_ = std::move(inner);
  }
  void SendHello();

  void Send(Message message, std::function<void(absl::Status)> on_sent) override {
    uint64_t token = 0;
    Message wrapped = Wrap(std::move(message), on_sent, &token);
    auto self = shared_from_this();
    Inner()->Send(std::move(wrapped), [self, token, on_sent = std::move(on_sent)](absl::Status s) {
      if (token == 0) {
        if (on_sent) on_sent(s);
      } else if (!s.ok()) {
        self->FailOutgoing(token, s);
      }
    });
  }

  void SendCoalesced(Message message, std::function<void(absl::Status)> on_sent) override {
    uint64_t token = 0;
    Message wrapped = Wrap(std::move(message), on_sent, &token);
    if (token != 0) {
      auto self = shared_from_this();
      Inner()->Send(std::move(wrapped), [self, token](absl::Status s) {
        if (!s.ok()) self->FailOutgoing(token, s);
      });
      return;
    }
    Inner()->SendCoalesced(std::move(wrapped), std::move(on_sent));
  }

  // Messages without large tensors go out as one gather-write of the inner connection;
  // a failure closes it, and its on_close fails every outstanding large tensor.
  void SendMany(std::vector<Message> messages) override {
    std::vector<Message> wrapped;
    wrapped.reserve(messages.size());
    for (Message& m : messages) {
      uint64_t token = 0;
      std::function<void(absl::Status)> none;
      wrapped.push_back(Wrap(std::move(m), none, &token));
    }
    Inner()->SendMany(std::move(wrapped));
  }

  void OnFlush() {  // only after messages of the user's were delivered
    if (delivered_ && user_.on_flush) user_.on_flush(shared_from_this());
    delivered_ = false;
  }
  void Close(absl::Status reason) override { Inner()->Close(std::move(reason)); }
  std::string peer() const override { return Inner()->peer(); }
  bool closed() const override { return Inner()->closed(); }

  // Inner connection events (on its I/O strand).
  void OnMessage(Message m);
  void OnClose(const absl::Status& reason);

 private:
  struct Outgoing {
    std::vector<Tensor> tensors;
    std::vector<uint64_t> versions;
    std::function<void(absl::Status)> on_sent;
  };
  struct Incoming {
    Message message;
    uint64_t token = 0;  // 0: nothing to confirm
    std::vector<uint32_t> remote_index;
    bool confirmed = true;
  };

  // The 'D' message carrying `message`. Tensors of kArenaThreshold bytes or more go into
  // our arena once the peer mapped it (copied now, handed over with the message); if the
  // arena is full or unmapped, those of kCmaThreshold bytes or more travel by address
  // (once the peer can read our memory) under a fresh *token, which then owns on_sent
  // (moved out) until the peer's ack. The rest go inline over TCP.
  Message Wrap(Message message, std::function<void(absl::Status)>& on_sent, uint64_t* token) {
    std::vector<Tensor> cma_tensors, inline_tensors;
    std::vector<RemoteTensor> remote;
    const uint8_t can = peer_can_.load(std::memory_order_acquire);
    ShmArena* arena = transport_arena();
    int64_t shared = 0;
    for (size_t i = 0; i < message.tensors.size(); ++i) {
      const Tensor& t = message.tensors[i];
      const size_t bytes = t.defined() ? t.nbytes() : 0;
      if ((can & kMappedArena) && arena != nullptr && bytes >= kArenaThreshold && t.dim() <= kMaxDims) {
        if (std::optional<uint64_t> offset = arena->Put(kernels::Contiguous(t), peer_key_, id_)) {
          remote.push_back({static_cast<uint32_t>(i), Route::kArena, t.dtype(), t.sizes(), *offset});
          ++shared;
          continue;
        }
      }
      if ((can & kCanRead) && bytes >= kCmaThreshold && t.dim() <= kMaxDims) {
        cma_tensors.push_back(kernels::Contiguous(t));
        remote.push_back({static_cast<uint32_t>(i), Route::kCma, t.dtype(), t.sizes(),
                          reinterpret_cast<uint64_t>(cma_tensors.back().raw_data())});
        ++shared;
      } else {
        inline_tensors.push_back(t);
      }
    }
    if (shared > 0) counters().tensors.fetch_add(shared, std::memory_order_relaxed);
    Writer w('D');
    *token = 0;
    if (!cma_tensors.empty()) {
      absl::MutexLock lock(&mu_);
      *token = next_token_++;
      Outgoing& out = outgoing_[*token];
      out.tensors = cma_tensors;
      for (const Tensor& t : cma_tensors) out.versions.push_back(t.storage()->version());
      out.on_sent = std::move(on_sent);
      on_sent = nullptr;
    }
    w.Put<uint64_t>(*token).Put<uint32_t>(static_cast<uint32_t>(remote.size()));
    for (const RemoteTensor& rt : remote) {
      w.Put<uint32_t>(rt.index).Put<uint8_t>(static_cast<uint8_t>(rt.route)).Put<uint8_t>(static_cast<uint8_t>(rt.dtype));
      w.Put<uint8_t>(static_cast<uint8_t>(rt.sizes.size()));
      for (int64_t d : rt.sizes) w.Put<int64_t>(d);
      w.Put<uint64_t>(rt.address);
    }
    w.str() += message.header;
    return Message{w.Take(), std::move(inline_tensors)};
  }

  // Without a lock (every send asks): inner_ is set once and kept as long as the wrapper.
  Connection* Inner() const { return inner_raw_.load(std::memory_order_acquire); }
  void Fail(const std::string& what) {
    Inner()->Close(absl::DataLossError(absl::StrCat("shm transport: ", what, " from ", peer())));
  }
  void FailOutgoing(uint64_t token, const absl::Status& s) {
    std::function<void(absl::Status)> cb;
    {
      absl::MutexLock lock(&mu_);
      auto it = outgoing_.find(token);
      if (it == outgoing_.end()) return;
      cb = std::move(it->second.on_sent);
      outgoing_.erase(it);
    }
    if (cb) cb(s);
  }
  void OnHello(Reader& r);
  void OnData(Reader& r, std::vector<Tensor> inline_tensors);
  void OnAck(Reader& r);
  void OnConfirm(Reader& r, std::vector<Tensor> resent, bool resend);
  void DeliverReady();

  ShmArena* transport_arena() const;
  SharedMemoryCounters& counters() const;

  ShmTransport* const transport_;
  const ConnectionCallbacks user_;
  const uint64_t id_;  // this connection, as our arena knows where its blocks went
  // What the peer's 'K' allowed (kCanRead | kMappedArena); set once, on the I/O strand,
  // after peer_key_.
  std::atomic<uint8_t> peer_can_{0};
  pid_t peer_key_ = 0;  // the peer's pid, as our arena knows its receivers

  mutable absl::Mutex mu_;
  std::shared_ptr<Connection> inner_ ABSL_GUARDED_BY(mu_);  // owns what inner_raw_ points to
  std::atomic<Connection*> inner_raw_{nullptr};
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Outgoing> outgoing_ ABSL_GUARDED_BY(mu_);

  // I/O strand only.
  std::atomic<bool> hello_sent_{false};
  pid_t peer_pid_ = 0;                     // set once we may read its memory (CMA)
  std::shared_ptr<PeerArena> peer_arena_;  // the peer's arena, mapped here
  std::deque<Incoming> incoming_;
  bool delivered_ = false;  // on_message ran since the last on_flush
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(TransportOptions options, std::unique_ptr<Transport> tcp)
      : limits_(options.limits), tcp_(std::move(tcp)), identity_(HostIdentity::OfThisProcess()), pid_(::getpid()) {
    std::random_device rd;
    cookie_ = (static_cast<uint64_t>(rd()) << 32) | rd();
    if (options.shm_arena_bytes > 0) {
      // Without an arena (no memfd here) large tensors go by cross-memory attach.
      if (absl::StatusOr<std::unique_ptr<ShmArena>> arena = ShmArena::Create(options.shm_arena_bytes); arena.ok()) {
        arena_ = *std::move(arena);
      }
    }
  }
  ~ShmTransport() override { Shutdown(); }

  std::string name() const override { return "shm"; }

  absl::StatusOr<std::string> Listen(const std::string& host, const std::string& advertise_host,
                                     ConnectionCallbacks callbacks) override {
    accept_callbacks_ = std::move(callbacks);
    return tcp_->Listen(host, advertise_host, {[this](const std::shared_ptr<Connection>& inner, Message m) {
                                 Wrapper(inner, /*create=*/true)->OnMessage(std::move(m));
                               },
                               [this](const std::shared_ptr<Connection>& inner, const absl::Status& s) {
                                 // Also for a connection that never sent a valid frame.
                                 Wrapper(inner, /*create=*/true)->OnClose(s);
                                 Forget(inner.get());
                               },
                               [this](const std::shared_ptr<Connection>& inner) {
                                 if (auto w = Wrapper(inner, /*create=*/false)) w->OnFlush();
                               }});
  }

  absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address, ConnectionCallbacks callbacks,
                                                      absl::Time deadline) override {
    auto wrapper = std::make_shared<ShmConnection>(this, std::move(callbacks), next_connection_.fetch_add(1));
    std::weak_ptr<ShmConnection> weak = wrapper;
    auto inner = tcp_->Connect(address,
                               {[weak](const std::shared_ptr<Connection>&, Message m) {
                                  if (auto w = weak.lock()) w->OnMessage(std::move(m));
                                },
                                [this, weak](const std::shared_ptr<Connection>& c, const absl::Status& s) {
                                  if (auto w = weak.lock()) w->OnClose(s);
                                  Forget(c.get());
                                },
                                [weak](const std::shared_ptr<Connection>&) {
                                  if (auto w = weak.lock()) w->OnFlush();
                                }},
                               deadline);
    if (!inner.ok()) return inner.status();
    wrapper->Attach(*inner);
    {
      absl::MutexLock lock(&mu_);
      wrappers_[inner->get()] = wrapper;
    }
    wrapper->SendHello();
    return std::shared_ptr<Connection>(wrapper);
  }

  void Shutdown() override { tcp_->Shutdown(); }
  TransportStats stats() const override {
    TransportStats out{.shared_memory_connections = counters_.connections.load(std::memory_order_relaxed),
                       .shared_memory_tensors = counters_.tensors.load(std::memory_order_relaxed)};
    if (arena_) {
      const ShmArena::Stats a = arena_->stats();
      out.shared_memory_arena_bytes = static_cast<int64_t>(arena_->capacity());
      out.shared_memory_arena_high_water_bytes = static_cast<int64_t>(a.high_water);
      out.shared_memory_arena_blocks_in_use = static_cast<int64_t>(a.in_use);
    }
    return out;
  }

  const HostIdentity& identity() const { return identity_; }
  const FrameLimits& limits() const { return limits_; }
  pid_t pid() const { return pid_; }
  const uint64_t* cookie() const { return &cookie_; }
  ShmArena* arena() const { return arena_.get(); }
  SharedMemoryCounters& counters() const { return counters_; }

 private:
  std::shared_ptr<ShmConnection> Wrapper(const std::shared_ptr<Connection>& inner, bool create) {
    absl::MutexLock lock(&mu_);
    auto it = wrappers_.find(inner.get());
    if (it != wrappers_.end()) return it->second;
    if (!create) return nullptr;
    auto w = std::make_shared<ShmConnection>(this, accept_callbacks_, next_connection_.fetch_add(1));
    w->Attach(inner);
    wrappers_[inner.get()] = w;
    return w;
  }
  void Forget(Connection* inner) {
    absl::MutexLock lock(&mu_);
    wrappers_.erase(inner);
  }

  const FrameLimits limits_;
  std::unique_ptr<Transport> tcp_;
  const HostIdentity identity_;
  const pid_t pid_;
  uint64_t cookie_;
  std::unique_ptr<ShmArena> arena_;  // outgoing large tensors; null if unavailable
  mutable SharedMemoryCounters counters_;
  std::atomic<uint64_t> next_connection_{1};
  ConnectionCallbacks accept_callbacks_;
  absl::Mutex mu_;
  absl::flat_hash_map<Connection*, std::shared_ptr<ShmConnection>> wrappers_ ABSL_GUARDED_BY(mu_);
};

ShmArena* ShmConnection::transport_arena() const { return transport_->arena(); }
SharedMemoryCounters& ShmConnection::counters() const { return transport_->counters(); }

void ShmConnection::SendHello() {
  hello_sent_ = true;
  Writer w('H');
  ShmArena* arena = transport_->arena();
  w.Put<uint64_t>(static_cast<uint64_t>(transport_->pid()))
      .Put<uint64_t>(reinterpret_cast<uint64_t>(transport_->cookie()))
      .Put<uint64_t>(*transport_->cookie())
      .Bytes(transport_->identity().boot_id)
      .Put<int32_t>(arena != nullptr ? arena->fd() : -1)
      .Put<uint64_t>(arena != nullptr ? arena->capacity() : 0)
      .Put<uint64_t>(arena != nullptr ? arena->cookie() : 0)
      .Put<uint64_t>(transport_->identity().net_namespace);
  Inner()->Send(Message{w.Take(), {}});
}

void ShmConnection::OnMessage(Message m) {
  if (m.header.empty()) return Fail("empty message");
  if (!hello_sent_) SendHello();  // accepted side answers the dialer's hello
  Reader r(m.header);
  switch (m.header[0]) {
    case 'H': return OnHello(r);
    case 'K': {
      uint8_t can = kCanRead;  // a peer without flags (an older build) could only read
      (void)r.Get(&can);
      can &= kCanRead | kMappedArena;
      if (can != 0 && peer_can_.exchange(can, std::memory_order_acq_rel) == 0) {
        counters().connections.fetch_add(1, std::memory_order_relaxed);
      }
      return;
    }
    case 'D': return OnData(r, std::move(m.tensors));
    case 'A': return OnAck(r);
    case 'C': return OnConfirm(r, {}, false);
    case 'R': return OnConfirm(r, std::move(m.tensors), true);
    default: return Fail(absl::StrCat("unknown message type ", static_cast<int>(m.header[0])));
  }
}

void ShmConnection::OnHello(Reader& r) {
  uint64_t pid, cookie_address, cookie, arena_bytes = 0, arena_cookie = 0;
  int32_t arena_fd = -1;
  HostIdentity peer;
  if (!r.Get(&pid) || !r.Get(&cookie_address) || !r.Get(&cookie) || !r.Bytes(&peer.boot_id) || pid == 0 ||
      pid > (uint64_t{1} << 31)) {
    return Fail("malformed hello");
  }
  // The arena fields are optional: a peer without them (an older build) has no arena.
  if (r.Get(&arena_fd) && !(r.Get(&arena_bytes) && r.Get(&arena_cookie))) return Fail("malformed hello");
  // So is the network namespace; a peer that does not send it never shares memory.
  (void)r.Get(&peer.net_namespace);
  peer_key_ = static_cast<pid_t>(pid);
  if (!transport_->identity().SameHostAs(peer)) return;  // another host, container or namespace: TCP only
  uint8_t can = 0;
  uint64_t seen = 0;
  if (CmaRead(static_cast<pid_t>(pid), cookie_address, &seen, sizeof(seen)).ok() && seen == cookie) {
    peer_pid_ = static_cast<pid_t>(pid);
    can |= kCanRead;
  }
  if (arena_fd >= 0) {
    // Not permitted, or not the peer's arena: large tensors come by address or inline.
    absl::StatusOr<std::shared_ptr<PeerArena>> arena =
        PeerArena::Open(static_cast<pid_t>(pid), arena_fd, arena_bytes, arena_cookie);
    if (arena.ok()) {
      peer_arena_ = *std::move(arena);
      can |= kMappedArena;
    }
  }
  if (can == 0) return;  // stay on TCP for large tensors
  Writer k('K');
  k.Put<uint8_t>(can);
  Inner()->Send(Message{k.Take(), {}});
}

void ShmConnection::OnData(Reader& r, std::vector<Tensor> inline_tensors) {
  uint64_t token;
  uint32_t num_remote;
  if (!r.Get(&token) || !r.Get(&num_remote) || num_remote > 4096) return Fail("malformed data header");
  std::vector<RemoteTensor> remote(num_remote);
  bool any_cma = false;
  // The same limits as a frame's tensors (FrameLimits): a peer's descriptors must not make
  // this process allocate (cross-memory attach) or hold more than a frame could.
  const FrameLimits& limits = transport_->limits();
  if (num_remote > limits.max_tensors) return Fail("more tensors than FrameLimits::max_tensors");
  uint64_t remote_bytes = 0;
  for (RemoteTensor& rt : remote) {
    uint8_t route, dtype, ndim;
    if (!r.Get(&rt.index) || !r.Get(&route) || !r.Get(&dtype) || !r.Get(&ndim) ||
        route > static_cast<uint8_t>(Route::kArena) || dtype > static_cast<uint8_t>(DType::kBool) || ndim > kMaxDims) {
      return Fail("malformed tensor descriptor");
    }
    rt.route = static_cast<Route>(route);
    if (rt.route == Route::kCma && (peer_pid_ == 0 || token == 0)) return Fail("remote tensors without a verified peer");
    if (rt.route == Route::kArena && peer_arena_ == nullptr) return Fail("arena tensors from a peer whose arena is not mapped");
    any_cma = any_cma || rt.route == Route::kCma;
    rt.dtype = static_cast<DType>(dtype);
    rt.sizes.resize(ndim);
    uint64_t bytes = ElementSize(rt.dtype);
    for (auto& d : rt.sizes) {
      if (!r.Get(&d) || d < 0 || (d > 0 && bytes > (uint64_t{1} << 40) / static_cast<uint64_t>(d))) {
        return Fail("bad tensor size");
      }
      bytes *= static_cast<uint64_t>(d);
    }
    if (!r.Get(&rt.address)) return Fail("malformed tensor descriptor");
    remote_bytes += bytes;
    if (remote_bytes > limits.max_payload_bytes) {
      return Fail(absl::StrCat("tensors of more than ", limits.max_payload_bytes,
                               " bytes in one message (FrameLimits::max_payload_bytes)"));
    }
  }
  Incoming in;
  in.message.header = r.Rest();
  const size_t total = inline_tensors.size() + remote.size();
  in.message.tensors.resize(total);
  std::vector<bool> taken(total, false);
  for (const RemoteTensor& rt : remote) {
    if (rt.index >= total || taken[rt.index]) return Fail("bad tensor index");
    taken[rt.index] = true;
    if (rt.route == Route::kArena) {
      absl::StatusOr<Tensor> t = peer_arena_->Take(rt.address, rt.dtype, rt.sizes);
      if (!t.ok()) return Fail(std::string(t.status().message()));
      in.message.tensors[rt.index] = *std::move(t);
      continue;
    }
    Tensor t = Tensor::Empty(rt.sizes, rt.dtype);
    if (absl::Status s = CmaRead(peer_pid_, rt.address, t.raw_data(), t.nbytes()); !s.ok()) {
      Inner()->Close(s);
      return;
    }
    in.message.tensors[rt.index] = std::move(t);
    in.remote_index.push_back(rt.index);
  }
  size_t next = 0;
  for (size_t i = 0; i < total; ++i) {
    if (!taken[i]) in.message.tensors[i] = std::move(inline_tensors[next++]);
  }
  if (any_cma) {
    in.token = token;
    in.confirmed = false;
    Writer ack('A');
    ack.Put<uint64_t>(token);
    Inner()->Send(Message{ack.Take(), {}});
  }
  incoming_.push_back(std::move(in));
  DeliverReady();
}

void ShmConnection::OnAck(Reader& r) {
  uint64_t token;
  if (!r.Get(&token)) return Fail("malformed ack");
  Outgoing out;
  {
    absl::MutexLock lock(&mu_);
    auto it = outgoing_.find(token);
    if (it == outgoing_.end()) return Fail("ack for an unknown message");
    out = std::move(it->second);
    outgoing_.erase(it);
  }
  bool unchanged = true;
  for (size_t i = 0; i < out.tensors.size(); ++i) {
    const uint64_t now = out.tensors[i].storage()->version();
    unchanged = unchanged && now == out.versions[i] && now % 2 == 0;
  }
  if (!unchanged) {
    // Send a consistent copy: one taken while no write was in progress (even version,
    // unchanged across the copy). A caller that keeps writing gets the latest state.
    for (Tensor& t : out.tensors) {
      for (int attempt = 0;; ++attempt) {
        const uint64_t before = t.storage()->version();
        if (before % 2 == 0) {
          Tensor copy = SeqlockRead(t);
          if (t.storage()->version() == before) {
            t = std::move(copy);
            break;
          }
        }
        if (attempt > 100000) return Fail("a tensor kept changing while being re-sent");
        absl::SleepFor(absl::Microseconds(10));
      }
    }
  }
  Writer w(unchanged ? 'C' : 'R');
  w.Put<uint64_t>(token);
  // A tensor modified in place after Send: the peer may hold a torn copy, so send the
  // consistent copy through the socket instead.
  Inner()->Send(Message{w.Take(), unchanged ? std::vector<Tensor>{} : out.tensors},
                std::move(out.on_sent));
}

void ShmConnection::OnConfirm(Reader& r, std::vector<Tensor> resent, bool resend) {
  uint64_t token;
  if (!r.Get(&token)) return Fail("malformed confirm");
  for (Incoming& in : incoming_) {
    if (in.token != token || in.confirmed) continue;
    if (resend) {
      if (resent.size() != in.remote_index.size()) return Fail("resend does not match");
      for (size_t i = 0; i < resent.size(); ++i) {
        const Tensor& old = in.message.tensors[in.remote_index[i]];
        if (resent[i].sizes() != old.sizes() || resent[i].dtype() != old.dtype()) return Fail("resend does not match");
        in.message.tensors[in.remote_index[i]] = std::move(resent[i]);
      }
    }
    in.confirmed = true;
    DeliverReady();
    return;
  }
  Fail("confirmation for an unknown message");
}

void ShmConnection::DeliverReady() {
  while (!incoming_.empty() && incoming_.front().confirmed) {
    Message m = std::move(incoming_.front().message);
    incoming_.pop_front();
    if (user_.on_message) user_.on_message(shared_from_this(), std::move(m));
    delivered_ = true;
  }
}

void ShmConnection::OnClose(const absl::Status& reason) {
  // Arena blocks of messages the peer will never read come back; so do those of
  // messages it received but that wait here behind an unconfirmed one.
  if (ShmArena* arena = transport_->arena()) arena->ReleaseUntaken(id_);
  incoming_.clear();
  std::map<uint64_t, Outgoing> failed;
  {
    absl::MutexLock lock(&mu_);
    failed.swap(outgoing_);
  }
  for (auto& [_, out] : failed) {
    if (out.on_sent) out.on_sent(reason);
  }
  if (user_.on_close) user_.on_close(shared_from_this(), reason);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeShmTransport(TransportOptions options) {
  absl::StatusOr<std::unique_ptr<Transport>> tcp = MakeTcpTransport(options);
  if (!tcp.ok()) return tcp.status();
  return std::make_unique<ShmTransport>(options, *std::move(tcp));
}

}  // namespace gw::rpc
