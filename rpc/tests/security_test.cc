// Security (security.h): the job secret's challenge-response, TLS with mutual
// certificates and the limits on a peer, on every transport and on the rendezvous store,
// over real loopback sockets, against real peers and raw ones that send what they like.
#include "gradwire/rpc/security.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent_group.h"
#include "etcd_server.h"
#include "gradwire/proto/store.grpc.pb.h"
#include "gradwire/proto/transport.grpc.pb.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/rpc/store.h"
#include "gradwire/rpc/transport.h"
#include "gradwire/tensor/kernels.h"
#include "inbox.h"
#include "raw_socket.h"
#include "scoped_env.h"
#include "scoped_temp_dir.h"
#include "security/handshake.h"
#include "store/store_sessions.h"
#include "test_certs.h"

namespace gw::rpc {
namespace {

namespace pb = ::gradwire::proto;
using internal::Handshake;
using testing::DialRaw;
using testing::Inbox;
using testing::ScopedEnv;
using Certs = testing::TestCerts;

constexpr char kSecret[] = "the job's secret";
constexpr char kOtherSecret[] = "another job's secret";

Security WithSecret(const std::string& secret, TlsOptions tls = {}) {
  Security s;
  s.secret = secret;
  s.tls = std::move(tls);
  s.handshake_timeout = absl::Seconds(5);
  return s;
}

// ---------------------------------------------------------------- the handshake itself

// Runs client and server handshakes against each other; the first error, if any.
absl::Status Converse(Handshake& client, Handshake& server, std::vector<std::string>* client_said = nullptr) {
  Handshake* sides[2] = {&client, &server};
  for (int turn = 0; turn < 8; ++turn) {
    Handshake& from = *sides[turn % 2];
    Handshake& to = *sides[(turn + 1) % 2];
    std::string out = from.TakeOutput();
    if (out.empty()) return absl::OkStatus();
    if (client_said != nullptr && &from == &client) client_said->push_back(out);
    if (absl::Status s = to.OnInput(out); !s.ok()) {
      if (&to == &server) (void)Converse(client, server);  // the verdict reaches the client
      return s;
    }
  }
  return absl::OkStatus();
}

TEST(HandshakeTest, BothSidesProveTheSecretAndShareASessionKey) {
  Handshake client(Handshake::Role::kClient, kSecret, "rpc");
  Handshake server(Handshake::Role::kServer, kSecret, "rpc");
  ASSERT_TRUE(Converse(client, server).ok());
  EXPECT_TRUE(client.done());
  EXPECT_TRUE(server.done());
  EXPECT_EQ(client.session_key(), server.session_key());
  EXPECT_EQ(client.session_key().size(), 32u);
  Handshake again(Handshake::Role::kClient, kSecret, "rpc");
  Handshake server2(Handshake::Role::kServer, kSecret, "rpc");
  ASSERT_TRUE(Converse(again, server2).ok());
  EXPECT_NE(again.session_key(), client.session_key()) << "fresh nonces make fresh sessions";
}

TEST(HandshakeTest, AWrongSecretIsRefusedOnEitherSide) {
  // The server cannot prove our secret: the client stops before it proves anything.
  Handshake client(Handshake::Role::kClient, kSecret, "rpc");
  Handshake impostor(Handshake::Role::kServer, kOtherSecret, "rpc");
  ASSERT_TRUE(impostor.OnInput(client.TakeOutput()).ok());
  absl::Status s = client.OnInput(impostor.TakeOutput());
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_TRUE(client.TakeOutput().empty()) << "no proof for an impostor";
  EXPECT_FALSE(client.done());

  // A client that ignores the server's proof and answers with another secret is refused
  // by the server, which says so in its verdict.
  Handshake server(Handshake::Role::kServer, kSecret, "rpc");
  Handshake stranger(Handshake::Role::kClient, kOtherSecret, "rpc");
  ASSERT_TRUE(server.OnInput(stranger.TakeOutput()).ok());
  const std::string challenge = server.TakeOutput();
  const std::string sn = challenge.substr(8, Handshake::kNonceBytes);
  // What a client holding kOtherSecret would send, had it not checked the server's proof.
  const std::string forged = Handshake::Mac(kOtherSecret, absl::StrCat("gradwire client|rpc|", sn, std::string(32, 'x')));
  s = server.OnInput(forged);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(server.TakeOutput(), "GWAUTHNO");
  EXPECT_FALSE(server.done());
}

TEST(HandshakeTest, ARecordedHandshakeReplayedIsRefused) {
  Handshake client(Handshake::Role::kClient, kSecret, "rpc");
  Handshake server(Handshake::Role::kServer, kSecret, "rpc");
  std::vector<std::string> recorded;
  ASSERT_TRUE(Converse(client, server, &recorded).ok());
  ASSERT_EQ(recorded.size(), 2u);  // hello, proof
  Handshake fresh(Handshake::Role::kServer, kSecret, "rpc");
  ASSERT_TRUE(fresh.OnInput(recorded[0]).ok());
  (void)fresh.TakeOutput();  // a new challenge: the recorded proof answers another
  absl::Status s = fresh.OnInput(recorded[1]);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_FALSE(fresh.done());
}

TEST(HandshakeTest, AProofForOneProtocolIsNoProofForAnother) {
  Handshake client(Handshake::Role::kClient, kSecret, "store");
  Handshake server(Handshake::Role::kServer, kSecret, "rpc");
  EXPECT_EQ(Converse(client, server).code(), absl::StatusCode::kPermissionDenied);
}

TEST(HandshakeTest, FramesOrGarbageInsteadOfAHelloAreNotAHandshake) {
  Handshake server(Handshake::Role::kServer, kSecret, "rpc");
  std::string frame(Handshake::kHelloBytes, '\0');
  frame.replace(0, 4, "GWFR");
  absl::Status s = server.OnInput(frame);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(s.message().find("without authenticating"), std::string::npos) << s;
  Handshake server2(Handshake::Role::kServer, kSecret, "rpc");
  EXPECT_EQ(server2.OnInput(std::string(Handshake::kHelloBytes, 'z')).code(), absl::StatusCode::kUnauthenticated);
}

// ---------------------------------------------------------------- transports


// Reads exactly n bytes (or fewer when the peer closes first; waits up to 20 s).
std::string ReadRaw(int fd, size_t n) {
  std::string out;
  char buf[256];
  while (out.size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20000) <= 0) break;
    const ssize_t r = ::recv(fd, buf, std::min(sizeof(buf), n - out.size()), 0);
    if (r <= 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

// True once the peer closed the connection (EOF or reset), within 20 s.
bool ClosedByPeer(int fd) {
  char buf[256];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20000) <= 0) return false;
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) return true;
  }
}

