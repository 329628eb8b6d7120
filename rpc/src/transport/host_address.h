// Internal: the host part of addresses, and which address of this host its peers reach.
//
// Contract
//   - SplitHostPort parses "host:port" or "[v6]:port" (brackets removed from the host);
//     JoinHostPort writes it back, bracketing IPv6 literals. Every transport returns its
//     dialable address through JoinHostPort.
//   - IsLoopbackHost: "localhost", 127.0.0.0/8 and ::1 (literals; other names are not
//     resolved). IsWildcardHost: 0.0.0.0 and :: (an address that binds every interface
//     and that no peer can dial).
//   - LocalAddressToward(host) is the address of the interface through which this host
//     reaches `host` (resolved first): the source address the kernel picks for a UDP
//     socket connected to it (connect() on UDP sends nothing). For an address of this
//     host (loopback included) it is that address. INVALID_ARGUMENT when `host` cannot be
//     resolved, UNAVAILABLE when no route leads there; the message names the host, the
//     caller says which setting to change.
//   - Thread-safe (no state).
#ifndef GRADWIRE_RPC_SRC_TRANSPORT_HOST_ADDRESS_H_
#define GRADWIRE_RPC_SRC_TRANSPORT_HOST_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace gw::rpc::internal {

struct HostPort {
  std::string host;
  int port = 0;
};

absl::StatusOr<HostPort> SplitHostPort(const std::string& address);
std::string JoinHostPort(const std::string& host, int port);

bool IsLoopbackHost(const std::string& host);
bool IsWildcardHost(const std::string& host);

absl::StatusOr<std::string> LocalAddressToward(const std::string& host);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_TRANSPORT_HOST_ADDRESS_H_
