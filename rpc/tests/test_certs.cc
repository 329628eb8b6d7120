#include "test_certs.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"

namespace gw::rpc::testing {

// The certificates' directory holds private keys: it is removed when the process that
// made it exits (not by a child forked from it, which shares the static object: only the
// maker's pid removes it), and at once when making the certificates failed.
TestCerts::~TestCerts() {
  if (::getpid() != maker_ || dir_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::unique_ptr<TestCerts> MakeTestCerts() {
  char dir[] = "/tmp/gw-certs-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return nullptr;
  std::unique_ptr<TestCerts> certs(new TestCerts(dir));  // removes it on every path
  const std::string script = std::string(GRADWIRE_SOURCE_DIR) + "/scripts/make-certs";
  for (const std::string& cmd : {absl::StrCat(script, " ", dir, "/job a b 2>/dev/null"),
                                 absl::StrCat(script, " ", dir, "/other x 2>/dev/null")}) {
    if (std::system(cmd.c_str()) != 0) return nullptr;
  }
  return certs;
}

const TestCerts* TestCerts::Get() {
  static const std::unique_ptr<TestCerts> certs = MakeTestCerts();
  return certs.get();
}

TlsOptions TestCerts::Job(const std::string& name) const {
  return {.cert_file = dir_ + "/job/" + name + ".pem", .key_file = dir_ + "/job/" + name + ".key",
          .ca_file = dir_ + "/job/ca.pem"};
}

TlsOptions TestCerts::Other() const {
  return {.cert_file = dir_ + "/other/x.pem", .key_file = dir_ + "/other/x.key", .ca_file = dir_ + "/other/ca.pem"};
}

}  // namespace gw::rpc::testing