bool SendRaw(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

Message Hello() {
  Message m;
  m.header = "hello";
  m.tensors.push_back(Tensor::Full({32768}, 2.5f));  // 128 KiB: shm's arena takes it
  return m;
}

// Backends: tcp, shm, grpc; "+tls" adds TLS with the job's certificates.
class SecureTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string backend() const { return GetParam().substr(0, GetParam().find('+')); }
  bool tls() const { return GetParam().find("+tls") != std::string::npos; }

  void SetUp() override {
    if (tls() && Certs::Get() == nullptr) GTEST_SKIP() << Certs::kMissing;
    server_ = Make(WithSecret(kSecret, tls() ? Certs::Get()->Job("a") : TlsOptions{}));
    ASSERT_NE(server_, nullptr);
    auto addr = server_->Listen("127.0.0.1", "", server_inbox_.Callbacks());
    ASSERT_TRUE(addr.ok()) << addr.status();
    address_ = *addr;
  }
  void TearDown() override {
    for (auto& t : clients_) t->Shutdown();
    if (server_) server_->Shutdown();
    inboxes_.clear();  // they hold connections, which must not outlive their transports
  }

  std::unique_ptr<Transport> Make(Security security, FrameLimits limits = {}) {
    TransportOptions o;
    o.limits = limits;
    o.security = std::move(security);
    absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport(backend(), o);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }
  // Dials the server with `security` (the job's certificates when the test runs TLS and
  // `security` has none).
  absl::StatusOr<std::shared_ptr<Connection>> Dial(Security security, Inbox& inbox) {
    if (tls() && !security.tls.enabled()) security.tls = Certs::Get()->Job("b");
    clients_.push_back(Make(std::move(security)));
    return clients_.back()->Connect(address_, inbox.Callbacks(), absl::Now() + absl::Seconds(10));
  }
  // The server still serves a peer with the secret.
  void ExpectServesTheJob() {
    Inbox& inbox = NewInbox();
    auto c = Dial(WithSecret(kSecret), inbox);
    ASSERT_TRUE(c.ok()) << c.status();
    const size_t before = server_inbox_.messages().size();
    (*c)->Send(Hello());
    ASSERT_TRUE(server_inbox_.WaitMessages(before + 1));
    EXPECT_EQ(server_inbox_.messages().back().header, "hello");
  }

  // An inbox that outlives every connection's callbacks (they report to it until their
  // transport shuts down); TearDown drops them before the transports go.
  Inbox& NewInbox() { return *inboxes_.emplace_back(std::make_unique<Inbox>()); }

  std::vector<std::unique_ptr<Inbox>> inboxes_;
  Inbox& server_inbox_ = NewInbox();
  std::unique_ptr<Transport> server_;
  std::vector<std::unique_ptr<Transport>> clients_;
  std::string address_;
};

// Peers that speak the tcp framing from raw sockets (plain tcp and shm).
class RawSecureTransportTest : public SecureTransportTest {};
// TLS only.
class TlsSecureTransportTest : public SecureTransportTest {};

