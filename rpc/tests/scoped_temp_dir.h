// ScopedTempDir: a fresh directory for a test's files (mkdtemp under $TMPDIR, else
// /tmp), removed with everything in it when the object goes, also when an ASSERT ends
// the test early. Only the process that made it removes it (a forked child that exits
// through the same destructor leaves it alone). Header-only: every test binary may use
// it, linked against gradwire_rpc_testing or not (rpc/tests is on its include path).
#ifndef GRADWIRE_RPC_TESTS_SCOPED_TEMP_DIR_H_
#define GRADWIRE_RPC_TESTS_SCOPED_TEMP_DIR_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace gw::rpc::testing {

class ScopedTempDir {
 public:
  explicit ScopedTempDir(std::string_view prefix = "gw-test") : maker_(::getpid()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string name = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + std::string(prefix) + "-XXXXXX";
    if (::mkdtemp(name.data()) != nullptr) path_ = name;
  }
  ~ScopedTempDir() {
    if (path_.empty() || ::getpid() != maker_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  // Empty when mkdtemp failed (ok() is false).
  const std::string& path() const { return path_; }
  std::string File(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
  pid_t maker_;
};

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_SCOPED_TEMP_DIR_H_
