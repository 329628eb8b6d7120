#include "test_certs.h"

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace gw::rpc::testing {
const TestCerts* MakeTestCerts() {
  char dir[] = "/tmp/gw-certs-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return nullptr;
  const std::string script = std::string(GRADWIRE_SOURCE_DIR) + "/scripts/make-certs";
  for (const std::string& cmd : {absl::StrCat(script, " ", dir, "/job a b 2>/dev/null"),
                                 absl::StrCat(script, " ", dir, "/other x 2>/dev/null")}) {
    if (std::system(cmd.c_str()) != 0) return nullptr;
  }
  return new TestCerts(dir);
}

const TestCerts* TestCerts::Get() {
  static const TestCerts* certs = MakeTestCerts();
  return certs;
}

TlsOptions TestCerts::Job(const std::string& name) const {
  return {.cert_file = dir_ + "/job/" + name + ".pem", .key_file = dir_ + "/job/" + name + ".key",
          .ca_file = dir_ + "/job/ca.pem"};
}

TlsOptions TestCerts::Other() const {
  return {.cert_file = dir_ + "/other/x.pem", .key_file = dir_ + "/other/x.key", .ca_file = dir_ + "/other/ca.pem"};
}

}  // namespace gw::rpc::testing
