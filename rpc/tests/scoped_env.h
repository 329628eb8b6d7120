// ScopedEnv: sets (or, with a null value, unsets) an environment variable for a test's
// scope and restores what it was when the scope ends, also when an assertion returns
// early. Changing the variable again inside the scope is fine: the destructor restores
// the value from before the scope.
#ifndef GRADWIRE_RPC_TESTS_SCOPED_ENV_H_
#define GRADWIRE_RPC_TESTS_SCOPED_ENV_H_

#include <cstdlib>
#include <optional>
#include <string>

namespace gw::rpc::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value != nullptr ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_.c_str(), old_->c_str(), 1) : ::unsetenv(name_.c_str()); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const std::string name_;
  std::optional<std::string> old_;
};

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_SCOPED_ENV_H_
