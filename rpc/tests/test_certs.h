// TestCerts: certificates for the tests of TLS (security.h), made once per test binary by
// scripts/make-certs in a temporary directory: the job's CA with certificates "a" and
// "b" (both sides of a connection), and another CA with certificate "x" (a stranger).
// Get() is null when they cannot be made (no openssl): tests skip with kMissing. The
// directory (private keys) is removed when the test process exits normally.
#ifndef GRADWIRE_RPC_TESTS_TEST_CERTS_H_
#define GRADWIRE_RPC_TESTS_TEST_CERTS_H_

#include <memory>
#include <string>
#include <utility>

#include <unistd.h>

#include "gradwire/rpc/security.h"

namespace gw::rpc::testing {

class TestCerts;
std::unique_ptr<TestCerts> MakeTestCerts();

class TestCerts {
 public:
  static constexpr char kMissing[] = "scripts/make-certs failed (is openssl installed? scripts/setup-deps installs it)";
  static const TestCerts* Get();
  TlsOptions Job(const std::string& name = "a") const;
  TlsOptions Other() const;
  ~TestCerts();
  TestCerts(const TestCerts&) = delete;
  TestCerts& operator=(const TestCerts&) = delete;

 private:
  friend std::unique_ptr<TestCerts> MakeTestCerts();
  explicit TestCerts(std::string dir) : dir_(std::move(dir)), maker_(::getpid()) {}
  std::string dir_;
  pid_t maker_;
};

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_TEST_CERTS_H_
