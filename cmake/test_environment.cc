// Linked into every test binary (gradwire_add_tests): the job secret the tests' agents
// share (rpc security.h), set before main() unless the environment already has one, so
// that agents in threads and in child processes (which inherit it) authenticate each
// other as a launched job's workers do. Tests of the secret itself set their own.
#include <cstdlib>

namespace {

const bool kSecretSet = [] {
  ::setenv("GRADWIRE_SECRET", "gradwire-tests-job-secret", /*overwrite=*/0);
  return true;
}();

}  // namespace
