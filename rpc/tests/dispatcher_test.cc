// Unit: Dispatcher, the inbound half of an agent, fed by a real tcp connection.
#include "calls/dispatcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <thread>

#include "absl/synchronization/notification.h"

namespace gw::rpc::internal {
namespace {

// A dispatcher behind a tcp listener, and a client connection to it.
class DispatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dispatcher_ = std::make_unique<Dispatcher>(
        "server", pool_,
        Dispatcher::Peers{[](int rank) { return absl::StrCat("peer", rank); },
                          [](int, uint64_t id, const absl::StatusOr<Value>& result, const CallHooks::Scope&) {
                            return EncodeEnvelope(ReplyEnvelope(id, result));
                          }});
    server_ = *MakeTransport("tcp");
    client_ = *MakeTransport("tcp");
    auto address = server_->Listen(
        "127.0.0.1", "127.0.0.1",
        {[this](const std::shared_ptr<Connection>& c, Message m) {
           absl::StatusOr<Envelope> e = DecodeEnvelope(std::move(m));
           ASSERT_TRUE(e.ok());
           ++reads_;
           dispatcher_->OnRequest(c, /*from=*/3, *std::move(e));
         },
         [](const std::shared_ptr<Connection>&, const absl::Status&) {},
         [this](const std::shared_ptr<Connection>& c) { dispatcher_->OnFlush(c); }});
    ASSERT_TRUE(address.ok());
    auto conn = client_->Connect(*address,
                                 {[this](const std::shared_ptr<Connection>&, Message m) {
                                    absl::StatusOr<Envelope> e = DecodeEnvelope(std::move(m));
                                    ASSERT_TRUE(e.ok());
                                    absl::MutexLock lock(&mu_);
                                    replies_.push_back(*std::move(e));
                                  },
                                  [](const std::shared_ptr<Connection>&, const absl::Status&) {}, nullptr},
                                 absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(conn.ok());
    conn_ = *conn;
  }
  void TearDown() override {
    client_->Shutdown();
    server_->Shutdown();
    pool_.Shutdown();
  }

  void Call(uint64_t id, const std::string& function, ValueList args) {
    Envelope e;
    e.kind = Kind::kRequest;
    e.id = id;
    e.function = function;
    e.payload = Value(std::move(args));
    conn_->Send(*EncodeEnvelope(e));
  }
  std::vector<Envelope> AwaitReplies(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return replies_.size() >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(20)));
    std::vector<Envelope> out(replies_.begin(), replies_.end());
    std::sort(out.begin(), out.end(), [](const Envelope& a, const Envelope& b) { return a.id < b.id; });
    return out;
  }

  ThreadPool pool_{2, "test-pool"};
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<Transport> server_, client_;
  std::shared_ptr<Connection> conn_;
  std::atomic<int> reads_{0};
  absl::Mutex mu_;
  std::deque<Envelope> replies_ ABSL_GUARDED_BY(mu_);
};

TEST_F(DispatcherTest, EveryRequestIsAnsweredOnceWhereverItsHandlerRuns) {
  std::atomic<bool> inline_on_pool{true};
  ASSERT_TRUE(dispatcher_
                  ->Register("inline",
                             [&](const CallInfo& info, ValueList a) {
                               inline_on_pool = false;  // runs on the I/O thread, not the pool
                               EXPECT_EQ(info.caller, "peer3");
                               return MakeReadyFuture<Value>(pool_, Value(a[0].get<int64_t>() + 1));
                             },
                             {HandlerMode::kInline})
                  .ok());
  Promise<Value> later(pool_);
  ASSERT_TRUE(dispatcher_
                  ->Register("later", [&](const CallInfo&, ValueList) { return later.future(); })
                  .ok());
  ASSERT_TRUE(dispatcher_
                  ->Register("pool", [&](const CallInfo& info, ValueList a) {
                    EXPECT_EQ(info.caller_rank, 3);
                    return MakeReadyFuture<Value>(pool_, Value(a[0].get<int64_t>() * 10));
                  })
                  .ok());
  EXPECT_EQ(dispatcher_->Register("pool", [&](const CallInfo&, ValueList) { return later.future(); }).code(),
            absl::StatusCode::kAlreadyExists);
  Call(1, "inline", {Value(int64_t{1})});
  Call(2, "pool", {Value(int64_t{2})});
  Call(3, "later", {});
  Call(4, "nope", {});
  std::vector<Envelope> first = AwaitReplies(3);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].payload.get<int64_t>(), 2);
  EXPECT_EQ(first[1].payload.get<int64_t>(), 20);
  EXPECT_EQ(first[2].id, 4u);
  EXPECT_EQ(first[2].status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(first[2].status.message(), "server has no function 'nope' (registered: inline, later, pool)");
  EXPECT_FALSE(dispatcher_->AwaitIdle(absl::Now() + absl::Milliseconds(50)));  // "later" still runs
  later.Set(Value(std::string("done")));  // answered by the thread that completes it
  std::vector<Envelope> all = AwaitReplies(4);
  EXPECT_EQ(all[2].payload.get<std::string>(), "done");
  EXPECT_TRUE(dispatcher_->AwaitIdle(absl::Now() + absl::Seconds(5)));
  EXPECT_FALSE(inline_on_pool.load());
}

