// Unit: the fault-injecting transport (faults.h, rpc/src/transport/fault/) over real
// loopback sockets: the fault plan's syntax; a link protocol that hides drop, delay,
// duplicate and reorder; close_after, corrupt, partitions and stalls as documented; agents
// running under faults. (The conformance suite runs it too: transport_test.cc, "fault".)
// Tests wait on events (messages, closes, the injector's counters), never by sleeping.
#include "gradwire/rpc/faults.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/tensor/kernels.h"
#include "inbox.h"
#include "test_support.h"

namespace gw::rpc {
namespace {

using testing::AgentGroup;
using testing::InjectFaults;
using testing::Inbox;
using testing::RegisterTestFunctions;

constexpr absl::Duration kWait = absl::Seconds(20);


// Expects a close reason with `code` whose message contains each of `fragments`.
void ExpectClose(const absl::Status& s, absl::StatusCode code, std::initializer_list<absl::string_view> fragments) {
  EXPECT_EQ(s.code(), code) << s;
  for (absl::string_view f : fragments) EXPECT_TRUE(absl::StrContains(s.message(), f)) << "no '" << f << "' in " << s;
}

// Every on_sent of a test: how often each one ran and its last status. Shared with the
// callbacks, which may run after a failed test body returned.
class SendLog : public std::enable_shared_from_this<SendLog> {
 public:
  std::function<void(absl::Status)> Callback(int i) {
    return [log = shared_from_this(), i](absl::Status s) {
      absl::MutexLock lock(&log->mu_);
      ++log->calls_[i];
      log->last_[i] = std::move(s);
    };
  }
  // Waits until n different sends reported.
  bool WaitReported(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), kWait);
  }
  std::map<int, int> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::map<int, absl::Status> last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }

 private:
  absl::Mutex mu_;
  std::map<int, int> calls_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Status> last_ ABSL_GUARDED_BY(mu_);
};

