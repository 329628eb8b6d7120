#include "store/builtin_store.h"

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/proto/store.grpc.pb.h"
#include "gradwire/rpc/internal/grpc_server.h"
#include "security/grpc_credentials.h"
#include "security/refusal_log.h"
#include "store/store_sessions.h"

namespace gw::rpc {
namespace {

namespace pb = ::gradwire::proto;

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

absl::Time DeadlineFromMs(int64_t ms) {
  return ms <= 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(ms);
}

std::string Metadata(const grpc::ServerContext* ctx, const char* key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

grpc::Status ToGrpc(const absl::Status& s) {
  return s.ok() ? grpc::Status::OK : grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

class StoreService final : public pb::Store::Service {
 public:
  explicit StoreService(const Security& security) {
    if (security.authenticates()) {
      sessions_ = std::make_unique<internal::StoreSessions>(security.secret, security.handshake_timeout);
    }
  }

  grpc::Status Hello(grpc::ServerContext* ctx, const pb::HelloRequest* req, pb::HelloResponse* resp) override {
    if (!sessions_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this store does not authenticate (its host runs without a job secret)");
    }
    const std::string peer = ctx->peer();  // "ipv4:1.2.3.4:5678": its address without the port
    absl::StatusOr<internal::StoreSessions::Challenge> c =
        sessions_->Hello(peer.substr(0, peer.rfind(':')), req->hello());
    if (!c.ok()) return Refuse(ctx, c.status());
    resp->set_challenge(c->bytes);
    resp->set_handshake(c->handshake);
    return grpc::Status::OK;
  }

  grpc::Status Prove(grpc::ServerContext* ctx, const pb::ProveRequest* req, pb::ProveResponse* resp) override {
    if (!sessions_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this store does not authenticate");
    internal::StoreSessions::Verdict v = sessions_->Prove(req->handshake(), req->proof());
    if (v.bytes.empty()) return Refuse(ctx, v.refused);
    if (!v.refused.ok()) Refuse(ctx, v.refused);  // logged; the verdict says no
    resp->set_verdict(v.bytes);
    resp->set_session(v.session);
    return grpc::Status::OK;
  }

  grpc::Status Set(grpc::ServerContext* ctx, const pb::SetRequest* req, pb::SetResponse*) override {
    if (grpc::Status a = Authorize(ctx, "Set", *req); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    data_[req->key()] = req->value();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* ctx, const pb::GetRequest* req, pb::GetResponse* resp) override {
    if (grpc::Status a = Authorize(ctx, "Get", *req); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    if (!AwaitKeys({req->key()}, DeadlineFromMs(req->timeout_ms()), ctx)) {
      return Missing(req->key());
    }
    resp->set_value(data_[req->key()]);
    return grpc::Status::OK;
  }

  grpc::Status Add(grpc::ServerContext* ctx, const pb::AddRequest* req, pb::AddResponse* resp) override {
    if (grpc::Status a = Authorize(ctx, "Add", *req); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    int64_t v = 0;
    auto it = data_.find(req->key());
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &v)) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("store key '", req->key(), "' does not hold a counter"));
    }
    v += req->delta();
    data_[req->key()] = absl::StrCat(v);
    resp->set_value(v);
    return grpc::Status::OK;
  }

  grpc::Status Wait(grpc::ServerContext* ctx, const pb::WaitRequest* req, pb::WaitResponse*) override {
    if (grpc::Status a = Authorize(ctx, "Wait", *req); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    if (!AwaitKeys(keys, DeadlineFromMs(req->timeout_ms()), ctx)) {
      for (const auto& k : keys) {
        if (!data_.contains(k)) return Missing(k);
      }
      return grpc::Status(grpc::StatusCode::CANCELLED, "store is shutting down");
    }
    return grpc::Status::OK;
  }

  grpc::Status Delete(grpc::ServerContext* ctx, const pb::DeleteRequest* req, pb::DeleteResponse* resp) override {
    if (grpc::Status a = Authorize(ctx, "Delete", *req); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    resp->set_deleted(data_.erase(req->key()) > 0);
    return grpc::Status::OK;
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }

 private:
  // Every data call of an authenticating store carries its session's MAC (store_sessions.h).
  grpc::Status Authorize(grpc::ServerContext* ctx, const char* method, const google::protobuf::Message& req) {
    if (!sessions_) return grpc::Status::OK;
    absl::Status s = sessions_->Authorize(Metadata(ctx, "gw-session"), Metadata(ctx, "gw-seq"), Metadata(ctx, "gw-mac"),
                                          method, req.SerializeAsString());
    return s.ok() ? grpc::Status::OK : Refuse(ctx, s);
  }

  grpc::Status Refuse(grpc::ServerContext* ctx, const absl::Status& why) {
    refusals_.Refused(ctx->peer(), why);
    return ToGrpc(why);
  }

  // Waits (bounded, and at most 100 ms at a time so that cancelled calls and shutdown
  // are noticed) until every key exists.
  bool AwaitKeys(const std::vector<std::string>& keys, absl::Time deadline, grpc::ServerContext* ctx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (stopping_) return true;
      for (const auto& k : keys) {
        if (!data_.contains(k)) return false;
      }
      return true;
    };
    while (!present()) {
      const absl::Time now = absl::Now();
      if (now >= deadline || ctx->IsCancelled()) return false;
      mu_.AwaitWithDeadline(absl::Condition(&present), std::min(deadline, now + absl::Milliseconds(100)));
    }
    return !stopping_;
  }

  grpc::Status Missing(const std::string& key) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("store key '", key, "' did not appear in time"));
  }

  std::unique_ptr<internal::StoreSessions> sessions_;  // null: no authentication
  internal::RefusalLog refusals_{"a call to the rendezvous store"};
  absl::Mutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

class GrpcStoreServer final : public StoreServer {
 public:
  explicit GrpcStoreServer(const Security& security) : service_(security) {}

  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host, int port,
                                                            const Security& security) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = internal::ServerCredentials(security.tls);
    if (!creds.ok()) return creds.status();
    auto server = std::make_unique<GrpcStoreServer>(security);
    grpc::ServerBuilder builder;
    int bound = 0;
    builder.AddListeningPort(absl::StrCat(host, ":", port), *creds, &bound);
    builder.RegisterService(&server->service_);
    if (!server->server_.Start(builder) || bound == 0) {
      return absl::UnavailableError(absl::StrCat("cannot start the rendezvous store on ", host, ":", port,
                                                 " (port in use? choose another MASTER_PORT)"));
    }
    server->port_ = bound;
    server->host_ = host;
    return std::unique_ptr<StoreServer>(std::move(server));
  }
  ~GrpcStoreServer() override { Shutdown(); }
  int port() const override { return port_; }
  std::string address() const override { return absl::StrCat(host_, ":", port_); }
  void Shutdown() override {
    server_.Stop(absl::Seconds(1), [this] { service_.Stop(); });
  }

 private:
  StoreService service_;
  internal::GrpcServer server_;
  int port_ = 0;
  std::string host_;
};

class GrpcStore final : public Store {
 public:
  GrpcStore(std::string address, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), stub_(pb::Store::NewStub(channel)) {}