TEST_P(SecureTransportTest, PeersWithTheSecretExchangeFrames) {
  Inbox& inbox = NewInbox();
  auto c = Dial(WithSecret(kSecret), inbox);
  ASSERT_TRUE(c.ok()) << c.status();
  (*c)->Send(Hello());
  ASSERT_TRUE(server_inbox_.WaitMessages(1));
  Message got = server_inbox_.messages()[0];
  EXPECT_EQ(got.header, "hello");
  EXPECT_EQ(got.tensors[0].data<float>()[32767], 2.5f);
}

TEST_P(SecureTransportTest, APeerWithAnotherSecretIsRefusedAndNeverReachesTheReceiver) {
  Inbox& inbox = NewInbox();
  auto c = Dial(WithSecret(kOtherSecret), inbox);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied) << c.status();
  EXPECT_NE(c.status().message().find("secret"), std::string::npos) << c.status();
  EXPECT_TRUE(server_inbox_.messages().empty());
  ExpectServesTheJob();
}

TEST_P(SecureTransportTest, APeerWithoutTheSecretIsCutOffBeforeItsFirstFrame) {
  Inbox& inbox = NewInbox();
  Security none;
  none.authenticate = false;
  auto c = Dial(none, inbox);
  if (c.ok()) {  // tcp/shm/grpc let it dial; its first frame is taken for a hello and refused
    (*c)->Send(Hello());
    EXPECT_FALSE(inbox.WaitClose().code() == absl::StatusCode::kDeadlineExceeded) << "the server closes it";
  }
  EXPECT_TRUE(server_inbox_.messages().empty());
  ExpectServesTheJob();
}

TEST_P(RawSecureTransportTest, AReplayedHandshakeIsRefused) {
  // Record a genuine handshake on the wire...
  std::vector<std::string> recorded;
  {
    const int fd = DialRaw(address_);
    ASSERT_GE(fd, 0);
    Handshake client(Handshake::Role::kClient, kSecret, "rpc");
    recorded.push_back(client.TakeOutput());
    ASSERT_TRUE(SendRaw(fd, recorded.back()));
    ASSERT_TRUE(client.OnInput(ReadRaw(fd, Handshake::kChallengeBytes)).ok());
    recorded.push_back(client.TakeOutput());
    ASSERT_TRUE(SendRaw(fd, recorded.back()));
    EXPECT_EQ(ReadRaw(fd, Handshake::kVerdictBytes), "GWAUTHOK");
    ::close(fd);
  }
  // ...and play it again: the server's challenge is new, so the recorded proof is wrong.
  const int fd = DialRaw(address_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendRaw(fd, recorded[0]));
  EXPECT_EQ(ReadRaw(fd, Handshake::kChallengeBytes).size(), Handshake::kChallengeBytes);
  ASSERT_TRUE(SendRaw(fd, recorded[1]));
  EXPECT_EQ(ReadRaw(fd, Handshake::kVerdictBytes), "GWAUTHNO");
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);
  EXPECT_TRUE(server_inbox_.messages().empty());
}

TEST_P(RawSecureTransportTest, GarbageBeforeOrInsideTheHandshakeClosesOnlyThatConnection) {
  for (const std::string& garbage :
       {std::string(64, '\xff'), std::string("GWAUTH01") + std::string(10, 'n'),  // short, then silent
        std::string("GWAUTH01") + std::string(32, 'n') + std::string(32, 'p')}) {  // a made-up proof
    const int fd = DialRaw(address_);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendRaw(fd, garbage));
    EXPECT_TRUE(ClosedByPeer(fd)) << "closed (at once, or at the handshake timeout)";
    ::close(fd);
  }
  EXPECT_TRUE(server_inbox_.messages().empty());
  ExpectServesTheJob();
}

TEST_P(RawSecureTransportTest, APeerThatStallsInTheHandshakeIsCutOffAtTheTimeout) {
  server_->Shutdown();
  Security s = WithSecret(kSecret);
  s.handshake_timeout = absl::Milliseconds(300);
  server_ = Make(s);
  address_ = *server_->Listen("127.0.0.1", "", server_inbox_.Callbacks());
  const int fd = DialRaw(address_);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);
  ExpectServesTheJob();
}

TEST_P(SecureTransportTest, ConnectionsPastTheRatePerAddressAreClosedWhileOthersGoOn) {
  server_->Shutdown();
  Security s = WithSecret(kSecret, tls() ? Certs::Get()->Job("a") : TlsOptions{});
  s.limits.max_connections_per_second = 2;  // a burst of 4
  server_ = Make(s);
  address_ = *server_->Listen("127.0.0.1", "", server_inbox_.Callbacks());
  Inbox& inbox = NewInbox();
  auto kept = Dial(WithSecret(kSecret), inbox);  // one of the burst
  ASSERT_TRUE(kept.ok()) << kept.status();
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    Inbox& other = NewInbox();
    auto c = Dial(WithSecret(kSecret), other);
    if (!c.ok()) ++refused;
  }
  EXPECT_GE(refused, 12 - 4) << "the bucket holds a burst of twice the rate";
  (*kept)->Send(Hello());
  EXPECT_TRUE(server_inbox_.WaitMessages(1)) << "an admitted connection goes on";
}

