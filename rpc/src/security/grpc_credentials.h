// Internal: the gRPC credentials of a job's Security (security.h), shared by the grpc
// transport and the rendezvous store (its server, its client and etcd's client).
//
// Contract
//   - Without TLS: insecure credentials (the job secret is checked by the caller's own
//     challenge-response). With TLS: the server presents cert/key and requires and
//     verifies a client certificate signed by the CA; the client presents cert/key and
//     verifies the server's against the CA, the name checked being
//     TlsOptions::server_name (ChannelArgs: SetSslTargetNameOverride) unless
//     `check_host` (etcd: the server's own certificate names its host).
//   - INVALID_ARGUMENT naming a file that cannot be read.
#ifndef GRADWIRE_RPC_SRC_SECURITY_GRPC_CREDENTIALS_H_
#define GRADWIRE_RPC_SRC_SECURITY_GRPC_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/statusor.h"
#include "gradwire/rpc/security.h"

namespace gw::rpc::internal {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsOptions& tls);
// Also sets what the channel needs in `args`.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsOptions& tls,
                                                                             grpc::ChannelArguments* args,
                                                                             bool check_host = false);

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_SECURITY_GRPC_CREDENTIALS_H_