  // Opens a session (store_sessions.h) by the job secret's challenge-response; later
  // calls are signed with it, and open a new one if the store dropped it.
  absl::Status Authenticate(const std::string& secret, absl::Time deadline) {
    internal::Handshake hs(internal::Handshake::Role::kClient, secret, std::string(internal::kStorePurpose));
    pb::HelloRequest hello;
    hello.set_hello(hs.TakeOutput());
    pb::HelloResponse challenge;
    for (absl::Duration backoff = absl::Milliseconds(10);; backoff = std::min(2 * backoff, absl::Milliseconds(500))) {
      grpc::ClientContext ctx1;
      SetDeadline(&ctx1, deadline - absl::Now());
      absl::Status s = FromGrpc(stub_->Hello(&ctx1, hello, &challenge), Refused());
      if (s.ok()) break;
      // Too many handshakes pending from this address (store_sessions.h): others' finish soon.
      if (s.code() != absl::StatusCode::kResourceExhausted || absl::Now() + backoff >= deadline) return s;
      absl::SleepFor(backoff);
    }
    if (challenge.challenge().size() != hs.wanted()) {
      return absl::UnauthenticatedError(absl::StrCat(Refused(), ": its answer is not a gradwire handshake"));
    }
    if (absl::Status s = hs.OnInput(challenge.challenge()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(Refused(), ": ", s.message()));
    }
    pb::ProveRequest prove;
    prove.set_handshake(challenge.handshake());
    prove.set_proof(hs.TakeOutput());
    pb::ProveResponse verdict;
    grpc::ClientContext ctx2;
    SetDeadline(&ctx2, deadline - absl::Now());
    if (absl::Status s = FromGrpc(stub_->Prove(&ctx2, prove, &verdict), Refused()); !s.ok()) return s;
    if (verdict.verdict().size() != hs.wanted()) {
      return absl::UnauthenticatedError(absl::StrCat(Refused(), ": its verdict is not a gradwire handshake"));
    }
    if (absl::Status s = hs.OnInput(verdict.verdict()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(Refused(), ": ", s.message()));
    }
    absl::MutexLock lock(&mu_);
    secret_ = secret;
    signer_ = std::make_shared<internal::CallSigner>(verdict.session(), hs.session_key());
    return absl::OkStatus();
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    pb::SetRequest req;
    req.set_key(key);
    req.set_value(value);
    pb::SetResponse resp;
    return FromGrpc(Call("Set", &pb::Store::Stub::Set, req, &resp, kRpcTimeout), What("Set", key));
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    pb::GetRequest req;
    req.set_key(key);
    req.set_timeout_ms(TimeoutMs(timeout));
    pb::GetResponse resp;
    if (absl::Status s =
            FromGrpc(Call("Get", &pb::Store::Stub::Get, req, &resp, timeout + kRpcTimeout), What("Get", key));
        !s.ok()) {
      return s;
    }
    return resp.value();
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    pb::AddRequest req;
    req.set_key(key);
    req.set_delta(delta);
    pb::AddResponse resp;
    if (absl::Status s = FromGrpc(Call("Add", &pb::Store::Stub::Add, req, &resp, kRpcTimeout), What("Add", key));
        !s.ok()) {
      return s;
    }
    return resp.value();
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    pb::WaitRequest req;
    for (const auto& k : keys) req.add_keys(k);
    req.set_timeout_ms(TimeoutMs(timeout));
    pb::WaitResponse resp;
    return FromGrpc(Call("Wait", &pb::Store::Stub::Wait, req, &resp, timeout + kRpcTimeout),
                    What("Wait", keys.empty() ? "" : keys[0]));
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    pb::DeleteRequest req;
    req.set_key(key);
    pb::DeleteResponse resp;
    if (absl::Status s =
            FromGrpc(Call("Delete", &pb::Store::Stub::Delete, req, &resp, kRpcTimeout), What("Delete", key));
        !s.ok()) {
      return s;
    }
    return resp.deleted();
  }

