#include "gradwire/rpc/store.h"

#include <grpcpp/grpcpp.h>

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "etcd_store.h"
#include "gradwire/proto/store.grpc.pb.h"

namespace gw::rpc {
namespace {

namespace pb = ::gradwire::proto;

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

absl::Time DeadlineFromMs(int64_t ms) {
  return ms <= 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(ms);
}

class StoreService final : public pb::Store::Service {
 public:
  grpc::Status Set(grpc::ServerContext*, const pb::SetRequest* req, pb::SetResponse*) override {
    absl::MutexLock lock(&mu_);
    data_[req->key()] = req->value();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* ctx, const pb::GetRequest* req, pb::GetResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (!AwaitKeys({req->key()}, DeadlineFromMs(req->timeout_ms()), ctx)) {
      return Missing(req->key());
    }
    resp->set_value(data_[req->key()]);
    return grpc::Status::OK;
  }

  grpc::Status Add(grpc::ServerContext*, const pb::AddRequest* req, pb::AddResponse* resp) override {
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

  grpc::Status Delete(grpc::ServerContext*, const pb::DeleteRequest* req, pb::DeleteResponse* resp) override {
    absl::MutexLock lock(&mu_);
    resp->set_deleted(data_.erase(req->key()) > 0);
    return grpc::Status::OK;
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }

 private:
  // Waits (bounded, and at most 100 ms at a time so that cancelled calls and shutdown
  // are noticed) until every key exists.
  bool AwaitKeys(const std::vector<std::string>& keys, absl::Time deadline,
                 grpc::ServerContext* ctx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  absl::Mutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

class GrpcStoreServer final : public StoreServer {
 public:
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host, int port) {
    auto server = std::make_unique<GrpcStoreServer>();
    grpc::ServerBuilder builder;
    int bound = 0;
    builder.AddListeningPort(absl::StrCat(host, ":", port), grpc::InsecureServerCredentials(), &bound);
    builder.RegisterService(&server->service_);
    server->server_ = builder.BuildAndStart();
    if (!server->server_ || bound == 0) {
      return absl::UnavailableError(absl::StrCat(
          "cannot start the rendezvous store on ", host, ":", port,
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
    absl::MutexLock lock(&mu_);
    if (!server_) return;
    service_.Stop();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }

 private:
  StoreService service_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string host_;
};

class GrpcStore final : public Store {
 public:
  GrpcStore(std::string address, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), stub_(pb::Store::NewStub(channel)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    pb::SetRequest req;
    req.set_key(key);
    req.set_value(value);
    pb::SetResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kRpcTimeout);
    return FromGrpc(stub_->Set(&ctx, req, &resp), What("Set", key));
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    pb::GetRequest req;
    req.set_key(key);
    req.set_timeout_ms(TimeoutMs(timeout));
    pb::GetResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout + kRpcTimeout);
    if (absl::Status s = FromGrpc(stub_->Get(&ctx, req, &resp), What("Get", key)); !s.ok()) return s;
    return resp.value();
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    pb::AddRequest req;
    req.set_key(key);
    req.set_delta(delta);
    pb::AddResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kRpcTimeout);
    if (absl::Status s = FromGrpc(stub_->Add(&ctx, req, &resp), What("Add", key)); !s.ok()) return s;
    return resp.value();
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    pb::WaitRequest req;
    for (const auto& k : keys) req.add_keys(k);
    req.set_timeout_ms(TimeoutMs(timeout));
    pb::WaitResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout + kRpcTimeout);
    return FromGrpc(stub_->Wait(&ctx, req, &resp), What("Wait", keys.empty() ? "" : keys[0]));
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    pb::DeleteRequest req;
    req.set_key(key);
    pb::DeleteResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kRpcTimeout);
    if (absl::Status s = FromGrpc(stub_->Delete(&ctx, req, &resp), What("Delete", key)); !s.ok()) return s;
    return resp.deleted();
  }

 private:
  static constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

  static int64_t TimeoutMs(absl::Duration d) {
    return d == absl::InfiniteDuration() ? 0 : std::max<int64_t>(1, absl::ToInt64Milliseconds(d));
  }
  static void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
    if (d < absl::Hours(24 * 365)) {
      ctx->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(d)));
    }
  }
  std::string What(const char* op, const std::string& key) const {
    return absl::StrCat("store ", address_, " ", op, "('", key, "')");
  }

  std::string address_;
  std::unique_ptr<pb::Store::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host, int port) {
  return GrpcStoreServer::Start(host, port);
}

absl::StatusOr<std::unique_ptr<Store>> ConnectStore(const std::string& address, absl::Time deadline) {
  if (internal::IsEtcdUrl(address)) {
    absl::StatusOr<std::unique_ptr<internal::EtcdStore>> etcd = internal::ConnectEtcdStore(address, deadline);
    if (!etcd.ok()) return etcd.status();
    return std::unique_ptr<Store>(*std::move(etcd));
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  const auto tp = std::chrono::system_clock::now() +
                  std::chrono::milliseconds(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
  if (!channel->WaitForConnected(tp)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the rendezvous store at ", address,
        " (is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same on every worker?)"));
  }
  return std::unique_ptr<Store>(std::make_unique<GrpcStore>(address, channel));
}

}  // namespace gw::rpc