// FrameLimits on every path: a message whose tensors exceed max_payload_bytes closes
// only its sender's connection (shm: also tensors sent by shared memory or cross-memory
// attach, which would make the receiver hold or allocate them), and other peers go on.
TEST_P(SecureTransportTest, AMessagePastTheFrameLimitClosesOnlyItsConnection) {
  server_->Shutdown();
  server_ = Make(WithSecret(kSecret, tls() ? Certs::Get()->Job("a") : TlsOptions{}),
                 FrameLimits{.max_payload_bytes = 1 << 20});
  address_ = *server_->Listen("127.0.0.1", "", server_inbox_.Callbacks());
  Inbox& big = NewInbox();
  auto sender = Dial(WithSecret(kSecret), big);
  ASSERT_TRUE(sender.ok()) << sender.status();
  Message m;
  m.header = "too big";
  m.tensors.push_back(Tensor::Full({1 << 19}, 1.f));  // 2 MiB
  (*sender)->Send(m);
  EXPECT_NE(big.WaitClose().code(), absl::StatusCode::kDeadlineExceeded) << "the server closes it";
  ExpectServesTheJob();
  for (const Message& got : server_inbox_.messages()) EXPECT_NE(got.header, "too big");
}

TEST_P(TlsSecureTransportTest, TlsWithACertificateOfAnotherCaIsRefused) {
  Inbox& inbox = NewInbox();
  auto c = Dial(WithSecret(kSecret, Certs::Get()->Other()), inbox);
  if (c.ok()) {  // grpc may connect lazily: the stream fails
    (*c)->Send(Hello());
    EXPECT_NE(inbox.WaitClose().code(), absl::StatusCode::kDeadlineExceeded);
  } else {
    EXPECT_TRUE(c.status().code() == absl::StatusCode::kPermissionDenied ||
                c.status().code() == absl::StatusCode::kUnavailable)
        << c.status();
  }
  EXPECT_TRUE(server_inbox_.messages().empty());
  ExpectServesTheJob();
}

TEST_P(TlsSecureTransportTest, APlainPeerCannotTalkToATlsOne) {
  Inbox& inbox = NewInbox();
  TransportOptions o;
  o.security = WithSecret(kSecret);  // no TLS
  clients_.push_back(*MakeTransport(backend(), o));
  auto c = clients_.back()->Connect(address_, inbox.Callbacks(), absl::Now() + absl::Seconds(3));
  EXPECT_FALSE(c.ok());
  EXPECT_TRUE(server_inbox_.messages().empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, SecureTransportTest,
                         ::testing::Values("tcp", "shm", "grpc", "tcp+tls", "shm+tls", "grpc+tls"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '+', '_');
                           return n;
                         });
INSTANTIATE_TEST_SUITE_P(Backends, RawSecureTransportTest, ::testing::Values("tcp", "shm"));
INSTANTIATE_TEST_SUITE_P(Backends, TlsSecureTransportTest, ::testing::Values("tcp+tls", "shm+tls", "grpc+tls"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '+', '_');
                           return n;
                         });

// The grpc transport's handshake is its stream's first messages: replayed, it is refused.
TEST(GrpcTransportSecurityTest, AReplayedHandshakeIsRefused) {
  Inbox inbox;  // outlives the transport
  TransportOptions o;
  o.security = WithSecret(kSecret);
  auto server = *MakeTransport("grpc", o);
  const std::string address = *server->Listen("127.0.0.1", "", inbox.Callbacks());
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = pb::FrameStream::NewStub(channel);
  auto exchange = [&](const std::vector<std::string>& say, std::vector<std::string>* heard) {
    grpc::ClientContext ctx;
    auto stream = stub->Stream(&ctx);
    pb::FrameChunk chunk;
    for (const std::string& s : say) {
      chunk.set_data(s);
      if (!stream->Write(chunk) || !stream->Read(&chunk)) break;
      heard->push_back(chunk.data());
    }
    stream->WritesDone();
    return stream->Finish();
  };
  Handshake client(Handshake::Role::kClient, kSecret, "rpc");
  std::vector<std::string> recorded = {client.TakeOutput()};
  {  // the genuine one, step by step
    grpc::ClientContext ctx;
    auto stream = stub->Stream(&ctx);
    pb::FrameChunk chunk;
    chunk.set_data(recorded[0]);
    ASSERT_TRUE(stream->Write(chunk));
    ASSERT_TRUE(stream->Read(&chunk));
    ASSERT_TRUE(client.OnInput(chunk.data()).ok());
    recorded.push_back(client.TakeOutput());
    chunk.set_data(recorded[1]);
    ASSERT_TRUE(stream->Write(chunk));
    ASSERT_TRUE(stream->Read(&chunk));
    EXPECT_EQ(chunk.data(), "GWAUTHOK");
    ctx.TryCancel();
    (void)stream->Finish();
  }
  std::vector<std::string> heard;
  grpc::Status replay = exchange(recorded, &heard);
  EXPECT_EQ(replay.error_code(), grpc::StatusCode::UNAUTHENTICATED) << replay.error_message();
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[1], "GWAUTHNO");
  EXPECT_TRUE(inbox.messages().empty());
  server->Shutdown();
}

