#include "gradwire/serve/inference_endpoint.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/proto/inference.grpc.pb.h"
#include "gradwire/rpc/internal/grpc_server.h"
#include "gradwire/serve/router.h"
#include "gradwire/tensor/kernels.h"

namespace gw::serve {
namespace {

namespace pb = ::gradwire::serve;

grpc::Status ToGrpc(const absl::Status& s) {
  return s.ok() ? grpc::Status::OK : grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& address) {
  if (s.ok()) return absl::OkStatus();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat("inference endpoint ", address, " is unavailable: ", s.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// The element size and count a proto tensor's data field holds for its dtype.
absl::StatusOr<Tensor> FromProto(const pb::Tensor& p) {
  DType dtype;
  switch (p.dtype()) {
    case pb::Tensor::FLOAT32:
      dtype = DType::kFloat32;
      break;
    case pb::Tensor::FLOAT64:
      dtype = DType::kFloat64;
      break;
    case pb::Tensor::INT64:
      dtype = DType::kInt64;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("tensor: unknown dtype ", p.dtype()));
  }
  Shape shape(p.shape().begin(), p.shape().end());
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > (int64_t{1} << 40)) return absl::InvalidArgumentError(absl::StrCat("tensor: bad dimension ", d));
    numel *= d;
  }
  const size_t elem = ElementSize(dtype);
  const int64_t given = !p.raw_data().empty()      ? static_cast<int64_t>(p.raw_data().size() / elem)
                        : dtype == DType::kFloat32 ? p.float_data_size()
                        : dtype == DType::kFloat64 ? p.double_data_size()
                                                   : p.int64_data_size();
  if ((!p.raw_data().empty() && p.raw_data().size() % elem != 0) || given != numel) {
    return absl::InvalidArgumentError(absl::StrCat("tensor: shape ", ShapeToString(shape), " ", DTypeName(dtype),
                                                   " needs ", numel, " elements, the request holds ", given,
                                                   p.raw_data().empty() ? "" : " (raw_data)"));
  }
  Tensor t = Tensor::Empty(shape, dtype);
  if (numel == 0) return t;
  const void* src = !p.raw_data().empty()      ? static_cast<const void*>(p.raw_data().data())
                    : dtype == DType::kFloat32 ? static_cast<const void*>(p.float_data().data())
                    : dtype == DType::kFloat64 ? static_cast<const void*>(p.double_data().data())
                                               : static_cast<const void*>(p.int64_data().data());
  std::memcpy(t.raw_data(), src, static_cast<size_t>(numel) * elem);
  return t;
}

void ToProto(const Tensor& t, pb::Tensor* p) {
  const Tensor c = kernels::Contiguous(t);
  p->set_dtype(c.dtype() == DType::kFloat64 ? pb::Tensor::FLOAT64
               : c.dtype() == DType::kInt64 ? pb::Tensor::INT64
                                            : pb::Tensor::FLOAT32);
  for (int64_t d : c.sizes()) p->add_shape(d);
  p->set_raw_data(c.raw_data(), c.nbytes());
}

class Service final : public pb::Inference::Service {
 public:
  Service(std::shared_ptr<Serving> serving, EndpointOptions options)
      : serving_(std::move(serving)), options_(options) {}

  grpc::Status Predict(grpc::ServerContext*, const pb::PredictRequest* req, pb::PredictResponse* resp) override {
    absl::StatusOr<Tensor> input = FromProto(req->input());
    if (!input.ok()) {
      return ToGrpc(absl::InvalidArgumentError(absl::StrCat("model '", req->model(), "': ", input.status().message())));
    }
    absl::StatusOr<Router> router = RouterFor(req->model());
    if (!router.ok()) return ToGrpc(router.status());
    const absl::Duration timeout =
        req->timeout_ms() > 0 ? absl::Milliseconds(req->timeout_ms()) : options_.default_timeout;
    absl::StatusOr<Prediction> p = router->PredictSync(*std::move(input), timeout);
    if (!p.ok()) return ToGrpc(p.status());
    if (!req->version().empty() && p->version != req->version()) {
      return ToGrpc(absl::FailedPreconditionError(absl::StrCat(
          "model '", req->model(), "': ", p->replica, " serves version ", p->version, ", not ", req->version())));
    }
    ToProto(p->output, resp->mutable_output());
    resp->set_model(req->model());
    resp->set_version(p->version);
    resp->set_replica(p->replica);
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext*, const pb::HealthRequest*, pb::HealthResponse* resp) override {
    absl::MutexLock lock(&mu_);
    resp->set_status(stopping_ ? "NOT_SERVING" : "SERVING");
    return grpc::Status::OK;
  }