// A server ("ps0", listening) and a client ("trainer0") transport sharing one injector,
// and the inboxes of their connections. Destruction shuts the transports down first (no
// callback after that), then drops the inboxes with the connections they hold, then the
// transports: connections never outlive their transport.
struct Endpoints {
  explicit Endpoints(absl::string_view spec, const std::string& inner = "tcp")
      : faults(InjectFaults(spec)), server(Make(inner, "ps0")), client(Make(inner, "trainer0")) {
    absl::StatusOr<std::string> listening = server->Listen("127.0.0.1", /*advertise_host=*/"", server_inbox.Callbacks());
    EXPECT_TRUE(listening.ok()) << listening.status();
    if (listening.ok()) address = *listening;
  }
  ~Endpoints() { Shutdown(); }
  void Shutdown() {
    client->Shutdown();
    server->Shutdown();
  }
  std::unique_ptr<Transport> Make(const std::string& inner, const std::string& self) {
    TransportOptions options;
    options.faults = faults;
    options.self_name = self;
    absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport(inner, options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }
  Inbox& NewInbox() { return more_inboxes.emplace_back(); }
  std::shared_ptr<Connection> Dial(Inbox& inbox) {
    auto c = client->Connect(address, inbox.Callbacks(), absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }
  bool Await(const std::function<bool(const FaultStats&)>& until) {
    const bool ok = faults->AwaitStats(until, absl::Now() + kWait);
    EXPECT_TRUE(ok) << faults->stats().ToString();
    return ok;
  }

  std::shared_ptr<FaultInjector> faults;
  std::unique_ptr<Transport> server, client;
  std::string address;
  Inbox server_inbox, client_inbox;
  std::deque<Inbox> more_inboxes;
};

// ------------------------------------------------------------------ the plan's syntax

TEST(ParseFaultsTest, AcceptsTheDocumentedForms) {
  absl::StatusOr<FaultSpec> s = ParseFaults("drop:0.01,delay:5ms,close_after:500");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->drop, 0.01);
  EXPECT_EQ(s->delay_min, absl::Milliseconds(5));
  EXPECT_EQ(s->delay_max, absl::Milliseconds(5));
  EXPECT_EQ(s->close_after, 500);
  EXPECT_FALSE(s->seed.has_value());

  s = ParseFaults(
      " delay: 1ms-2.5ms , duplicate:0.5, reorder:8, corrupt:0.001, stall:inf, stall_after:3,"
      " partition:a+b/c+d, partition:e/f, rto:5ms, seed:42 ");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->delay_min, absl::Milliseconds(1));
  EXPECT_EQ(s->delay_max, absl::Microseconds(2500));
  EXPECT_EQ(s->duplicate, 0.5);
  EXPECT_EQ(s->reorder, 8);
  EXPECT_EQ(s->corrupt, 0.001);
  EXPECT_EQ(s->stall, absl::InfiniteDuration());
  EXPECT_EQ(s->stall_after, 3);
  ASSERT_EQ(s->partitions.size(), 2u);
  EXPECT_EQ(s->partitions[0].a, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s->partitions[0].b, (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(s->partitions[1].a, std::vector<std::string>{"e"});
  EXPECT_EQ(s->rto, absl::Milliseconds(5));
  EXPECT_EQ(s->seed, uint64_t{42});

  // ToString is canonical: it reads back to the same plan.
  absl::StatusOr<FaultSpec> again = ParseFaults(s->ToString());
  ASSERT_TRUE(again.ok()) << s->ToString() << ": " << again.status();
  EXPECT_EQ(again->ToString(), s->ToString());
  EXPECT_EQ(again->delay_max, s->delay_max);
  EXPECT_EQ(again->partitions.size(), 2u);

  for (const char* ok : {"", " ", "stall:250ms", "drop:0", "delay:0", "delay:1s-1s", "reorder:1", "seed:0"}) {
    EXPECT_TRUE(ParseFaults(ok).ok()) << "'" << ok << "': " << ParseFaults(ok).status();
  }
  EXPECT_EQ(ParseFaults("")->ToString(), "");
}

TEST(ParseFaultsTest, RejectsBadItemsNamingThemAndListingTheValidForms) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"dorp:0.1", "unknown fault 'dorp'"},
      {"drop", "expected name:value"},
      {"drop:1", "[0, 1)"},
      {"drop:x", "probability"},
      {"duplicate:1.5", "[0, 1]"},
      {"corrupt:-0.1", "probability"},
      {"delay:5", "'5' is not a finite duration"},
      {"delay:-5ms", "not a finite duration"},
      {"delay:3ms-1ms", "D1 <= D2"},
      {"delay:inf", "finite"},
      {"reorder:0", "whole number"},
      {"close_after:0", "whole number"},
      {"close_after:ten", "whole number"},
      {"stall:0s", "longer than 0"},
      {"rto:0ms", "longer than 0"},
      {"seed:-1", "whole number"},
      {"partition:a", "two sides"},
      {"partition:a+/b", "empty"},
      {"partition:a/a", "both sides"},
      {"drop:0.1,drop:0.2", "given twice"},
  };
  for (const auto& [text, why] : cases) {
    absl::StatusOr<FaultSpec> s = ParseFaults(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(s.status().message(), why)) << text << ": " << s.status();
    const std::string item = text.substr(text.rfind(',') + 1);
    EXPECT_TRUE(absl::StrContains(s.status().message(), absl::StrCat("'", item, "'"))) << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), "valid: drop:P, delay:D")) << s.status();
  }
  absl::StatusOr<FaultSpec> orphan = ParseFaults("stall_after:3");
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(orphan.status().message(), "stall_after:N needs stall:D")) << orphan.status();
}

// ------------------------------------------------------------------ recoverable faults

// Over every backend: the decorator only needs the inner transport's contract.
class RecoverableFaultsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RecoverableFaultsTest, DeliverEveryMessageOnceInOrderBothWays) {
  Endpoints e("drop:0.2,duplicate:0.2,reorder:8,delay:0ms-3ms,seed:1", GetParam());
  std::shared_ptr<Connection> conn = e.Dial(e.client_inbox);
  constexpr int kMessages = 400;
  auto log = std::make_shared<SendLog>();
  Generator gen(9);
  const Tensor big = Tensor::Randn({1 << 21}, gen);  // 8 MiB, in the middle of the stream
  for (int i = 0; i < kMessages; ++i) {
    conn->Send(Message{absl::StrCat("up", i), {i == kMessages / 2 ? big : Tensor::Full({i % 7 + 1}, i)}},
               log->Callback(i));
  }
  ASSERT_TRUE(e.server_inbox.WaitMessages(kMessages, kWait));
  std::shared_ptr<Connection> back = e.server_inbox.last_conn();
  for (int i = 0; i < kMessages; ++i) back->Send(Message{absl::StrCat("down", i), {Tensor::Full({3}, -i)}});
  ASSERT_TRUE(e.client_inbox.WaitMessages(kMessages, kWait));
  ASSERT_TRUE(log->WaitReported(kMessages));

