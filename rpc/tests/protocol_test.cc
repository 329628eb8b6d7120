// The agent's side of the internal protocols: the hello and its protocol version (peers.h),
// the reserved namespace, and the one exception boundary of handlers (dispatcher.h), with
// a raw transport connection playing a peer built from another gradwire version.
#include <gtest/gtest.h>
#include <unistd.h>

#include <deque>

#include "absl/synchronization/mutex.h"
#include "cluster/peers.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/message.h"
#include "test_support.h"
#include "wire/codec.h"

namespace gw::rpc {
namespace {

using internal::Envelope;
using internal::HelloMessage;
using internal::Kind;

// The envelopes a raw connection receives, and how it closed.
TransportOptions JobOptions() {
  TransportOptions o;
  o.security = Security::FromEnv().value_or(Security{});
  return o;
}

class RawPeer {
 public:
  // A member of the job (it holds the job's secret) that speaks the protocol its way.
  RawPeer() : transport_(*MakeTransport("tcp", JobOptions())) {}
  ~RawPeer() { transport_->Shutdown(); }

  ConnectionCallbacks Callbacks() {
    return {[this](const std::shared_ptr<Connection>& c, Message m) {
              absl::StatusOr<Envelope> e = internal::DecodeEnvelope(std::move(m));
              absl::MutexLock lock(&mu_);
              conn_ = c;
              if (e.ok()) received_.push_back(*std::move(e));
            },
            [this](const std::shared_ptr<Connection>&, const absl::Status& s) {
              absl::MutexLock lock(&mu_);
              closed_ = s;
            },
            nullptr};
  }
  Transport& transport() { return *transport_; }
  std::optional<Envelope> Next(absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !received_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&any), timeout)) return std::nullopt;
    Envelope e = std::move(received_.front());
    received_.pop_front();
    return e;
  }
  absl::Status AwaitClose(absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto closed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !closed_.ok(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&closed), timeout)) return absl::OkStatus();
    return closed_;
  }
  std::shared_ptr<Connection> conn() {
    absl::MutexLock lock(&mu_);
    return conn_;
  }

 private:
  std::unique_ptr<Transport> transport_;
  absl::Mutex mu_;
  std::deque<Envelope> received_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Connection> conn_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

void SendEnvelope(Connection& c, Envelope e) {
  absl::StatusOr<Message> m = internal::EncodeEnvelope(e);
  ASSERT_TRUE(m.ok()) << m.status();
  c.Send(*std::move(m));
}

Envelope Hello(Value payload) {
  Envelope e;
  e.kind = Kind::kHello;
  e.payload = std::move(payload);
  return e;
}

// The agents of these tests speak plain tcp, as the raw peers do.
AgentOptions Tcp() {
  AgentOptions o;
  o.transport = "tcp";
  return o;
}

Envelope Request(uint64_t id, const std::string& function) {
  Envelope e;
  e.kind = Kind::kRequest;
  e.id = id;
  e.function = function;
  e.payload = Value(ValueList{});
  return e;
}

