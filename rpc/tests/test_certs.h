// TestCerts: certificates for the tests of TLS (security.h), made once per test binary by
// scripts/make-certs in a temporary directory: the job's CA with certificates "a" and
// "b" (both sides of a connection), and another CA with certificate "x" (a stranger).
// Get() is null when they cannot be made (no openssl): tests skip with kMissing.
#ifndef GRADWIRE_RPC_TESTS_TEST_CERTS_H_
#define GRADWIRE_RPC_TESTS_TEST_CERTS_H_

#include <string>
#include <utility>

#include "gradwire/rpc/security.h"

namespace gw::rpc::testing {

class TestCerts;
const TestCerts* MakeTestCerts();

class TestCerts {
 public:
  static constexpr char kMissing[] = "scripts/make-certs failed (is openssl installed? scripts/setup-deps installs it)";
  static const TestCerts* Get();
  TlsOptions Job(const std::string& name = "a") const;
  TlsOptions Other() const;

 private:
  friend const TestCerts* MakeTestCerts();
  explicit TestCerts(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_TEST_CERTS_H_