  const std::vector<Message> up = e.server_inbox.messages(), down = e.client_inbox.messages();
  ASSERT_EQ(up.size(), static_cast<size_t>(kMessages));
  ASSERT_EQ(down.size(), static_cast<size_t>(kMessages));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(up[i].header, absl::StrCat("up", i));
    if (i == kMessages / 2) {
      EXPECT_EQ(kernels::MaxAbsDiff(up[i].tensors[0], big), 0.0);
    } else {
      EXPECT_EQ(up[i].tensors[0].ToVector<float>(), std::vector<float>(i % 7 + 1, static_cast<float>(i)));
    }
    ASSERT_EQ(down[i].header, absl::StrCat("down", i));
    EXPECT_EQ(down[i].tensors[0].ToVector<float>(), std::vector<float>(3, static_cast<float>(-i)));
  }
  // on_sent: once each, OK (the peer acknowledged every message).
  for (const auto& [i, n] : log->calls()) EXPECT_EQ(n, 1) << "message " << i;
  for (const auto& [i, s] : log->last()) EXPECT_TRUE(s.ok()) << "message " << i << ": " << s;

  // Every fault happened, and the link protocol repaired each.
  e.Await([](const FaultStats& s) { return s.frames_delivered >= 2 * kMessages; });
  const FaultStats stats = e.faults->stats();
  EXPECT_GT(stats.dropped, 0u) << stats.ToString();
  EXPECT_GT(stats.retransmitted, 0u) << stats.ToString();
  EXPECT_GT(stats.duplicated, 0u) << stats.ToString();
  EXPECT_GT(stats.duplicates_discarded, 0u) << stats.ToString();
  EXPECT_GT(stats.reordered, 0u) << stats.ToString();
  EXPECT_EQ(stats.frames_sent, 2u * kMessages) << stats.ToString();
  EXPECT_EQ(stats.frames_delivered, 2u * kMessages) << stats.ToString();
  EXPECT_EQ(stats.connections_closed, 0u) << stats.ToString();
  EXPECT_FALSE(conn->closed());
}

INSTANTIATE_TEST_SUITE_P(Inner, RecoverableFaultsTest, ::testing::Values("tcp", "shm", "grpc"));

// ------------------------------------------------------------------ close_after

TEST(FaultTransportTest, CloseAfterClosesBothSidesWithItsReasonAndFailsPendingSendsOnce) {
  Endpoints e("close_after:10,delay:5ms,seed:2");
  std::shared_ptr<Connection> conn = e.Dial(e.client_inbox);
  constexpr int kMessages = 30;
  auto log = std::make_shared<SendLog>();
  for (int i = 0; i < kMessages; ++i) conn->Send(Message{std::to_string(i), {Tensor::Full({2}, i)}}, log->Callback(i));

  // Each side names the other (the dialer by its address alone if it closed before the
  // acceptor's hello came).
  const absl::Status here = e.client_inbox.WaitClose(kWait);
  ExpectClose(here, absl::StatusCode::kUnavailable,
              {"connection closed by fault injection after 10 frames", "(peer ", "127.0.0.1:"});
  ExpectClose(e.server_inbox.WaitClose(kWait), absl::StatusCode::kUnavailable,
              {"trainer0 at 127.0.0.1:", "closed the connection: connection closed by fault injection after 10"});
  EXPECT_TRUE(conn->closed());

  ASSERT_TRUE(log->WaitReported(kMessages));
  // Whatever reached the peer arrived in order; every send reported once, failures
  // with the close reason.
  const std::vector<Message> got = e.server_inbox.messages();
  EXPECT_LE(got.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].header, std::to_string(i));
  for (const auto& [i, s] : log->last()) {
    if (!s.ok()) {
      EXPECT_EQ(s, here) << "message " << i;
    }
  }
  EXPECT_GE(e.faults->stats().connections_closed, 1u);
  // Nothing reports twice, even once the transports are gone.
  e.Shutdown();
  for (const auto& [i, n] : log->calls()) EXPECT_EQ(n, 1) << "message " << i;
  EXPECT_EQ(log->calls().size(), static_cast<size_t>(kMessages));
}

