#include "gradwire/rpc/transport.h"

#include "absl/strings/str_cat.h"
#include "transport/tcp/tcp_transport.h"

namespace gw::rpc {

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name,
                                                         TransportOptions options) {
  if (name == "tcp") return MakeTcpTransport(options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "' (available: tcp)"));
}

}  // namespace gw::rpc
