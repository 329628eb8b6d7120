// Units: Rendezvous (how workers find each other) and the ShutdownBarrier protocol, both
// over a real rendezvous store: the built-in one and etcd (store_backends.h).
#include "cluster/rendezvous.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/shutdown_barrier.h"
#include "gradwire/proto/store.grpc.pb.h"
#include "store/store_sessions.h"
#include "store_backends.h"

namespace gw::rpc::internal {
namespace {

// Over both stores: the built-in one (hosted elsewhere, as for rank 0's peers) and etcd.
class RendezvousTest : public gw::rpc::testing::StoreBackendTest {
 protected:
  AgentOptions Options(int rank, int world) {
    AgentOptions o;
    o.rank = rank;
    o.world_size = world;
    o.rendezvous = address();
    o.host_store = false;
    o.run_id = "job";
    o.start_timeout = absl::Seconds(20);
    return o;
  }
  std::unique_ptr<Rendezvous> Join(int rank, int world) {
    auto r = Rendezvous::Join(Options(rank, world), absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
};

TEST_P(RendezvousTest, EveryWorkerSeesEveryRecordInRankOrder) {
  constexpr int kWorld = 3;
  std::vector<absl::StatusOr<std::vector<WorkerInfo>>> seen(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Rendezvous> rdzv = Join(r, kWorld);
      ASSERT_NE(rdzv, nullptr);
      ASSERT_TRUE(rdzv->Announce({absl::StrCat("w", r), r, absl::StrCat("127.0.0.1:", 1000 + r), 40 + r}).ok());
      seen[static_cast<size_t>(r)] = rdzv->AwaitAll(absl::Now() + absl::Seconds(10));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : seen) {
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->size(), 3u);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ((*s)[static_cast<size_t>(r)].name, absl::StrCat("w", r));
      EXPECT_EQ((*s)[static_cast<size_t>(r)].address, absl::StrCat("127.0.0.1:", 1000 + r));
      EXPECT_EQ((*s)[static_cast<size_t>(r)].pid, 40 + r);
    }
  }
}

TEST_P(RendezvousTest, MissingRanksAreNamedAtTheDeadline) {
  std::unique_ptr<Rendezvous> rdzv = Join(1, 4);
  ASSERT_NE(rdzv, nullptr);
  ASSERT_TRUE(rdzv->Announce({"w1", 1, "127.0.0.1:1", 1}).ok());
  std::unique_ptr<Rendezvous> other = Join(3, 4);
  ASSERT_TRUE(other->Announce({"w3", 3, "127.0.0.1:3", 3}).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<WorkerInfo>> all = rdzv->AwaitAll(absl::Now() + absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(all.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(all.status().message().find("rank(s) 0, 2 of 4"), std::string::npos) << all.status();
  EXPECT_NE(all.status().message().find("WORLD_SIZE"), std::string::npos) << all.status();
}

TEST_P(RendezvousTest, DuplicateNamesAreRefusedAndARestartedWorkerIsFoundAgain) {
  std::unique_ptr<Rendezvous> a = Join(0, 2), b = Join(1, 2);
  ASSERT_TRUE(a->Announce({"same", 0, "127.0.0.1:1", 1}).ok());
  ASSERT_TRUE(b->Announce({"same", 1, "127.0.0.1:2", 2}).ok());
  absl::StatusOr<std::vector<WorkerInfo>> all = a->AwaitAll(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(all.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(all.status().message().find("'same' is used by ranks 0 and 1"), std::string::npos) << all.status();
  // Rank 1 comes back elsewhere: Lookup reads its new record.
  ASSERT_TRUE(b->Announce({"same", 1, "127.0.0.1:9", 9}).ok());
  absl::StatusOr<WorkerInfo> again = a->Lookup(1, absl::Seconds(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->address, "127.0.0.1:9");
  EXPECT_EQ(a->Key("exited/", 3), "job/exited/3");
}

TEST_P(RendezvousTest, ABarrierRunsItsStepsInOrderOnEveryWorker) {
  constexpr int kWorld = 3;
  absl::Mutex mu;
  std::vector<std::string> log;
  std::vector<absl::Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Rendezvous> rdzv = Join(r, kWorld);
      ShutdownBarrier barrier(*rdzv, absl::StrCat("w", r), r, kWorld, kWorld);
      auto note = [&](const std::string& what) {
        absl::MutexLock lock(&mu);
        log.push_back(absl::StrCat(what, r));
      };
      results[static_cast<size_t>(r)] = barrier.Run(
          absl::Now() + absl::Seconds(10),
          {.drain = [&](absl::Time) { note("drain"); },
           .check_leaks = [&] {
             note("leaks");
             return r == 2 ? absl::FailedPreconditionError("w2 leaks") : absl::OkStatus();
           },
           .await_handlers = [&](absl::Time) { note("handlers"); },
           .gone = {}});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(results[0].ok() && results[1].ok()) << results[0] << results[1];
  EXPECT_EQ(results[2].message(), "w2 leaks");  // the leak check's verdict is the result
  // Every worker drained twice before any checked leaks (step 3 waits for all of step 2).
  size_t drains = 0, first_leak = log.size();
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].starts_with("drain")) {
      ++drains;
      EXPECT_LT(i, log.size());
    }
    if (log[i].starts_with("leaks") && first_leak == log.size()) first_leak = i;
  }
  EXPECT_EQ(drains, 6u);
  for (size_t i = first_leak; i < log.size(); ++i) EXPECT_FALSE(log[i].starts_with("drain")) << i;
}

TEST_P(RendezvousTest, ABarrierAWorkerNeverReachesFailsByItsDeadlineNamingIt) {
  std::unique_ptr<Rendezvous> rdzv = Join(0, 2);
  ShutdownBarrier barrier(*rdzv, "w0", 0, 2, 2);
  const absl::Time start = absl::Now();
  absl::Status s = barrier.Run(absl::Now() + absl::Milliseconds(300),
                               {.drain = [](absl::Time) {},
                                .check_leaks = [] { return absl::OkStatus(); },
                                .await_handlers = [](absl::Time) {},
                                .gone = {}});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("w0: graceful shutdown did not complete: rank(s) 1 did not reach 'shutdown/'"),
            std::string::npos)
      << s;
}

// The lines a Rendezvous says while it waits (RendezvousProgress), every 50 ms here.
// A worker that joins the job whose rendezvous store is (or would be) at `address`.
AgentOptions JoinerOf(const std::string& address, const std::string& secret = "") {
  AgentOptions o;
  o.rank = -1;
  o.join = true;
  o.rendezvous = address;
  o.security.secret = secret;
  return o;
}

class Said {
 public:
  RendezvousProgress progress(absl::Duration join_store_wait = kJoinStoreWait) {
    return {.every = absl::Milliseconds(50),
            .say = [this](const std::string& line) {
              absl::MutexLock lock(&mu_);
              lines_.push_back(line);
            },
            .join_store_wait = join_store_wait};
  }
  // Waits until a line containing `text` was said (the limit only keeps a broken
  // rendezvous from hanging the suite); that line, or "" if none came.
  std::string Await(const std::string& text, absl::Duration limit = absl::Seconds(30)) {
    std::string found;
    auto has = [&] {
      for (const std::string& l : lines_) {
        if (l.find(text) != std::string::npos) {
          found = l;
          return true;
        }
      }
      return false;
    };
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&has), limit);
    return found;
  }
  // Waits until `n` lines were said (the same limit).
  void AwaitCount(size_t n, absl::Duration limit = absl::Seconds(30)) {
    auto enough = [&] { return lines_.size() >= n; };
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&enough), limit);
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// A rank that never starts: while the others wait, one of them (the first that waited
// an interval) says whom they wait for and where, and the others stay quiet; it stops
// once all are there.
TEST_P(RendezvousTest, WhileRanksAreMissingOneRankSaysWhichAndWhere) {
  Said said0, said2;
  auto join = [&](int rank, Said& said) {
    absl::StatusOr<std::unique_ptr<Rendezvous>> r =
        Rendezvous::Join(Options(rank, 3), absl::Now() + absl::Seconds(10), said.progress());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  };
  std::unique_ptr<Rendezvous> r0 = join(0, said0), r2 = join(2, said2);
  ASSERT_TRUE(r0 != nullptr && r2 != nullptr);
  ASSERT_TRUE(r0->Announce({"w0", 0, "127.0.0.1:1000", 1}).ok());
  ASSERT_TRUE(r2->Announce({"w2", 2, "127.0.0.1:1002", 3}).ok());
  absl::StatusOr<std::vector<WorkerInfo>> all0, all2;
  // Rank 2 waits first, so it speaks; rank 0 (which waits once rank 2 has spoken) stays quiet.
  std::thread wait2([&] { all2 = r2->AwaitAll(absl::Now() + absl::Seconds(60)); });
  const std::string line = said2.Await("waiting for rank 1 of 3");
  EXPECT_NE(line.find(absl::StrCat("rank 2: waiting for rank 1 of 3 to join at the rendezvous store ", address(),
                                   " (2 joined: w0, w2)")),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("so far; giving up in "), std::string::npos) << line;
  std::thread wait0([&] { all0 = r0->AwaitAll(absl::Now() + absl::Seconds(60)); });
  // Rank 2 goes on speaking while rank 0 waits with it (a few intervals of both).
  const size_t before = said2.lines().size();
  said2.AwaitCount(before + 4);
  // Rank 1 starts at last.
  std::unique_ptr<Rendezvous> r1 = Join(1, 3);
  ASSERT_NE(r1, nullptr);
  ASSERT_TRUE(r1->Announce({"w1", 1, "127.0.0.1:1001", 2}).ok());
  wait0.join();
  wait2.join();
  ASSERT_TRUE(all0.ok()) << all0.status();
  ASSERT_TRUE(all2.ok()) << all2.status();
  // Rank 0 may speak about its own connection to the store (slow under a sanitizer), but
  // not about the missing rank: one rank speaks for the group.
  for (const std::string& said : said0.lines()) {
    EXPECT_EQ(said.find("waiting for rank"), std::string::npos) << "one rank speaks for the group: " << said;
  }
}

// A worker that joins a running job waits for the group to form, saying so.
TEST_P(RendezvousTest, AJoinerWaitingForTheGroupSaysWhatItWaitsFor) {
  Said said;
  AgentOptions o = Options(-1, 1);
  o.join = true;
  absl::StatusOr<std::unique_ptr<Rendezvous>> joiner =
      Rendezvous::Join(o, absl::Now() + absl::Seconds(10), said.progress());
  ASSERT_TRUE(joiner.ok()) << joiner.status();
  absl::StatusOr<std::pair<int, int>> group;
  std::thread wait([&] { group = (*joiner)->ReadGroup(absl::Now() + absl::Seconds(60)); });
  const std::string line = said.Await("waiting to join");
  EXPECT_NE(line.find(absl::StrCat("a worker joining: waiting to join the job 'job' at the rendezvous store ",
                                   address(), ": its group has not formed yet")),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("or the job has finished"), std::string::npos) << line;
  std::unique_ptr<Rendezvous> rank0 = Join(0, 2);
  ASSERT_NE(rank0, nullptr);
  ASSERT_TRUE(rank0->PublishGroup(2, 4).ok());
  wait.join();
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(*group, std::make_pair(2, 4));
}

INSTANTIATE_TEST_SUITE_P(Stores, RendezvousTest, gw::rpc::testing::kBothStores, gw::rpc::testing::StoreBackendName);

// A worker whose store is not there yet (rank 0 not started) says so as it waits, and
// goes on once the store appears.
TEST(RendezvousProgressTest, AWorkerWaitingForTheStoreSaysWhereItWaits) {
  absl::StatusOr<int> port = gw::rpc::testing::FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  AgentOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.rendezvous = absl::StrCat("127.0.0.1:", *port);
  Said said;
  absl::StatusOr<std::unique_ptr<Rendezvous>> joined;
  std::thread join([&] { joined = Rendezvous::Join(o, absl::Now() + absl::Seconds(60), said.progress()); });
  const std::string line = said.Await("waiting for the rendezvous store");
  EXPECT_NE(line.find(absl::StrCat("rank 1: waiting for the rendezvous store at 127.0.0.1:", *port,
                                   " (served by rank 0: is it running?) to answer")),
            std::string::npos)
      << line;
  absl::StatusOr<std::unique_ptr<StoreServer>> server = StoreServer::Start("127.0.0.1", *port);
  ASSERT_TRUE(server.ok()) << server.status();
  join.join();
  EXPECT_TRUE(joined.ok()) << joined.status();
  (*server)->Shutdown();
}

// A worker that joins a job which has finished (nothing listens where its store was)
// retries for join_store_wait (the job's store may not be up yet), saying so, then fails
// instead of waiting out its start timeout.
TEST(RendezvousProgressTest, AJoinerGivesUpWhereNothingListensAfterItsWait) {
  absl::StatusOr<int> port = gw::rpc::testing::FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  const AgentOptions o = JoinerOf(absl::StrCat("127.0.0.1:", *port));
  Said said;
  absl::StatusOr<std::unique_ptr<Rendezvous>> joined =
      Rendezvous::Join(o, absl::Now() + absl::Seconds(120), said.progress(absl::Milliseconds(300)));
  ASSERT_FALSE(joined.ok());
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(joined.status().message(),
            absl::StrCat("a worker joining: cannot join a job at 127.0.0.1:", *port,
                         ": nothing listens there for its rendezvous store (connection refused for 300ms); the job "
                         "may have finished, or MASTER_ADDR and MASTER_PORT (--master-addr, --master-port) do not "
                         "name a running job started with room to grow (max_world_size: gradwire launch "
                         "--max-workers)"));
  const std::vector<std::string> lines = said.lines();
  ASSERT_FALSE(lines.empty()) << "it says that it waits";
  EXPECT_NE(lines[0].find(absl::StrCat("a worker joining: waiting for the rendezvous store at 127.0.0.1:", *port)),
            std::string::npos)
      << lines[0];
}

// A worker that joins, started together with the job (all pods of a job at once): the
// store is not up yet, and it connects once it is.
TEST(RendezvousProgressTest, AJoinerStartedBeforeTheStoreConnectsOnceItIsUp) {
  absl::StatusOr<int> port = gw::rpc::testing::FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  const AgentOptions o = JoinerOf(absl::StrCat("127.0.0.1:", *port), "s");
  Said said;
  absl::StatusOr<std::unique_ptr<Rendezvous>> joined;
  std::thread join([&] { joined = Rendezvous::Join(o, absl::Now() + absl::Seconds(60), said.progress()); });
  const std::string line = said.Await("waiting for the rendezvous store");
  EXPECT_NE(line.find(absl::StrCat("a worker joining: waiting for the rendezvous store at 127.0.0.1:", *port)),
            std::string::npos)
      << line;
  absl::StatusOr<std::unique_ptr<StoreServer>> server = StoreServer::Start("127.0.0.1", *port, o.security);
  ASSERT_TRUE(server.ok()) << server.status();
  join.join();
  EXPECT_TRUE(joined.ok()) << joined.status();
  (*server)->Shutdown();
}

// Something listens where the store should be but never answers (a listening socket
// nobody accepts on: connections complete in its backlog, and not a byte comes back). A
// joiner, authenticating or not, gives up after kJoinStoreWait saying the store did not
// answer, not after its start timeout, and not with the handshake's own timeout.
TEST(RendezvousProgressTest, AJoinerGivesUpAfterTheJoinWaitWhereTheStoreDoesNotAnswer) {
  const int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(silent, 64), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  // Authenticating (what every job does unless GRADWIRE_AUTH=off) over the real 10 s wait;
  // without authentication (no handshake, the channel alone) over a shorter one.
  for (auto [secret, wait] : {std::pair{"a secret", kJoinStoreWait}, std::pair{"", absl::Seconds(1)}}) {
    SCOPED_TRACE(*secret != '\0' ? "authenticating" : "without authentication");
    const AgentOptions o = JoinerOf(address, secret);
    Said said;
    absl::StatusOr<std::unique_ptr<Rendezvous>> joined =
        Rendezvous::Join(o, absl::Now() + absl::Seconds(120), said.progress(wait));
    ASSERT_FALSE(joined.ok());
    EXPECT_EQ(joined.status().code(), absl::StatusCode::kUnavailable) << joined.status();
    EXPECT_NE(joined.status().message().find(absl::StrCat("a worker joining: cannot join a job at ", address,
                                                          ": its rendezvous store did not answer within ",
                                                          absl::FormatDuration(wait), " (")),
              std::string::npos)
        << joined.status();
    EXPECT_NE(joined.status().message().find("the job may have finished"), std::string::npos) << joined.status();
    EXPECT_FALSE(said.lines().empty()) << "it says that it waits";
  }
  ::close(silent);
}

// A store whose handshake answers only when the test lets it (a store that is slow to
// authenticate, e.g. busy with a thousand workers): Hello waits for `answer`.
class SlowHandshakeStore final : public ::gradwire::proto::Store::Service {
 public:
  explicit SlowHandshakeStore(const std::string& secret) : sessions_(secret, absl::Seconds(60)) {}
  grpc::Status Hello(grpc::ServerContext*, const ::gradwire::proto::HelloRequest* req,
                     ::gradwire::proto::HelloResponse* resp) override {
    answer.WaitForNotification();
    absl::StatusOr<StoreSessions::Challenge> c = sessions_.Hello("test", req->hello());
    if (!c.ok()) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::string(c.status().message()));
    resp->set_challenge(c->bytes);
    resp->set_handshake(c->handshake);
    return grpc::Status::OK;
  }
  grpc::Status Prove(grpc::ServerContext*, const ::gradwire::proto::ProveRequest* req,
                     ::gradwire::proto::ProveResponse* resp) override {
    StoreSessions::Verdict v = sessions_.Prove(req->handshake(), req->proof());
    if (v.bytes.empty()) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::string(v.refused.message()));
    resp->set_verdict(v.bytes);
    resp->set_session(v.session);
    return grpc::Status::OK;
  }
  absl::Notification answer;

 private:
  StoreSessions sessions_;
};

// The handshake with the store may take longer than a progress interval: it is not cut
// off at the interval (which failed Join with DEADLINE_EXCEEDED), and Join goes on
// saying that it waits until the store answers.
TEST(RendezvousProgressTest, AStoreSlowToAuthenticateIsWaitedForPastTheProgressInterval) {
  SlowHandshakeStore service("the secret");
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  AgentOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.rendezvous = absl::StrCat("127.0.0.1:", port);
  o.security.secret = "the secret";
  Said said;
  absl::StatusOr<std::unique_ptr<Rendezvous>> joined;
  std::thread join([&] { joined = Rendezvous::Join(o, absl::Now() + absl::Seconds(60), said.progress()); });
  // Two progress lines: the handshake has waited more than one interval.
  said.AwaitCount(2);
  service.answer.Notify();
  join.join();
  EXPECT_TRUE(joined.ok()) << joined.status();
  const std::vector<std::string> lines = said.lines();
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines[0].find(absl::StrCat("rank 1: waiting for the rendezvous store at 127.0.0.1:", port)),
            std::string::npos)
      << lines[0];
  server->Shutdown();
}

}  // namespace
}  // namespace gw::rpc::internal