// ------------------------------------------------------------------ corrupt

TEST(FaultTransportTest, CorruptionIsDetectedNamingThePeerAndNeverDelivered) {
  // Every frame corrupted (a random bit of the header or of the tensor bytes): the first
  // one closes the connection, whatever bit it was.
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    Endpoints e(absl::StrCat("corrupt:1,seed:", seed));
    std::shared_ptr<Connection> conn = e.Dial(e.client_inbox);
    Generator gen(seed);
    conn->Send(Message{"payload", {Tensor::Randn({1000}, gen), Tensor::Full({3}, 1.0, DType::kInt64)}});
    ExpectClose(e.server_inbox.WaitClose(kWait), absl::StatusCode::kDataLoss,
                {"a frame from trainer0 at 127.0.0.1:", "failed its checksum"});
    ExpectClose(e.client_inbox.WaitClose(kWait), absl::StatusCode::kUnavailable,
                {"ps0 at 127.0.0.1:", "failed its checksum"});
    EXPECT_TRUE(e.server_inbox.messages().empty());
    EXPECT_EQ(e.faults->stats().corruptions_detected, 1u);
  }
}

TEST(FaultTransportTest, RareCorruptionClosesTheConnectionAndEverythingDeliveredIsExact) {
  Endpoints e("corrupt:0.02,seed:3");
  std::shared_ptr<Connection> conn = e.Dial(e.client_inbox);
  constexpr int kMessages = 500;
  for (int i = 0; i < kMessages; ++i) conn->Send(Message{std::to_string(i), {Tensor::Full({64}, i)}});
  // A data frame or an ack is hit sooner or later; one side detects it.
  const absl::Status server_close = e.server_inbox.WaitClose(kWait);
  const absl::Status client_close = e.client_inbox.WaitClose(kWait);
  EXPECT_TRUE(server_close.code() == absl::StatusCode::kDataLoss || client_close.code() == absl::StatusCode::kDataLoss)
      << server_close << " / " << client_close;
  const std::vector<Message> got = e.server_inbox.messages();
  EXPECT_LT(got.size(), static_cast<size_t>(kMessages));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].header, std::to_string(i));
    ASSERT_EQ(got[i].tensors[0].ToVector<float>(), std::vector<float>(64, static_cast<float>(i)));
  }
  const FaultStats stats = e.faults->stats();
  // Each end may catch one (a data frame one way, an ack the other) before the goodbyes
  // cross.
  EXPECT_GE(stats.corruptions_detected, 1u) << stats.ToString();
  EXPECT_LE(stats.corruptions_detected, std::min<uint64_t>(stats.corrupted, 2)) << stats.ToString();
}

// ------------------------------------------------------------------ partitions

TEST(FaultTransportTest, PartitionClosesAndRefusesConnectionsUntilHealed) {
  Endpoints e("seed:4");
  std::shared_ptr<Connection> conn = e.Dial(e.client_inbox);
  conn->Send(Message{"before", {}});
  ASSERT_TRUE(e.server_inbox.WaitMessages(1));

  e.faults->Partition({"trainer0"}, {"ps0"});
  // Each side closes naming the other (its own decision, or the other's goodbye if that
  // came first).
  ExpectClose(e.client_inbox.WaitClose(kWait), absl::StatusCode::kUnavailable,
              {"ps0 at 127.0.0.1:", "partitioned by fault injection"});
  ExpectClose(e.server_inbox.WaitClose(kWait), absl::StatusCode::kUnavailable,
              {"trainer0 at 127.0.0.1:", "partitioned by fault injection"});

  // A new connection is closed right after the hellos; what was sent on it never arrives.
  Inbox& refused = e.NewInbox();
  std::shared_ptr<Connection> during = e.Dial(refused);
  auto log = std::make_shared<SendLog>();
  during->Send(Message{"during", {}}, log->Callback(0));
  ExpectClose(refused.WaitClose(kWait), absl::StatusCode::kUnavailable, {"partitioned by fault injection"});
  ASSERT_TRUE(log->WaitReported(1));
  EXPECT_FALSE(log->last()[0].ok());
  EXPECT_EQ(e.server_inbox.messages().size(), 1u);

  e.faults->Heal();
  Inbox& healed = e.NewInbox();
  std::shared_ptr<Connection> after = e.Dial(healed);
  after->Send(Message{"after", {}});
  ASSERT_TRUE(e.server_inbox.WaitMessages(2));
  EXPECT_EQ(e.server_inbox.messages()[1].header, "after");
  EXPECT_FALSE(after->closed());
  EXPECT_GE(e.faults->stats().connections_closed, 2u);
}