  grpc::Status ModelStatus(grpc::ServerContext*, const pb::ModelStatusRequest* req,
                           pb::ModelStatusResponse* resp) override {
    absl::StatusOr<Router> router = RouterFor(req->model());
    if (!router.ok()) return ToGrpc(router.status());
    resp->set_model(req->model());
    const std::vector<std::string> replicas = router->replicas();
    resp->set_ready(!replicas.empty());
    for (const std::string& worker : replicas) {
      pb::ReplicaStatus* r = resp->add_replicas();
      r->set_worker(worker);
      absl::StatusOr<ModelStats> stats = router->ReplicaStats(worker);
      if (!stats.ok()) {
        r->set_error(std::string(stats.status().message()));
        continue;
      }
      r->set_version(stats->version);
      r->set_answered(stats->answered);
      r->set_batches(stats->batches);
      r->set_mean_batch_rows(stats->mean_batch_rows());
      r->set_queue_depth(stats->queue_depth);
      r->set_p50_ms(stats->p50_ms);
      r->set_p99_ms(stats->p99_ms);
    }
    return grpc::Status::OK;
  }

  void Stopping() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }

 private:
  absl::StatusOr<Router> RouterFor(const std::string& model) {
    if (model.empty()) return absl::InvalidArgumentError("the request names no model");
    absl::MutexLock lock(&mu_);
    auto it = routers_.find(model);
    if (it != routers_.end()) return it->second;
    absl::StatusOr<Router> router = Router::Create(serving_, model, {.timeout = options_.default_timeout});
    if (router.ok()) routers_.emplace(model, *router);
    return router;
  }

  const std::shared_ptr<Serving> serving_;
  const EndpointOptions options_;
  absl::Mutex mu_;
  std::map<std::string, Router> routers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

class GrpcEndpoint final : public InferenceEndpoint {
 public:
  GrpcEndpoint(std::shared_ptr<Serving> serving, EndpointOptions options) : service_(std::move(serving), options) {}
  ~GrpcEndpoint() override { Shutdown(); }

  absl::Status Start(const std::string& host, int port, const EndpointOptions& options) {
    // gRPC server reflection: tools that have no .proto (grpcurl, grpc_cli) can list the
    // service and fetch its schema from the endpoint. (gRPC's plugin registry; idempotent.)
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat(host, ":", port), grpc::InsecureServerCredentials(), &port_);
    builder.SetMaxReceiveMessageSize(options.max_message_bytes);
    builder.SetMaxSendMessageSize(options.max_message_bytes);
    builder.RegisterService(&service_);
    if (!server_.Start(builder) || port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot start the inference endpoint on ", host, ":", port, " (port in use? choose another)"));
    }
    host_ = host;
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  std::string address() const override { return absl::StrCat(host_, ":", port_); }
  void Shutdown() override {
    server_.Stop(absl::Seconds(5), [this] { service_.Stopping(); });
  }

 private:
  Service service_;
  rpc::internal::GrpcServer server_;
  int port_ = 0;
  std::string host_;
};

class GrpcClient final : public InferenceClient {
 public:
  GrpcClient(std::string address, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), stub_(pb::Inference::NewStub(channel)) {}

  absl::StatusOr<Prediction> Predict(const std::string& model, const Tensor& input, absl::Duration timeout,
                                     const std::string& version) override {
    pb::PredictRequest req;
    req.set_model(model);
    ToProto(input, req.mutable_input());
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    req.set_version(version);
    pb::PredictResponse resp;
    grpc::ClientContext ctx;
    // The endpoint's own deadline first; the call's a little later, so its error wins.
    const absl::Duration budget = timeout > absl::ZeroDuration() ? timeout : absl::Seconds(60);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + budget + absl::Seconds(5)));
    if (absl::Status s = FromGrpc(stub_->Predict(&ctx, req, &resp), address_); !s.ok()) return s;
    absl::StatusOr<Tensor> output = FromProto(resp.output());
    if (!output.ok()) return output.status();
    return Prediction{*std::move(output), resp.version(), resp.replica()};
  }

  absl::StatusOr<std::string> Health() override {
    pb::HealthResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (absl::Status s = FromGrpc(stub_->Health(&ctx, pb::HealthRequest(), &resp), address_); !s.ok()) return s;
    return resp.status();
  }

  absl::StatusOr<bool> Ready(const std::string& model) override {
    pb::ModelStatusRequest req;
    req.set_model(model);
    pb::ModelStatusResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (absl::Status s = FromGrpc(stub_->ModelStatus(&ctx, req, &resp), address_); !s.ok()) return s;
    return resp.ready();
  }

 private:
  const std::string address_;
  std::unique_ptr<pb::Inference::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<InferenceEndpoint>> InferenceEndpoint::Start(std::shared_ptr<Serving> serving,
                                                                            const std::string& host, int port,
                                                                            EndpointOptions options) {
  if (!serving) return absl::InvalidArgumentError("InferenceEndpoint::Start: no Serving");
  auto endpoint = std::make_unique<GrpcEndpoint>(std::move(serving), options);
  if (absl::Status s = endpoint->Start(host, port, options); !s.ok()) return s;
  return std::unique_ptr<InferenceEndpoint>(std::move(endpoint));
}

absl::StatusOr<std::unique_ptr<InferenceClient>> InferenceClient::Connect(const std::string& address,
                                                                          absl::Duration timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(absl::StrCat("cannot reach the inference endpoint at ", address, " within ",
                                               absl::FormatDuration(timeout), " (is it started? right port?)"));
  }
  return std::unique_ptr<InferenceClient>(new GrpcClient(address, std::move(channel)));
}

}  // namespace gw::serve