// ---------------------------------------------------------------- the store

class StoreSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start("127.0.0.1", 0, WithSecret(kSecret));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = pb::Store::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  // A session opened by hand, as a client holding the secret would (store_sessions.h).
  std::unique_ptr<internal::CallSigner> OpenSession(std::vector<std::string>* recorded = nullptr) {
    Handshake hs(Handshake::Role::kClient, kSecret, std::string(internal::kStorePurpose));
    pb::HelloRequest hello;
    hello.set_hello(hs.TakeOutput());
    pb::HelloResponse challenge;
    grpc::ClientContext c1;
    EXPECT_TRUE(stub_->Hello(&c1, hello, &challenge).ok());
    EXPECT_TRUE(hs.OnInput(challenge.challenge()).ok());
    pb::ProveRequest prove;
    prove.set_handshake(challenge.handshake());
    prove.set_proof(hs.TakeOutput());
    pb::ProveResponse verdict;
    grpc::ClientContext c2;
    EXPECT_TRUE(stub_->Prove(&c2, prove, &verdict).ok());
    EXPECT_TRUE(hs.OnInput(verdict.verdict()).ok());
    if (recorded != nullptr) *recorded = {hello.hello(), prove.proof()};
    return std::make_unique<internal::CallSigner>(verdict.session(), hs.session_key());
  }
  grpc::Status RawSet(const internal::CallSigner::Signature& sig, const pb::SetRequest& req) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("gw-session", sig.session);
    ctx.AddMetadata("gw-seq", sig.seq);
    ctx.AddMetadata("gw-mac", sig.mac);
    pb::SetResponse resp;
    return stub_->Set(&ctx, req, &resp);
  }

  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<pb::Store::Stub> stub_;
};

TEST_F(StoreSecurityTest, AClientWithTheSecretIsServed) {
  auto store = ConnectStore(server_->address(), absl::Now() + absl::Seconds(5), WithSecret(kSecret));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  EXPECT_EQ(*(*store)->Get("k", absl::Seconds(1)), "v");
  EXPECT_EQ(*(*store)->Add("n", 2), 2);
  EXPECT_TRUE((*store)->Wait({"k", "n"}, absl::Seconds(1)).ok());
  EXPECT_TRUE(*(*store)->Delete("k"));
}