TEST(FaultTransportTest, PartitionInThePlanRefusesFromTheStart) {
  Endpoints e("partition:trainer0/ps0+ps1");
  std::shared_ptr<Connection> conn = e.Dial(e.client_inbox);
  conn->Send(Message{"never", {}});
  ExpectClose(e.client_inbox.WaitClose(kWait), absl::StatusCode::kUnavailable, {"partitioned by fault injection"});
  EXPECT_TRUE(e.server_inbox.messages().empty());
}

// ------------------------------------------------------------------ stalls

TEST(FaultTransportTest, StallHoldsDeliveryUntilUnstall) {
  Endpoints e("seed:5");
  std::shared_ptr<Connection> conn = e.Dial(e.client_inbox);
  conn->Send(Message{"0", {}});
  ASSERT_TRUE(e.server_inbox.WaitMessages(1));

  e.faults->Stall();
  for (int i = 1; i <= 5; ++i) conn->Send(Message{std::to_string(i), {Tensor::Full({4}, i)}});
  ASSERT_TRUE(e.Await([](const FaultStats& s) { return s.stalled >= 5; }));
  // Held: nothing arrives while the stall lasts (a bounded wait on the delivery event).
  EXPECT_FALSE(e.server_inbox.WaitMessages(2, absl::Milliseconds(200)));

  e.faults->Unstall();
  ASSERT_TRUE(e.server_inbox.WaitMessages(6));
  const std::vector<Message> got = e.server_inbox.messages();
  for (int i = 0; i <= 5; ++i) EXPECT_EQ(got[i].header, std::to_string(i));
  EXPECT_EQ(got[5].tensors[0].ToVector<float>(), std::vector<float>(4, 5.0f));
}

TEST(FaultTransportTest, StallAfterNFramesResumesByItselfAndUnstallEndsAnInfiniteOne) {
  Endpoints e("stall:300ms,stall_after:3,seed:6");
  std::shared_ptr<Connection> conn = e.Dial(e.client_inbox);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 6; ++i) conn->Send(Message{std::to_string(i), {}});
  ASSERT_TRUE(e.server_inbox.WaitMessages(3));
  ASSERT_TRUE(e.server_inbox.WaitMessages(6));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));  // frames 4-6 waited out the stall
  EXPECT_GT(e.faults->stats().stalled, 0u);

  const uint64_t stalled_before = e.faults->stats().stalled;
  e.faults->Set(*ParseFaults("stall:inf,stall_after:1,seed:6"));
  Inbox& second = e.NewInbox();
  std::shared_ptr<Connection> stuck = e.Dial(second);
  for (int i = 0; i < 3; ++i) stuck->Send(Message{absl::StrCat("s", i), {}});
  ASSERT_TRUE(e.server_inbox.WaitMessages(7));  // the first frame passes
  ASSERT_TRUE(e.Await([&](const FaultStats& s) { return s.stalled >= stalled_before + 2; }));
  EXPECT_FALSE(e.server_inbox.WaitMessages(8, absl::Milliseconds(200)));
  e.faults->Unstall();
  ASSERT_TRUE(e.server_inbox.WaitMessages(9));
  EXPECT_EQ(e.server_inbox.messages()[8].header, "s2");
}

// ------------------------------------------------------------------ agents under faults

