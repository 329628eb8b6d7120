#include "gradwire/rpc/security.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "handshake.h"

namespace gw::rpc {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

absl::Status Readable(const char* what, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("TLS ", what, " file '", path,
                                                   "' cannot be read (scripts/make-certs makes a test CA and "
                                                   "certificates)"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ReadLimit(const char* name, T* field) {
  const std::string v = Env(name);
  if (v.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(v, field) || *field < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", name, "=", v, " (a count, 0 for no limit)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Security::Validate() const {
  if (!tls.enabled()) return absl::OkStatus();
  if (tls.cert_file.empty() || tls.key_file.empty() || tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs a certificate, its key and the job's CA (TlsOptions cert_file, key_file, ca_file; "
        "GRADWIRE_TLS_CERT, GRADWIRE_TLS_KEY, GRADWIRE_TLS_CA): some are missing");
  }
  for (auto [what, path] : {std::pair{"certificate", &tls.cert_file}, std::pair{"key", &tls.key_file},
                            std::pair{"CA", &tls.ca_file}}) {
    if (absl::Status s = Readable(what, *path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Security> Security::FromEnv() {
  Security s;
  if (std::string auth = absl::AsciiStrToLower(Env("GRADWIRE_AUTH")); !auth.empty()) {
    if (auth != "off" && auth != "on") {
      return absl::InvalidArgumentError(absl::StrCat("bad GRADWIRE_AUTH=", auth, " (on or off)"));
    }
    s.authenticate = auth == "on";
  }
  s.secret = Env("GRADWIRE_SECRET");
  if (std::string file = Env("GRADWIRE_SECRET_FILE"); !file.empty() && s.secret.empty()) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat("GRADWIRE_SECRET_FILE=", file,
                                                     " cannot be read: it names the file holding the job's secret"));
    }
    s.secret = std::string(absl::StripTrailingAsciiWhitespace(bytes.str()));
    if (s.secret.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("GRADWIRE_SECRET_FILE=", file, " is empty"));
    }
  }
  s.tls.cert_file = Env("GRADWIRE_TLS_CERT");
  s.tls.key_file = Env("GRADWIRE_TLS_KEY");
  s.tls.ca_file = Env("GRADWIRE_TLS_CA");
  if (absl::Status v = s.Validate(); !v.ok()) return v;
  for (absl::Status v : {ReadLimit("GRADWIRE_MAX_CALLS_IN_FLIGHT", &s.limits.max_calls_in_flight),
                         ReadLimit("GRADWIRE_MAX_RREFS_PER_PEER", &s.limits.max_rrefs),
                         ReadLimit("GRADWIRE_MAX_CONTEXTS_PER_PEER", &s.limits.max_contexts),
                         ReadLimit("GRADWIRE_MAX_CONNECTIONS_PER_SECOND", &s.limits.max_connections_per_second)}) {
    if (!v.ok()) return v;
  }
  return s;
}

std::string MakeJobSecret() {
  return absl::BytesToHexString(internal::Handshake::RandomBytes(32));
}

}  // namespace gw::rpc
