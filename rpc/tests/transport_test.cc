// Conformance suite for every Transport backend, over real loopback sockets.
#include "gradwire/rpc/transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "gradwire/rpc/faults.h"
#include "gradwire/tensor/kernels.h"
#include "inbox.h"
#include "raw_socket.h"
#include "test_certs.h"

namespace gw::rpc {
namespace {

using testing::DialRaw;
using testing::Inbox;

// "shm-cma" is shm with its arena turned off: large tensors by cross-memory attach.
// "fault" is tcp under every recoverable fault (faults.h), which its link protocol hides.
// "<backend>+auth" authenticates every connection by a job secret; "<backend>+tls" also
// runs TLS with the test CA's certificates (test_certs.h; security.h).
absl::StatusOr<std::unique_ptr<Transport>> MakeBackend(const std::string& param, TransportOptions options = {}) {
  const std::string name = param.substr(0, param.find('+'));
  if (param != name) {
    options.security.secret = "conformance";
    if (absl::EndsWith(param, "+tls")) {
      if (testing::TestCerts::Get() == nullptr) return absl::UnavailableError(testing::TestCerts::kMissing);
      options.security.tls = testing::TestCerts::Get()->Job("a");
    }
  }
  if (name == "shm-cma") {
    options.shm_arena_bytes = 0;
    return MakeTransport("shm", options);
  }
  if (name == "fault") {
    absl::StatusOr<FaultSpec> faults = ParseFaults("drop:0.05,duplicate:0.05,reorder:4,delay:0ms-2ms,seed:7");
    if (!faults.ok()) return faults.status();
    options.faults = std::make_shared<FaultInjector>(*std::move(faults));
    return MakeTransport("tcp", options);
  }
  return MakeTransport(name, options);
}


class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto server = MakeBackend(GetParam()), client = MakeBackend(GetParam());
    if (!server.ok()) GTEST_SKIP() << server.status();  // no openssl for the test CA
    server_ = *std::move(server);
    client_ = *std::move(client);
    auto addr = server_->Listen("127.0.0.1", /*advertise_host=*/"", server_inbox_.Callbacks());
    ASSERT_TRUE(addr.ok()) << addr.status();
    address_ = *addr;
  }
  void TearDown() override {
    conn_.reset();
    if (client_) client_->Shutdown();
    if (server_) server_->Shutdown();
  }
  std::shared_ptr<Connection> Dial() {
    auto c = client_->Connect(address_, client_inbox_.Callbacks(), absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

  std::unique_ptr<Transport> server_, client_;
  std::string address_;
  Inbox server_inbox_, client_inbox_;
  std::shared_ptr<Connection> conn_;
};

TEST_P(TransportTest, MessagesFlowBothWaysInOrder) {
  conn_ = Dial();
  for (int i = 0; i < 100; ++i) {
    Message m;
    m.header = "req" + std::to_string(i);
    m.tensors = {Tensor::Full({i + 1}, i)};
    conn_->Send(std::move(m));
  }
  ASSERT_TRUE(server_inbox_.WaitMessages(100));
  auto got = server_inbox_.messages();
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(got[i].header, "req" + std::to_string(i));
    EXPECT_EQ(got[i].tensors[0].sizes(), Shape({i + 1}));
    EXPECT_EQ(got[i].tensors[0].ToVector<float>()[0], static_cast<float>(i));
  }
  server_inbox_.last_conn()->Send(Message{"reply", {}});
  ASSERT_TRUE(client_inbox_.WaitMessages(1));
  EXPECT_EQ(client_inbox_.messages()[0].header, "reply");
}

// Send, SendMany and SendCoalesced share one ordered stream; on_flush follows every run
// of deliveries; a coalesced message carries its tensors as they were when sent.
TEST_P(TransportTest, SendModesShareOneOrderedStreamAndFlushFollowsDelivery) {
  conn_ = Dial();
  Tensor mutated = Tensor::Full({16}, 7.0);
  int next = 0;
  for (int round = 0; round < 50; ++round) {
    conn_->Send(Message{std::to_string(next++), {Tensor::Full({3}, static_cast<double>(round))}});
    std::vector<Message> many;
    for (int i = 0; i < 5; ++i) many.push_back(Message{std::to_string(next++), {}});
    conn_->SendMany(std::move(many));
    conn_->SendCoalesced(Message{std::to_string(next++), {mutated}});
    kernels::Fill(mutated, -1.0);  // after the send: the receiver must still see 7
    kernels::Fill(mutated, 7.0);
    conn_->SendCoalesced(Message{std::to_string(next++), {}});
  }
  // A large coalesced message is written at once and still keeps its place.
  Generator gen(5);
  Tensor big = Tensor::Randn({1 << 18}, gen);
  conn_->SendCoalesced(Message{std::to_string(next++), {big}});
  ASSERT_TRUE(server_inbox_.WaitMessages(static_cast<size_t>(next)));
  std::vector<Message> got = server_inbox_.messages();
  ASSERT_EQ(got.size(), static_cast<size_t>(next));
  for (int i = 0; i < next; ++i) ASSERT_EQ(got[i].header, std::to_string(i));
  for (int round = 0; round < 50; ++round) {
    EXPECT_EQ(got[round * 8].tensors[0].ToVector<float>()[0], static_cast<float>(round));
    EXPECT_EQ(got[round * 8 + 6].tensors[0].ToVector<float>(), std::vector<float>(16, 7.0f));
  }
  EXPECT_EQ(kernels::MaxAbsDiff(got.back().tensors[0], big), 0.0);
  EXPECT_TRUE(server_inbox_.WaitFlushed(static_cast<size_t>(next)));
  EXPECT_EQ(server_inbox_.empty_flushes(), 0);
  // The close comes after the flush of everything delivered.
  server_inbox_.last_conn()->Close(absl::CancelledError("done"));
  ASSERT_FALSE(server_inbox_.WaitClose().ok());
  EXPECT_EQ(server_inbox_.unflushed_at_close(), 0u);
}

TEST_P(TransportTest, LargeTensorsArriveIntact) {
  conn_ = Dial();
  Generator gen(3);
  Tensor big = Tensor::Randn({64 << 18}, gen);  // 64 MiB
  Tensor small = Tensor::Randn({7}, gen, DType::kFloat64);
  struct SendResult {  // shared: the callback may outlive a failed test body
    absl::Notification sent;
    absl::Status status;
  };
  auto result = std::make_shared<SendResult>();
  conn_->Send(Message{"big", {small, big, kernels::Transpose(Tensor::Ones({3, 2}), 0, 1)}},
              [result](absl::Status s) {
                result->status = s;
                result->sent.Notify();
              });
  ASSERT_TRUE(server_inbox_.WaitMessages(1, absl::Seconds(60)));
  ASSERT_TRUE(result->sent.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(result->status.ok()) << result->status;
  Message m = server_inbox_.messages()[0];
  ASSERT_EQ(m.tensors.size(), 3u);
  EXPECT_EQ(kernels::MaxAbsDiff(m.tensors[1], big), 0.0);
  EXPECT_EQ(kernels::MaxAbsDiff(m.tensors[0], small), 0.0);
  EXPECT_EQ(m.tensors[2].sizes(), Shape({2, 3}));
}

TEST_P(TransportTest, ConcurrentSendersAllArrive) {
  conn_ = Dial();
  constexpr int kThreads = 8, kEach = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        conn_->Send(Message{std::to_string(t * kEach + i), {Tensor::Full({t % 3 == 0 ? 40000 : 4}, t)}});
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(server_inbox_.WaitMessages(kThreads * kEach));
  std::vector<bool> seen(kThreads * kEach, false);
  for (const Message& m : server_inbox_.messages()) {
    int id = -1;
    ASSERT_TRUE(absl::SimpleAtoi(m.header, &id));
    EXPECT_FALSE(seen[id]);
    seen[id] = true;
    EXPECT_EQ(m.tensors[0].ToVector<float>()[0], static_cast<float>(id / kEach));
  }
}

TEST_P(TransportTest, PeerCloseIsReportedAndLaterSendsFail) {
  conn_ = Dial();
  conn_->Send(Message{"hello", {}});
  ASSERT_TRUE(server_inbox_.WaitMessages(1));
  server_inbox_.last_conn()->Close(absl::CancelledError("bye"));
  absl::Status s = client_inbox_.WaitClose();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("127.0.0.1"), std::string::npos) << s;  // names the peer
  struct SendResult {
    absl::Notification done;
    absl::Status status;
  };
  auto result = std::make_shared<SendResult>();
  conn_->Send(Message{"late", {}}, [result](absl::Status st) {
    result->status = st;
    result->done.Notify();
  });
  ASSERT_TRUE(result->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(result->status.ok());
}

TEST_P(TransportTest, GarbageFromARawSocketClosesOnlyThatConnection) {
  // A raw client sends bytes that are not a frame.
  const int fd = DialRaw(address_);
  ASSERT_GE(fd, 0);
  const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n................";
  ASSERT_GT(::send(fd, junk, sizeof(junk), 0), 0);
  // grpc: gRPC's HTTP/2 layer rejects the bytes before the transport sees them, so no
  // Connection (and no on_close) exists for this socket; only the second half applies.
  // So with authentication or TLS, whose handshakes refuse it before it is a Connection.
  if (GetParam() != "grpc" && GetParam().find('+') == std::string::npos) {
    absl::Status s = server_inbox_.WaitClose();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    char buf[16];
    EXPECT_LE(::recv(fd, buf, sizeof(buf), 0), 0);  // the server hung up
  }
  ::close(fd);
  // The transport still serves well-behaved peers.
  conn_ = Dial();
  conn_->Send(Message{"still here", {}});
  ASSERT_TRUE(server_inbox_.WaitMessages(1));
  EXPECT_EQ(server_inbox_.messages()[0].header, "still here");
}

TEST_P(TransportTest, ConnectToNothingFailsByTheDeadline) {
  const absl::Time start = absl::Now();
  auto c = client_->Connect("127.0.0.1:1", {}, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(MakeTransport("carrier-pigeon").ok());
}

// Bound to every interface, a transport returns the host it is told to advertise, and
// peers reach it there.
TEST_P(TransportTest, ListensOnAWildcardAddressAndReturnsTheAdvertisedHost) {
  auto wildcard = MakeBackend(GetParam());
  ASSERT_TRUE(wildcard.ok());
  Inbox inbox;
  auto address = (*wildcard)->Listen("0.0.0.0", "127.0.0.1", inbox.Callbacks());
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(address->rfind("127.0.0.1:", 0), 0u) << *address;
  EXPECT_NE(*address, "127.0.0.1:0");
  auto conn = client_->Connect(*address, client_inbox_.Callbacks(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(conn.ok()) << conn.status();
  (*conn)->Send(Message{"via the wildcard", {Tensor::Full({1 << 17}, 3.0)}});
  ASSERT_TRUE(inbox.WaitMessages(1));
  EXPECT_EQ(inbox.messages()[0].header, "via the wildcard");
  (*conn)->Close(absl::CancelledError("done"));
  (*wildcard)->Shutdown();
}

TEST_P(TransportTest, TensorsModifiedAfterSendArriveWholeNeverTorn) {
  // With shm-cma the receiver copies large tensors out of the sender's memory after Send
  // returned; a sender that overwrites the tensor meanwhile must not produce a mix.
  conn_ = Dial();
  ASSERT_TRUE(testing::RoundTrip(*conn_, server_inbox_, client_inbox_));  // the shm handshake is done
  constexpr int kMessages = 20;
  for (int i = 0; i < kMessages; ++i) {
    Tensor t = Tensor::Full({1 << 20}, 1.0);  // 4 MiB
    conn_->Send(Message{std::to_string(i), {t}});
    kernels::Fill(t, 2.0);  // in place, right after sending
  }
  ASSERT_TRUE(server_inbox_.WaitMessages(kMessages, absl::Seconds(60)));
  for (const Message& m : server_inbox_.messages()) {
    const double lo = -kernels::MaxAll(kernels::Neg(m.tensors[0])).item();
    const double hi = kernels::MaxAll(m.tensors[0]).item();
    EXPECT_EQ(lo, hi) << "message " << m.header << " mixes old and new contents";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportTest,
                         ::testing::Values("tcp", "shm", "grpc", "shm-cma", "fault", "tcp+auth", "tcp+tls", "shm+tls",
                                           "grpc+tls", "fault+tls"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '+', '_');
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// shm: a receiver that keeps everything fills the sender's arena; later tensors take the
// cross-memory-attach path, and every one arrives intact (the arena's blocks are never
// reused under a tensor still held).
TEST(ShmTransportTest, AFullArenaFallsBackToCrossMemoryAttachAndNothingIsOverwritten) {
  TransportOptions small;
  small.shm_arena_bytes = 8 << 20;
  auto server = *MakeTransport("shm", small);
  auto client = *MakeTransport("shm", small);
  Inbox inbox, unused;
  auto address = server->Listen("127.0.0.1", /*advertise_host=*/"", inbox.Callbacks());
  ASSERT_TRUE(address.ok());
  auto conn = client->Connect(*address, unused.Callbacks(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(testing::RoundTrip(**conn, inbox, unused));  // the shm handshake is done
  constexpr int kMessages = 12;  // 2 MiB each: three fit in the arena
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kMessages; ++i) {
      (*conn)->Send(Message{std::to_string(i), {Tensor::Full({1 << 19}, static_cast<double>(round * kMessages + i))}});
    }
    ASSERT_TRUE(inbox.WaitMessages(static_cast<size_t>((round + 1) * kMessages), absl::Seconds(60)));
    const std::vector<Message> got = inbox.messages();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(kernels::MaxAbsDiff(got[i].tensors[0], Tensor::Full({1 << 19}, static_cast<double>(i))), 0.0)
          << "message " << i << " of round " << round;
    }
  }
  (*conn)->Close(absl::CancelledError("done"));
  client->Shutdown();
  server->Shutdown();
}

// A raw TCP client of `address` (loopback) that speaks the shm wrapper protocol.
class RawShmPeer {
 public:
  explicit RawShmPeer(const std::string& address) : fd_(DialRaw(address)) {
    EXPECT_GE(fd_, 0) << address;
    timeval timeout{20, 0};  // a guard against a hang: every read below is answered
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~RawShmPeer() { ::close(fd_); }

  void Send(const std::string& header) {
    absl::StatusOr<EncodedFrame> frame = EncodeFrame(Message{header, {}});
    ASSERT_TRUE(frame.ok());
    ASSERT_EQ(::send(fd_, frame->prefix.data(), frame->prefix.size(), 0), static_cast<ssize_t>(frame->prefix.size()));
  }
  // The type bytes of the frames received until one of type `last` (inclusive).
  std::string ReadUntil(char last) {
    std::string types;
    while (true) {
      absl::Span<char> buffer = decoder_.NextBuffer();
      const ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), 0);
      if (n <= 0 || !decoder_.Advance(static_cast<size_t>(n)).ok()) return types + "<closed>";
      if (!decoder_.HasMessage()) continue;
      const Message m = decoder_.TakeMessage();
      types += m.header.empty() ? '?' : m.header[0];
      if (!m.header.empty() && m.header[0] == last) return types;
    }
  }

 private:
  const int fd_;
  FrameDecoder decoder_;
};

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// An shm hello ('H'), field by field.
struct HelloFields {
  uint64_t pid = 0;
  uint64_t cookie_address = 0;
  uint64_t cookie = 0;
  std::string boot_id;
  int32_t arena_fd = -1;
  uint64_t arena_bytes = 0;
  uint64_t arena_cookie = 0;
  uint64_t net_namespace = 0;  // 0: left out, as an older build does
};

std::string Hello(const HelloFields& f) {
  std::string hello = "H";
  Put(hello, f.pid);
  Put(hello, f.cookie_address);
  Put(hello, f.cookie);
  Put(hello, static_cast<uint32_t>(f.boot_id.size()));
  hello += f.boot_id;
  Put(hello, f.arena_fd);
  Put(hello, f.arena_bytes);
  Put(hello, f.arena_cookie);
  if (f.net_namespace != 0) Put(hello, f.net_namespace);
  return hello;
}

// shm: a peer that sends arena descriptors without an arena the receiver mapped (here a
// raw socket speaking the wrapper protocol) is cut off, as any malformed input.
TEST(ShmTransportTest, ArenaDescriptorsFromAPeerWithoutAMappedArenaCloseTheConnection) {
  auto server = *MakeTransport("shm");
  Inbox inbox;
  auto address = server->Listen("127.0.0.1", /*advertise_host=*/"", inbox.Callbacks());
  ASSERT_TRUE(address.ok());
  RawShmPeer peer(*address);
  // Hello from "pid 1" on another host, claiming an arena it has no way to share.
  const std::string hello =
      Hello({.pid = 1, .boot_id = "other", .arena_fd = 3, .arena_bytes = uint64_t{1} << 20, .arena_cookie = 42});
  // Data whose only tensor is "in the arena" at a plausible offset.
  std::string data = "D";
  Put(data, uint64_t{0});      // token
  Put(data, uint32_t{1});      // one remote tensor
  Put(data, uint32_t{0});      // index
  Put(data, uint8_t{1});       // route: arena
  Put(data, uint8_t{0});       // float32
  Put(data, uint8_t{1});       // one dim
  Put(data, int64_t{1000});
  Put(data, uint64_t{4096 + 64});
  data += "payload";
  peer.Send(hello);
  peer.Send(data);
  absl::Status s = inbox.WaitClose();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("arena"), std::string::npos) << s;
  EXPECT_TRUE(inbox.messages().empty());
  server->Shutdown();
}

// shm: shared memory only between processes on one boot *and* in one network namespace
// (processes in different namespaces stand for different hosts, though they could read
// each other's memory): a hello that differs from a genuine same-host one in the
// namespace alone, or that does not name its namespace, gets no 'K' (large tensors stay
// on TCP). The genuine one shows the check passes otherwise.
TEST(ShmTransportTest, SharedMemoryOnlyWithAPeerOfTheSameBootAndNetworkNamespace) {
  std::string boot_id;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot_id);
  struct stat ns {};
  ASSERT_EQ(::stat("/proc/self/ns/net", &ns), 0);
  const uint64_t net_namespace = ns.st_ino;
  const uint64_t cookie = 0x5eed5eed12345678;
  struct Case {
    const char* what;
    std::string boot_id;
    uint64_t net_namespace;
    bool shares_memory;
  };
  const Case cases[] = {
      {"the same boot and namespace", boot_id, net_namespace, true},
      {"another network namespace", boot_id, net_namespace + 1, false},
      {"no network namespace", boot_id, 0, false},
      {"another boot", boot_id + "x", net_namespace, false},
  };
  for (const Case& c : cases) {
    auto server = *MakeTransport("shm");
    Inbox inbox;
    auto address = server->Listen("127.0.0.1", /*advertise_host=*/"", inbox.Callbacks());
    ASSERT_TRUE(address.ok());
    RawShmPeer peer(*address);
    // The hello of a peer that is this very process (so its cookie can be read), as it
    // would come from that boot and namespace; no arena (large tensors would come by
    // cross-memory attach).
    peer.Send(Hello({.pid = static_cast<uint64_t>(::getpid()),
                     .cookie_address = reinterpret_cast<uint64_t>(&cookie),
                     .cookie = cookie,
                     .boot_id = c.boot_id,
                     .net_namespace = c.net_namespace}));
    std::string data = "D";
    Put(data, uint64_t{0});  // no token
    Put(data, uint32_t{0});  // no remote tensors
    peer.Send(data + "ping");
    ASSERT_TRUE(inbox.WaitMessages(1)) << c.what;
    EXPECT_EQ(inbox.messages()[0].header, "ping");
    // The server answers a hello (and sends 'K' if it will share memory) before it
    // delivers the next message, so the reply comes after either.
    inbox.last_conn()->Send(Message{"pong", {}});
    EXPECT_EQ(peer.ReadUntil('D'), c.shares_memory ? "HKD" : "HD") << c.what;
    server->Shutdown();
  }
}

// shm: stats() counts what went through shared memory; tcp's stay zero.
TEST(ShmTransportTest, StatsCountConnectionsAndTensorsThroughSharedMemory) {
  for (const char* name : {"shm", "shm-cma", "tcp"}) {
    auto server = *MakeBackend(name);
    auto client = *MakeBackend(name);
    Inbox inbox, replies;
    auto address = server->Listen("127.0.0.1", /*advertise_host=*/"", inbox.Callbacks());
    ASSERT_TRUE(address.ok());
    auto conn = client->Connect(*address, replies.Callbacks(), absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(conn.ok());
    // The server's reply goes out after it handled the client's hello and sent its 'K';
    // the client's next sends go out after it handled the server's.
    (*conn)->Send(Message{"hello", {}});
    ASSERT_TRUE(inbox.WaitMessages(1));
    inbox.last_conn()->Send(Message{"hello back", {}});
    ASSERT_TRUE(replies.WaitMessages(1));
    (*conn)->Send(Message{"big", {Tensor::Full({1 << 20}, 1.0), Tensor::Full({4}, 2.0)}});
    ASSERT_TRUE(inbox.WaitMessages(2));
    const TransportStats stats = client->stats();
    const bool shm = std::string(name) != "tcp";
    EXPECT_EQ(stats.shared_memory_connections, shm ? 1 : 0) << name;
    EXPECT_EQ(stats.shared_memory_tensors, shm ? 1 : 0) << name;
    (*conn)->Close(absl::CancelledError("done"));
    client->Shutdown();
    server->Shutdown();
  }
}

}  // namespace
}  // namespace gw::rpc