TEST(ProtocolTest, AnAcceptorRefusesAPeerOfAnotherProtocolVersionNamingBoth) {
  auto group = testing::AgentGroup::Start(2, testing::RegisterTestFunctions, Tcp());
  ASSERT_NE(group, nullptr);
  for (Value hello : {ValueTraits<HelloMessage>::To(HelloMessage{1, "worker1", kProtocolVersion + 7, "", 0}),
                      Value(int64_t{1})}) {  // a release before typed messages sent its rank alone
    RawPeer peer;
    auto conn = peer.transport().Connect((*group)[0].self().address, peer.Callbacks(), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(conn.ok()) << conn.status();
    SendEnvelope(**conn, Hello(hello));
    SendEnvelope(**conn, Request(1, "noop"));  // never runs
    std::optional<Envelope> refusal = peer.Next();
    ASSERT_TRUE(refusal.has_value());
    EXPECT_EQ(refusal->kind, Kind::kHello);
    EXPECT_EQ(refusal->status.code(), absl::StatusCode::kFailedPrecondition) << refusal->status;
    const std::string theirs = hello.is<int64_t>() ? "protocol 1" : absl::StrCat("protocol ", kProtocolVersion + 7);
    EXPECT_NE(refusal->status.message().find(theirs), std::string::npos) << refusal->status;
    EXPECT_NE(refusal->status.message().find(absl::StrCat("worker0 speaks ", kProtocolVersion)), std::string::npos)
        << refusal->status;
    EXPECT_FALSE(peer.AwaitClose().ok());  // then the acceptor closes
    EXPECT_FALSE(peer.Next(absl::Milliseconds(100)).has_value());  // and the request got no answer
  }
  // The agent serves everyone else as before.
  EXPECT_EQ(*(*group)[1].Sync<int64_t>("worker0", "noop"), 0);
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(ProtocolTest, ARequestBeforeTheHelloOrAHelloOfAStrangerIsRefused) {
  auto group = testing::AgentGroup::Start(2, testing::RegisterTestFunctions, Tcp());
  ASSERT_NE(group, nullptr);
  {
    RawPeer peer;
    auto conn = peer.transport().Connect((*group)[0].self().address, peer.Callbacks(), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(conn.ok());
    SendEnvelope(**conn, Request(1, "noop"));
    EXPECT_FALSE(peer.AwaitClose().ok());
    EXPECT_FALSE(peer.Next(absl::Milliseconds(100)).has_value());
  }
  {
    RawPeer peer;
    auto conn = peer.transport().Connect((*group)[0].self().address, peer.Callbacks(), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(conn.ok());
    SendEnvelope(**conn, Hello(ValueTraits<HelloMessage>::To(HelloMessage{7, "intruder", kProtocolVersion, "", 0})));
    std::optional<Envelope> refusal = peer.Next();
    ASSERT_TRUE(refusal.has_value());
    EXPECT_EQ(refusal->status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(refusal->status.message().find("'intruder' as rank 7"), std::string::npos) << refusal->status;
  }
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(ProtocolTest, CallsToAPeerOfAnotherVersionFailAtConnectTimeNamingBothVersions) {
  // worker1 is a raw peer built from "another release": it answers hellos with version 99.
  auto store = StoreServer::Start("127.0.0.1", 0, JobOptions().security);
  ASSERT_TRUE(store.ok());
  RawPeer old;
  auto fake_address = old.transport().Listen("127.0.0.1", "127.0.0.1", old.Callbacks());
  ASSERT_TRUE(fake_address.ok());
  auto client = ConnectStore((*store)->address(), absl::Now() + absl::Seconds(5), JobOptions().security);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Set("gradwire/worker/1", absl::StrCat("worker1\n", *fake_address, "\n", ::getpid())).ok());
  AgentOptions o = Tcp();
  o.rank = 0;
  o.world_size = 2;
  o.rendezvous = (*store)->address();
  o.host_store = false;
  o.default_timeout = absl::Seconds(20);
  auto agent = Agent::Start(o);
  ASSERT_TRUE(agent.ok()) << agent.status();
  Future<int64_t> call = (*agent)->Async<int64_t>("worker1", "noop");
  std::optional<Envelope> hello = old.Next();  // the agent's hello, then its request
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->kind, Kind::kHello);
  absl::StatusOr<HelloMessage> theirs = ValueTraits<HelloMessage>::From(hello->payload);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_EQ(theirs->protocol_version, kProtocolVersion);
  EXPECT_EQ(theirs->name, "worker0");
  SendEnvelope(*old.conn(), Hello(ValueTraits<HelloMessage>::To(HelloMessage{1, "worker1", 99, "", 0})));
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> r = call.Get(absl::Seconds(20));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // at connect time, not at the call's deadline
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("worker1 speaks gradwire protocol 99"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(absl::StrCat("worker0 speaks ", kProtocolVersion)), std::string::npos)
      << r.status();
  EXPECT_TRUE((*agent)->Shutdown(/*graceful=*/false).ok());
  (*store)->Shutdown();
}

TEST(ProtocolTest, UsersCannotRegisterInTheReservedNamespace) {
  auto group = testing::AgentGroup::Start(1);
  ASSERT_NE(group, nullptr);
  absl::Status s = (*group)[0].Register("__rref.fork", [](int64_t x) { return x; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("reserved for gradwire's own protocols"), std::string::npos) << s;
  EXPECT_EQ((*group)[0].Register("__mine", [] { return 1; }).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*group)[0].Register("_mine", [] { return 1; }).ok());
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(ProtocolTest, AHandlerThatThrowsIsAnsweredWithAStatusAndTheAgentGoesOn) {
  auto group = testing::AgentGroup::Start(2, [](Agent& a) {
    (void)a.Register("boom", [](int64_t) -> int64_t { throw std::runtime_error("out of coffee"); });
  });
  ASSERT_NE(group, nullptr);
  absl::StatusOr<int64_t> r = (*group)[0].Sync<int64_t>("worker1", "boom", int64_t{1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(r.status().message(), "worker1.boom: boom threw: out of coffee");
  EXPECT_EQ((*group)[0].Sync<int64_t>("worker1", "boom", int64_t{1}).status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(ProtocolTest, ASetupThatFailsFailsStart) {
  auto store = StoreServer::Start("127.0.0.1", 0, JobOptions().security);
  ASSERT_TRUE(store.ok());
  AgentOptions o;
  o.rendezvous = (*store)->address();
  o.host_store = false;
  auto agent = Agent::Start(o, [](Agent&) { return absl::FailedPreconditionError("no GPU here"); });
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(agent.status().message(), "worker0: setup failed: no GPU here");
  (*store)->Shutdown();
}

}  // namespace
}  // namespace gw::rpc
