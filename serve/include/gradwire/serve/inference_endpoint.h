// InferenceEndpoint and InferenceClient: models of a gradwire job called from outside it,
// over gRPC (proto/gradwire/proto/inference.proto: service gradwire.serve.Inference).
//
// Contract
//   - InferenceEndpoint::Start(serving, host, port) serves Inference on host:port (port 0
//     picks a free one: port()) from a worker of the job: Predict routes the request to a
//     replica of its model through a Router of that worker (router.h: failover included)
//     and answers with its rows, version and replica; Health answers "SERVING" until
//     Shutdown; ModelStatus says whether any replica serves the model (readiness) and each
//     replica's statistics.
//   - Errors keep their code across gRPC (absl and gRPC share the numbering) and their
//     message: INVALID_ARGUMENT for a malformed tensor (data that does not match its shape
//     or dtype, naming both) or a wrong shape for the model, UNAVAILABLE when no replica
//     serves it, RESOURCE_EXHAUSTED when every replica's queue is full, DEADLINE_EXCEEDED,
//     FAILED_PRECONDITION when the request names a version the replica does not serve.
//   - Any gRPC client can call it from the .proto alone (tested with a Python grpcio client:
//     serve/tests/grpc_python_client.py), and the endpoint also serves gRPC server
//     reflection, so tools without the .proto (grpcurl, grpc_cli) can list the service and
//     fetch its schema (the same test calls Predict from the reflected schema alone).
//   - Requests are limited to options.max_message_bytes (gRPC refuses larger ones with
//     RESOURCE_EXHAUSTED).
//   - Shutdown (and the destructor) stops taking requests and waits for those running
//     (bounded). Thread-safe.
//   - InferenceClient::Connect(address) is a C++ client of any endpoint: Predict(model,
//     tensor, timeout) -> Prediction, Health(), Ready(model).
#ifndef GRADWIRE_SERVE_INFERENCE_ENDPOINT_H_
#define GRADWIRE_SERVE_INFERENCE_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/serve/prediction.h"
#include "gradwire/serve/serving.h"

namespace gw::serve {

struct EndpointOptions {
  absl::Duration default_timeout = absl::Seconds(10);
  int max_message_bytes = 64 << 20;
};

class InferenceEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<InferenceEndpoint>> Start(std::shared_ptr<Serving> serving,
                                                                  const std::string& host, int port,
                                                                  EndpointOptions options = {});
  virtual ~InferenceEndpoint() = default;
  virtual int port() const = 0;
  virtual std::string address() const = 0;
  virtual void Shutdown() = 0;
};

class InferenceClient {
 public:
  static absl::StatusOr<std::unique_ptr<InferenceClient>> Connect(const std::string& address,
                                                                  absl::Duration timeout = absl::Seconds(10));
  virtual ~InferenceClient() = default;
  virtual absl::StatusOr<Prediction> Predict(const std::string& model, const Tensor& input,
                                             absl::Duration timeout = absl::ZeroDuration(),
                                             const std::string& version = "") = 0;
  // "SERVING" or "NOT_SERVING".
  virtual absl::StatusOr<std::string> Health() = 0;
  // Whether any replica serves `model`.
  virtual absl::StatusOr<bool> Ready(const std::string& model) = 0;
};

}  // namespace gw::serve

#endif  // GRADWIRE_SERVE_INFERENCE_ENDPOINT_H_