TEST_F(StoreSecurityTest, ClientsWithoutOrWithAnotherSecretAreRefused) {
  auto plain = ConnectStore(server_->address(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(plain.ok());
  absl::Status s = (*plain)->Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_NE(s.message().find("secret"), std::string::npos) << s;
  EXPECT_EQ((*plain)->Get("k", absl::Milliseconds(10)).status().code(), absl::StatusCode::kUnauthenticated);
  auto wrong = ConnectStore(server_->address(), absl::Now() + absl::Seconds(5), WithSecret(kOtherSecret));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied) << wrong.status();
  // A client with a secret does not take a store that cannot prove it holds it too.
  auto open = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(open.ok());
  auto doubtful = ConnectStore((*open)->address(), absl::Now() + absl::Seconds(5), WithSecret(kSecret));
  EXPECT_FALSE(doubtful.ok());
}

TEST_F(StoreSecurityTest, AReplayedHandshakeOrCallIsRefused) {
  std::vector<std::string> recorded;
  std::unique_ptr<internal::CallSigner> signer = OpenSession(&recorded);
  // The handshake again: a new challenge, so the recorded proof fails.
  pb::HelloRequest hello;
  hello.set_hello(recorded[0]);
  pb::HelloResponse challenge;
  grpc::ClientContext c1;
  ASSERT_TRUE(stub_->Hello(&c1, hello, &challenge).ok());
  pb::ProveRequest prove;
  prove.set_handshake(challenge.handshake());
  prove.set_proof(recorded[1]);
  pb::ProveResponse verdict;
  grpc::ClientContext c2;
  ASSERT_TRUE(stub_->Prove(&c2, prove, &verdict).ok());
  EXPECT_EQ(verdict.verdict(), "GWAUTHNO");
  EXPECT_EQ(verdict.session(), 0u);
  // A signed call works once; replayed, or altered, it is refused.
  pb::SetRequest req;
  req.set_key("k");
  req.set_value("v");
  const internal::CallSigner::Signature sig = signer->Sign("Set", req.SerializeAsString());
  EXPECT_TRUE(RawSet(sig, req).ok());
  grpc::Status again = RawSet(sig, req);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(again.error_message().find("replayed"), std::string::npos) << again.error_message();
  pb::SetRequest altered = req;
  altered.set_value("evil");
  const internal::CallSigner::Signature sig2 = signer->Sign("Set", req.SerializeAsString());
  EXPECT_EQ(RawSet(sig2, altered).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  auto store = ConnectStore(server_->address(), absl::Now() + absl::Seconds(5), WithSecret(kSecret));
  EXPECT_EQ(*(*store)->Get("k", absl::Seconds(1)), "v");
}

TEST(StoreTlsTest, OnlyClientsWithACertificateOfTheJobCaAreServed) {
  if (Certs::Get() == nullptr) GTEST_SKIP() << Certs::kMissing;
  auto server = StoreServer::Start("127.0.0.1", 0, WithSecret(kSecret, Certs::Get()->Job("a")));
  ASSERT_TRUE(server.ok()) << server.status();
  auto good = ConnectStore((*server)->address(), absl::Now() + absl::Seconds(5), WithSecret(kSecret, Certs::Get()->Job("b")));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->Set("k", "v").ok());
  auto stranger = ConnectStore((*server)->address(), absl::Now() + absl::Seconds(2), WithSecret(kSecret, Certs::Get()->Other()));
  EXPECT_FALSE(stranger.ok());
  auto plain = ConnectStore((*server)->address(), absl::Now() + absl::Seconds(2), WithSecret(kSecret));
  EXPECT_FALSE(plain.ok());
}

TEST(EtcdTlsTest, EtcdWithClientCertificatesServesOnlyTheJob) {
  if (!testing::EtcdServer::Available()) GTEST_SKIP() << testing::EtcdServer::kMissing;
  if (Certs::Get() == nullptr) GTEST_SKIP() << Certs::kMissing;
  auto etcd = testing::EtcdServer::Start(Certs::Get()->Job("a"));
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  Security job;
  job.tls = Certs::Get()->Job("b");
  auto good = ConnectStore((*etcd)->Url("tls"), absl::Now() + absl::Seconds(10), job);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE((*good)->Set("k", "v").ok());
  EXPECT_EQ(*(*good)->Get("k", absl::Seconds(1)), "v");
  Security stranger;
  stranger.tls = Certs::Get()->Other();
  EXPECT_FALSE(ConnectStore((*etcd)->Url("tls"), absl::Now() + absl::Seconds(2), stranger).ok());
  EXPECT_FALSE(ConnectStore((*etcd)->Url("tls"), absl::Now() + absl::Seconds(2)).ok()) << "plain text refused";
}

// ---------------------------------------------------------------- the secret file

// Whether descriptor `fd` of this process is open in a program it executes (a real
// child: fork, exec /bin/sh, which looks at its own descriptor table).
bool InheritedByChild(int fd) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return false;
  const std::string script = absl::StrCat("if test -e /proc/$$/fd/", fd, "; then echo open; else echo closed; fi");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  std::string said;
  char buffer[64];
  for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    said.append(buffer, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(said == "open\n" || said == "closed\n") << said;
  return said == "open\n";
}

// What `gradwire launch` hands a worker: a sealed memfd holding `secret`, open across
// exec (not close-on-exec), as GRADWIRE_SECRET_FILE=/proc/self/fd/N.
class InheritedSecret {
 public:
  explicit InheritedSecret(const std::string& secret) {
    fd_ = ::memfd_create("test-job-secret", MFD_ALLOW_SEALING);  // no MFD_CLOEXEC: inherited
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(::write(fd_, secret.data(), secret.size()), static_cast<ssize_t>(secret.size()));
    EXPECT_EQ(::fcntl(fd_, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  }
  ~InheritedSecret() { ::close(fd_); }
  int fd() const { return fd_; }
  std::string path() const { return absl::StrCat("/proc/self/fd/", fd_); }

 private:
  int fd_ = -1;
};

// A worker reads the secret from the descriptor it inherited, and from then on the
// programs it starts do not inherit it; reading again (another agent in the process)
// still works.
TEST(SecretFileTest, AnInheritedSecretIsReadAndNotPassedOnToChildren) {
  ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  InheritedSecret memfd("a launcher's secret\n");
  ScopedEnv file("GRADWIRE_SECRET_FILE", memfd.path().c_str());
  ASSERT_TRUE(InheritedByChild(memfd.fd())) << "the test's memfd is inherited before the secret is read";
  absl::StatusOr<Security> s = Security::FromEnv();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->secret, "a launcher's secret");
  EXPECT_NE(::fcntl(memfd.fd(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_FALSE(InheritedByChild(memfd.fd())) << "a worker's children must not inherit the job secret";
  absl::StatusOr<Security> again = Security::FromEnv();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->secret, "a launcher's secret");
}

// Something between the launcher and the worker closed the descriptor (Python's
// subprocess without pass_fds, sudo): the error says so, and how to keep it.
TEST(SecretFileTest, AClosedInheritedDescriptorIsNamedWithAHint) {
  ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  // A number far above those in use, so no other thread of the test opens it meanwhile.
  const int closed = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 1000);
  ASSERT_GE(closed, 1000);
  ::close(closed);
  ASSERT_EQ(::fcntl(closed, F_GETFD), -1) << "descriptor " << closed << " should be closed";
  const std::string path = absl::StrCat("/proc/self/fd/", closed);
  ScopedEnv file("GRADWIRE_SECRET_FILE", path.c_str());
  absl::StatusOr<Security> s = Security::FromEnv();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find(absl::StrCat("GRADWIRE_SECRET_FILE=", path, " cannot be read: descriptor ",
                                                   closed, " is not open in this process: the descriptor ", closed,
                                                   " that `gradwire launch` passed")),
            std::string::npos)
      << s.status();
  EXPECT_NE(s.status().message().find(absl::StrCat("pass_fds=(", closed, ",)")), std::string::npos) << s.status();
}

// The number was reused for a pipe or a socket: reading it could block for ever or give
// someone else's bytes (a misleading "the secret differs" later). Refused at once.
TEST(SecretFileTest, AnInheritedDescriptorThatIsNotAFileIsRefusedWithoutReadingIt) {
  ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);  // the write end stays open: a read would block
  int sockets[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
  for (auto [fd, kind] : {std::pair{p[0], "a pipe"}, std::pair{sockets[0], "a socket"}}) {
    const std::string path = absl::StrCat("/proc/self/fd/", fd);
    ScopedEnv file("GRADWIRE_SECRET_FILE", path.c_str());
    absl::StatusOr<Security> s = Security::FromEnv();
    ASSERT_FALSE(s.ok()) << kind;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(absl::StrCat("GRADWIRE_SECRET_FILE=", path, " is ", kind,
                                                     ", not the regular file holding the job's secret: the "
                                                     "descriptor ", fd, " that `gradwire launch` passed")),
              std::string::npos)
        << s.status();
    EXPECT_NE(s.status().message().find("pass_fds"), std::string::npos) << s.status();
  }
  for (int fd : {p[0], p[1], sockets[0], sockets[1]}) ::close(fd);
}

// A secret file of the user's (`gradwire secret > job.secret`) is read as before; a
// FIFO or a directory in its place is refused without blocking.
TEST(SecretFileTest, ASecretFileMustBeARegularNonEmptyFile) {
  ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  testing::ScopedTempDir dir("gw-secret");
  ASSERT_TRUE(dir.ok());
  const std::string good = dir.File("job.secret");
  {
    std::ofstream out(good);
    out << "from a file\n";
  }
  {
    ScopedEnv file("GRADWIRE_SECRET_FILE", good.c_str());
    absl::StatusOr<Security> s = Security::FromEnv();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->secret, "from a file");
  }
  const std::string fifo = dir.File("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string empty = dir.File("empty");
  std::ofstream{empty};
  const std::string missing = dir.File("missing");
  for (auto [path, says] : {std::pair{fifo, std::string(" is a pipe, not the regular file")},
                            std::pair{dir.path(), std::string(" is a directory, not the regular file")},
                            std::pair{empty, std::string(" is empty")},
                            std::pair{missing, std::string(" cannot be read (No such file or directory)")}}) {
    ScopedEnv file("GRADWIRE_SECRET_FILE", path.c_str());
    absl::StatusOr<Security> s = Security::FromEnv();
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message().find("pass_fds"), std::string::npos) << "not a descriptor: " << s.status();
    EXPECT_NE(s.status().message().find(absl::StrCat("GRADWIRE_SECRET_FILE=", path, says)), std::string::npos)
        << s.status();
  }
}

