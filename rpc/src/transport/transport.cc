#include "gradwire/rpc/transport.h"

#include "absl/strings/str_cat.h"
#include "transport/fault/fault_transport.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace gw::rpc {

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name, TransportOptions options) {
  if (options.faults != nullptr) {
    std::shared_ptr<FaultInjector> faults = std::move(options.faults);  // the inner one is real
    absl::StatusOr<std::unique_ptr<Transport>> inner = MakeTransport(name, options);
    if (!inner.ok()) return inner.status();
    return MakeFaultTransport(*std::move(inner), std::move(faults), options);
  }
  if (name == "tcp") return MakeTcpTransport(options);
  if (name == "shm") return MakeShmTransport(options);
  if (name == "grpc") return MakeGrpcTransport(options);
  return absl::InvalidArgumentError(absl::StrCat("unknown transport '", name, "' (available: tcp, shm, grpc)"));
}

}  // namespace gw::rpc