TEST(FaultAgentTest, AThousandCallsUnderLinkFaultsReturnExactResults) {
  AgentOptions base;
  base.transport_options.faults = InjectFaults("drop:0.05,delay:0ms-2ms,duplicate:0.05,reorder:4,seed:7");
  auto group = AgentGroup::Start(2, RegisterTestFunctions, base);
  ASSERT_NE(group, nullptr);
  constexpr int kRounds = 10, kPerRound = 100;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Future<Tensor>> futures;
    for (int i = 0; i < kPerRound; ++i) {
      const int k = round * kPerRound + i;
      const int from = k % 2;  // both directions
      futures.push_back((*group)[from].Async<Tensor>(absl::StrCat("worker", 1 - from), "add",
                                                     Tensor::Full({16}, k), Tensor::Arange(0, 16, 1, DType::kFloat32)));
    }
    for (int i = 0; i < kPerRound; ++i) {
      const int k = round * kPerRound + i;
      absl::StatusOr<Tensor> r = futures[i].Get(absl::Seconds(30));
      ASSERT_TRUE(r.ok()) << "call " << k << ": " << r.status();
      const std::vector<float> sum = r->ToVector<float>();
      for (int j = 0; j < 16; ++j) ASSERT_EQ(sum[j], static_cast<float>(k + j)) << "call " << k;
    }
  }
  testing::ExpectRepairedWithoutCloses(*base.transport_options.faults);
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(FaultAgentTest, CallsUnderCloseAfterSucceedAfterRedialOrFailNamingThePeer) {
  AgentOptions base;
  base.transport_options.faults = InjectFaults("close_after:40,seed:8");
  base.shutdown_timeout = absl::Seconds(5);
  auto group = AgentGroup::Start(2, RegisterTestFunctions, base);
  ASSERT_NE(group, nullptr);
  int ok = 0, unavailable = 0;
  auto check = [&](int k, const absl::StatusOr<Tensor>& r) {
    if (r.ok()) {
      ++ok;
      EXPECT_EQ(r->ToVector<float>(), std::vector<float>(4, static_cast<float>(k + 1))) << "call " << k;
      return;
    }
    ++unavailable;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << "call " << k << ": " << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "worker1")) << r.status();
  };
  auto call = [&](int k) {
    return (*group)[0].Async<Tensor>("worker1", "add", Tensor::Full({4}, k), Tensor::Ones({4}),
                                     CallOptions{.timeout = absl::Seconds(10)});
  };
  // One call at a time: a connection closes between two calls, the next one dials again.
  for (int k = 0; k < 100; ++k) check(k, call(k).Get(absl::Seconds(30)));
  const int sequential_failures = unavailable;
  // Ten at a time: the calls in flight when a connection closes fail, the others go on
  // (after a redial).
  for (int round = 0; round < 20; ++round) {
    std::vector<Future<Tensor>> futures;
    for (int i = 0; i < 10; ++i) futures.push_back(call(100 + round * 10 + i));
    for (int i = 0; i < 10; ++i) check(100 + round * 10 + i, futures[i].Get(absl::Seconds(30)));
  }
  const FaultStats stats = base.transport_options.faults->stats();
  EXPECT_GE(stats.connections_closed, 10u) << stats.ToString();
  EXPECT_LE(sequential_failures, static_cast<int>(stats.connections_closed)) << stats.ToString();
  EXPECT_GT(unavailable, 0) << "no call was in flight at a close; " << stats.ToString();
  EXPECT_GE(ok, 300 * 7 / 10) << unavailable << " failed; " << stats.ToString();
  (void)group->ShutdownAll();  // may meet a connection closing: bounded by shutdown_timeout
}

TEST(FaultAgentTest, FromEnvReadsGradwireFaults) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("GRADWIRE_FAULTS", "drop:0.1,delay:2ms,seed:3", 1);
  absl::StatusOr<AgentOptions> o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_NE(o->transport_options.faults, nullptr);
  EXPECT_EQ(o->transport_options.faults->spec().ToString(), "drop:0.1,delay:2ms,seed:3");

  ::setenv("GRADWIRE_FAULTS", "drop:0.1,dealy:2ms", 1);
  o = AgentOptions::FromEnv();
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(o.status().message(), "GRADWIRE_FAULTS")) << o.status();
  EXPECT_TRUE(absl::StrContains(o.status().message(), "'dealy:2ms'")) << o.status();

  ::unsetenv("GRADWIRE_FAULTS");
  o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->transport_options.faults, nullptr);  // no decorator: nothing changes
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
}

}  // namespace
}  // namespace gw::rpc