// ---------------------------------------------------------------- agents


TEST(AgentSecurityTest, AGroupWithoutASecretDoesNotStart) {
  ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  auto store = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok());
  AgentOptions o;
  o.world_size = 2;
  o.rendezvous = (*store)->address();
  o.host_store = false;
  auto agent = Agent::Start(o);
  ASSERT_FALSE(agent.ok());
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(agent.status().message().find("gradwire launch"), std::string::npos) << agent.status();
  o.world_size = 1;  // alone: nobody to authenticate
  o.rendezvous = "127.0.0.1:0";
  o.host_store = true;
  auto alone = Agent::Start(o);
  EXPECT_TRUE(alone.ok()) << alone.status();
}

TEST(AgentSecurityTest, AgentsCallEachOtherOverTls) {
  if (Certs::Get() == nullptr) GTEST_SKIP() << Certs::kMissing;
  for (const char* transport : {"tcp", "shm", "grpc"}) {
    AgentOptions base;
    base.transport = transport;
    base.security.tls = Certs::Get()->Job("a");
    auto group = testing::AgentGroup::Start(
        2, [](Agent& a) { return a.Register("add", [](Tensor x, Tensor y) { return kernels::Add(x, y); }); }, base);
    ASSERT_NE(group, nullptr) << transport;
    auto sum = (*group)[0].Sync<Tensor>("worker1", "add", Tensor::Full({4}, 1.f), Tensor::Full({4}, 2.f));
    ASSERT_TRUE(sum.ok()) << transport << ": " << sum.status();
    EXPECT_EQ(sum->data<float>()[3], 3.f);
    EXPECT_TRUE(group->ShutdownAll().ok());
  }
}

