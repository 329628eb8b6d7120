#include "security/grpc_credentials.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace gw::rpc::internal {
namespace {

absl::StatusOr<std::string> ReadPem(const char* what, const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("TLS ", what, " '", path, "' cannot be read"));
  }
  return text.str();
}

struct Pems {
  std::string cert, key, ca;
};

absl::StatusOr<Pems> ReadPems(const TlsOptions& tls) {
  Pems p;
  for (auto [what, path, out] : {std::tuple{"certificate", &tls.cert_file, &p.cert},
                                 std::tuple{"key", &tls.key_file, &p.key}, std::tuple{"CA", &tls.ca_file, &p.ca}}) {
    absl::StatusOr<std::string> pem = ReadPem(what, *path);
    if (!pem.ok()) return pem.status();
    *out = *std::move(pem);
  }
  return p;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  absl::StatusOr<Pems> p = ReadPems(tls);
  if (!p.ok()) return p.status();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = p->ca;
  o.pem_key_cert_pairs.push_back({p->key, p->cert});
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsOptions& tls,
                                                                             grpc::ChannelArguments* args,
                                                                             bool check_host) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<Pems> p = ReadPems(tls);
  if (!p.ok()) return p.status();
  if (!check_host && !tls.server_name.empty()) args->SetSslTargetNameOverride(tls.server_name);
  return grpc::SslCredentials({.pem_root_certs = p->ca, .pem_private_key = p->key, .pem_cert_chain = p->cert});
}

}  // namespace gw::rpc::internal
