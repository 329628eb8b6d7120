// A program for the launcher's tests (launcher_test.cc), a gradwire user's program in
// miniature; argv[1] says what it does:
//   print_then_wait  prints a line with printf and one with std::cout, flushing neither,
//                    then waits for a signal: under `gradwire launch` both lines must
//                    reach the launcher before it exits (GRADWIRE_LINE_BUFFERED).
//   read_secret      reads the job secret as every worker does (rpc Security::FromEnv),
//                    then says whether it still holds the descriptor and whether a
//                    program it starts inherits it.
//   serve_metrics DIR joins the job's group (an agent from the environment, which
//                    serves metrics when the launcher asks), worker1 calls worker0's
//                    "ping" 3 times; each worker opens the FIFO DIR/go, writes a byte to
//                    the FIFO DIR/ready and reads DIR/go until end-of-file (the test
//                    closes it once it has scraped the running job), then shuts down.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/security.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "print_then_wait") {
    // What a worker does first (and what links the agent into the program).
    absl::StatusOr<gw::rpc::AgentOptions> options = gw::rpc::AgentOptions::FromEnv();
    const char* name = std::getenv("GRADWIRE_WORKER_NAME");
    std::printf("printf line of %s (options %s)\n", name != nullptr ? name : "?", options.ok() ? "ok" : "not ok");
    std::cout << "cout line\n";
    for (;;) ::pause();  // until the launcher's signal ends it
  }
  if (mode == "read_secret") {
    const std::string file = std::getenv("GRADWIRE_SECRET_FILE") != nullptr ? std::getenv("GRADWIRE_SECRET_FILE") : "";
    absl::StatusOr<gw::rpc::Security> security = gw::rpc::Security::FromEnv();
    if (!security.ok()) {
      std::printf("secret refused: %s\n", std::string(security.status().message()).c_str());
      return 0;
    }
    int fd = -1;
    const bool inherited = file.rfind("/proc/self/fd/", 0) == 0 && absl::SimpleAtoi(file.substr(14), &fd);
    const int child = std::system(absl::StrCat("test -e /proc/$$/fd/", fd).c_str());
    std::printf("secret of %zu bytes; descriptor %s here, %s by a child\n", security->secret.size(),
                inherited && ::fcntl(fd, F_GETFD) >= 0 ? "open" : "closed",
                inherited && WIFEXITED(child) && WEXITSTATUS(child) == 0 ? "inherited" : "not inherited");
    return 0;
  }
  if (mode == "serve_metrics" && argc > 2) {
    const std::string dir = argv[2];
    absl::StatusOr<gw::rpc::AgentOptions> options = gw::rpc::AgentOptions::FromEnv();
    if (!options.ok()) return 3;
    auto agent = gw::rpc::Agent::Start(
        *options, [](gw::rpc::Agent& a) { return a.Register("ping", []() -> int64_t { return 1; }); });
    if (!agent.ok()) {
      std::fprintf(stderr, "%s\n", std::string(agent.status().message()).c_str());
      return 4;
    }
    if (options->rank == 1) {
      for (int i = 0; i < 3; ++i) {
        if (!(*agent)->Sync<int64_t>("worker0", "ping").ok()) return 5;
      }
    }
    const int go = ::open(absl::StrCat(dir, "/go").c_str(), O_RDONLY);  // before "ready": the test closes it after
    const int ready = ::open(absl::StrCat(dir, "/ready").c_str(), O_WRONLY);
    if (go < 0 || ready < 0 || ::write(ready, "r", 1) != 1) return 7;
    ::close(ready);
    char c;
    while (::read(go, &c, 1) > 0) {
    }
    ::close(go);
    return (*agent)->Shutdown().ok() ? 0 : 6;
  }
  std::fprintf(stderr, "usage: %s print_then_wait|read_secret|serve_metrics DIR\n", argv[0]);
  return 2;
}