// An inline handler runs on the transport's I/O thread; when it calls a peer not yet
// connected, the dial and its handshakes happen on that thread (admission.h), with and
// without TLS.
TEST(AgentSecurityTest, AnInlineHandlerDialsAPeerFromTheIoThread) {
  if (Certs::Get() == nullptr) GTEST_SKIP() << Certs::kMissing;
  for (bool tls : {false, true}) {
    AgentOptions base;
    base.transport = "tcp";
    if (tls) base.security.tls = Certs::Get()->Job("a");
    auto group = testing::AgentGroup::Start(
        3,
        [](Agent& a) {
          Agent* self = &a;
          if (absl::Status s = a.Register("ping", [] { return int64_t{7}; }); !s.ok()) return s;
          return a.Register("relay", [self] { return self->Async<int64_t>("worker2", "ping"); },
                            RegisterOptions{.mode = HandlerMode::kInline});
        },
        base);
    ASSERT_NE(group, nullptr);
    auto relayed = (*group)[0].Sync<int64_t>("worker1", "relay");
    ASSERT_TRUE(relayed.ok()) << (tls ? "tls: " : "") << relayed.status();
    EXPECT_EQ(*relayed, 7);
    EXPECT_TRUE(group->ShutdownAll().ok());
  }
}

// A handler that holds its calls until the test lets them go.
struct Gate {
  absl::Notification open;
  std::atomic<int> entered{0};
};

TEST(AgentSecurityTest, APeerPastItsCallsInFlightGetsResourceExhaustedWhileOthersGoOn) {
  auto gate = std::make_shared<Gate>();
  AgentOptions base;
  base.security.limits.max_calls_in_flight = 2;
  base.worker_threads = 4;
  auto group = testing::AgentGroup::Start(
      3,
      [gate](Agent& a) {
        absl::Status s = a.Register("wait", [gate] {
          gate->entered.fetch_add(1);
          gate->open.WaitForNotification();
          return int64_t{1};
        });
        if (!s.ok()) return s;
        return a.Register("ping", [] { return int64_t{7}; });
      },
      base);
  ASSERT_NE(group, nullptr);
  std::vector<Future<int64_t>> held;
  for (int i = 0; i < 2; ++i) held.push_back((*group)[1].Async<int64_t>("worker0", "wait"));
  auto past = (*group)[1].Sync<int64_t>("worker0", "ping");  // the third of worker1's
  EXPECT_EQ(past.status().code(), absl::StatusCode::kResourceExhausted) << past.status();
  EXPECT_NE(past.status().message().find("max_calls_in_flight"), std::string::npos) << past.status();
  auto other = (*group)[2].Sync<int64_t>("worker0", "ping");  // another peer goes on
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(*other, 7);
  gate->open.Notify();
  for (auto& f : held) EXPECT_TRUE(f.Get().ok());
  auto after = (*group)[1].Sync<int64_t>("worker0", "ping");  // under the limit again
  EXPECT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(AgentSecurityTest, APeerPastItsRRefsGetsResourceExhaustedWhileOthersGoOn) {
  AgentOptions base;
  base.security.limits.max_rrefs = 3;
  auto group = testing::AgentGroup::Start(
      3, [](Agent& a) { return a.Register("ones", [] { return Tensor::Full({2}, 1.f); }); }, base);
  ASSERT_NE(group, nullptr);
  std::vector<RRef<Tensor>> kept;
  for (int i = 0; i < 3; ++i) {
    kept.push_back((*group)[1].Remote<Tensor>("worker0", "ones"));
    ASSERT_TRUE(kept.back().ToHere().ok());
  }
  RRef<Tensor> fourth = (*group)[1].Remote<Tensor>("worker0", "ones");
  absl::StatusOr<Tensor> v = fourth.ToHere();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kResourceExhausted) << v.status();
  EXPECT_NE(v.status().message().find("max_rrefs"), std::string::npos) << v.status();
  RRef<Tensor> others = (*group)[2].Remote<Tensor>("worker0", "ones");
  EXPECT_TRUE(others.ToHere().ok()) << "another peer's RRefs go on";
  kept.clear();
  fourth = RRef<Tensor>();
  others = RRef<Tensor>();
  absl::Status released = group->AwaitRRefsReleased();
  ASSERT_TRUE(released.ok()) << released;
  RRef<Tensor> again = (*group)[1].Remote<Tensor>("worker0", "ones");
  EXPECT_TRUE(again.ToHere().ok()) << "released RRefs make room";
  again = RRef<Tensor>();
  EXPECT_TRUE(group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::rpc
