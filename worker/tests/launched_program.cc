// A program for the launcher's tests (launcher_test.cc), a gradwire user's program in
// miniature; argv[1] says what it does:
//   print_then_wait  prints a line with printf and one with std::cout, flushing neither,
//                    then waits for a signal: under `gradwire launch` both lines must
//                    reach the launcher before it exits (GRADWIRE_LINE_BUFFERED).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "gradwire/rpc/agent.h"

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
  std::fprintf(stderr, "usage: %s print_then_wait\n", argv[0]);
  return 2;
}