TEST_F(DispatcherTest, ThrowingHandlersAreAnsweredWithAStatusAndReservedNamesAreNotListed) {
  ASSERT_TRUE(dispatcher_
                  ->Register("__proto.x", [&](const CallInfo&, ValueList) { return MakeReadyFuture<Value>(pool_, Value()); })
                  .ok());
  ASSERT_TRUE(dispatcher_
                  ->Register("throws", [](const CallInfo&, ValueList) -> Future<Value> {
                    throw std::runtime_error("no disk");
                  })
                  .ok());
  Call(1, "throws", {});
  Call(2, "missing", {});
  std::vector<Envelope> r = AwaitReplies(2);
  EXPECT_EQ(r[0].status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(r[0].status.message(), "throws threw: no disk");
  EXPECT_EQ(r[1].status.message(), "server has no function 'missing' (registered: throws)");
  EXPECT_TRUE(dispatcher_->AwaitIdle(absl::Now() + absl::Seconds(5)));
}

// A protocol message of a layer that is not installed here is answered with which layer
// is missing and how to install it, naming no internal function.
TEST_F(DispatcherTest, AMissingLayersMessageSaysWhichLayerToInstall) {
  Call(1, "__dist.opt_register", {});
  Call(2, "__ps.pull", {});
  Call(3, "__nobody.knows", {});
  std::vector<Envelope> r = AwaitReplies(3);
  ASSERT_EQ(r.size(), 3u);
  for (const Envelope& e : r) EXPECT_EQ(e.status.code(), absl::StatusCode::kNotFound) << e.status;
  EXPECT_EQ(r[0].status.message().rfind(
                "distributed autograd is not installed on server: call dist_autograd::DistAutograd::Install(agent) "
                "in its Agent::Start setup",
                0),
            0u)
      << r[0].status;
  EXPECT_EQ(r[1].status.message().rfind("no parameter server is installed on server: call "
                                        "param_server::ParameterServer::Install(agent, options)",
                                        0),
            0u)
      << r[1].status;
  for (int i : {0, 1}) EXPECT_EQ(r[i].status.message().find("__"), std::string::npos) << r[i].status;
  EXPECT_NE(r[2].status.message().find("different version of gradwire"), std::string::npos) << r[2].status;
  // The same for a call made here (RRef creation and methods on values owned here).
  absl::StatusOr<Value> local = dispatcher_->InvokeLocal({"client", "__module.forward", 1}, {}, false).Get();
  EXPECT_EQ(local.status().message().rfind("remote modules are not set up on server: register its module factories "
                                           "with dist_nn::RegisterModuleFactory",
                                           0),
            0u)
      << local.status();
}

TEST_F(DispatcherTest, RequestsReadTogetherAreAllAnsweredAndInvokeLocalRunsHere) {
  std::atomic<int> ran{0};
  ASSERT_TRUE(dispatcher_->Register("count", [&](const CallInfo&, ValueList) {
                ++ran;
                return MakeReadyFuture<Value>(pool_, Value(int64_t{0}));
              }).ok());
  ValueList none;
  for (uint64_t i = 1; i <= 200; ++i) Call(i, "count", none);
  EXPECT_EQ(AwaitReplies(200).size(), 200u);
  EXPECT_EQ(ran.load(), 200);
  absl::StatusOr<Value> local = dispatcher_->InvokeLocal(CallInfo{"me", "count", 0}, {}, /*here=*/true).Get(absl::Seconds(5));
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(ran.load(), 201);
  EXPECT_EQ(dispatcher_->InvokeLocal(CallInfo{"me", "nope", 0}, {}, false).Get(absl::Seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
  pool_.Shutdown();  // a pool that takes no more work: InvokeLocal says the worker is going away
  absl::StatusOr<Value> refused = dispatcher_->InvokeLocal(CallInfo{"me", "count", 0}, {}, false).Get(absl::Seconds(5));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.status().message(), "server is unavailable: it is shutting down");
}

}  // namespace
}  // namespace gw::rpc::internal
