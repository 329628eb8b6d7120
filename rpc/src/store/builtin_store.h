// Internal: the built-in rendezvous store's client (its server is StoreServer, store.h):
// a Store over gRPC to the store that rank 0 hosts, for "host:port" addresses.
//
// Contract
//   - ConnectBuiltinStore(address, deadline, security) waits until the channel connects,
//     else UNAVAILABLE naming the address and what to check; with security.authenticates()
//     it runs the job secret's handshake (store_sessions.h) before returning, and every
//     later call is signed.
//   - The Store it returns is thread-safe; its semantics are store.h's.
#ifndef GRADWIRE_RPC_SRC_STORE_BUILTIN_STORE_H_
#define GRADWIRE_RPC_SRC_STORE_BUILTIN_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/security.h"
#include "gradwire/rpc/store.h"

namespace gw::rpc::internal {

absl::StatusOr<std::unique_ptr<Store>> ConnectBuiltinStore(const std::string& address, absl::Time deadline,
                                                           const Security& security);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_STORE_BUILTIN_STORE_H_
