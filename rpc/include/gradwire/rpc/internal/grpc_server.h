// A gRPC server started once and stopped once (internal: rpc's rendezvous store server
// and serve's inference endpoint share it).
//
// Contract
//   - Start(builder): builds and starts the builder's server; false when it did not start
//     (the port in use, say). At most once.
//   - Stop(grace, before): the first call after a successful Start runs `before` (the
//     service's own stop: wake the calls that wait inside it), shuts the server down,
//     giving calls in flight `grace` before they are cancelled, and waits until it is
//     down; later calls, and calls without a started server, do nothing.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_INTERNAL_GRPC_SERVER_H_
#define GRADWIRE_RPC_INTERNAL_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gw::rpc::internal {

class GrpcServer {
 public:
  bool Start(grpc::ServerBuilder& builder) {
    std::unique_ptr<grpc::Server> started = builder.BuildAndStart();
    absl::MutexLock lock(&mu_);
    server_ = std::move(started);
    return server_ != nullptr;
  }

  void Stop(absl::Duration grace, const std::function<void()>& before = {}) {
    absl::MutexLock lock(&mu_);
    if (!server_) return;
    if (before) before();
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
    server_->Wait();
    server_.reset();
  }

 private:
  absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_INTERNAL_GRPC_SERVER_H_