 private:
  static constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

  static int64_t TimeoutMs(absl::Duration d) {
    return d == absl::InfiniteDuration() ? 0 : std::max<int64_t>(1, absl::ToInt64Milliseconds(d));
  }
  static void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
    if (d < absl::Hours(24 * 365)) {
      ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(d)));
    }
  }

  // One store call, signed when this client has a session; a session the store dropped
  // is opened again once.
  template <typename Req, typename Resp>
  grpc::Status Call(const char* method, grpc::Status (pb::Store::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp, absl::Duration timeout) {
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      SetDeadline(&ctx, timeout);
      std::shared_ptr<internal::CallSigner> signer;
      std::string secret;
      {
        absl::MutexLock lock(&mu_);
        signer = signer_;
        secret = secret_;
      }
      if (signer) {
        internal::CallSigner::Signature sig = signer->Sign(method, req.SerializeAsString());
        ctx.AddMetadata("gw-session", sig.session);
        ctx.AddMetadata("gw-seq", sig.seq);
        ctx.AddMetadata("gw-mac", sig.mac);
      }
      grpc::Status s = (stub_.get()->*rpc)(&ctx, req, resp);
      if (attempt == 0 && signer && s.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
          absl::StrContains(s.error_message(), "unknown session") &&
          Authenticate(secret, absl::Now() + kRpcTimeout).ok()) {
        continue;
      }
      return s;
    }
  }
  std::string Refused() const {
    return absl::StrCat("authentication with the rendezvous store at ", address_, " failed");
  }
  std::string What(const char* op, const std::string& key) const {
    return absl::StrCat("store ", address_, " ", op, "('", key, "')");
  }

  std::string address_;
  std::unique_ptr<pb::Store::Stub> stub_;
  absl::Mutex mu_;
  std::string secret_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<internal::CallSigner> signer_ ABSL_GUARDED_BY(mu_);  // null: the store does not authenticate us
};

}  // namespace

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host, int port,
                                                                const Security& security) {
  return GrpcStoreServer::Start(host, port, security);
}

absl::StatusOr<std::unique_ptr<Store>> internal::ConnectBuiltinStore(const std::string& address, absl::Time deadline,
                                                                     const Security& security) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = internal::ChannelCredentials(security.tls, &args);
  if (!creds.ok()) return creds.status();
  auto channel = grpc::CreateCustomChannel(address, *creds, args);
  const auto tp = std::chrono::system_clock::now() +
                  std::chrono::milliseconds(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
  if (!channel->WaitForConnected(tp)) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the rendezvous store at ", address,
                     " (is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same on every worker?",
                     security.tls.enabled() ? " With TLS: is its certificate signed by this job's CA?" : "", ")"));
  }
  auto store = std::make_unique<GrpcStore>(address, channel);
  if (security.authenticates()) {
    if (absl::Status s = store->Authenticate(security.secret, deadline); !s.ok()) return s;
  }
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace gw::rpc
