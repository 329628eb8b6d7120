// Helpers of the tests that run real servers (etcd, Prometheus) and talk HTTP to them.
//
// Contract
//   - ChildProcess::Start(args, log) runs args[0] (a path) with args, stdin from /dev/null,
//     stdout and stderr appended to `log`; it dies with the thread that started it
//     (PR_SET_PDEATHSIG), so no test leaves one behind. Kill() sends SIGKILL and reaps it
//     (idempotent); the destructor kills. Exited() reaps it if it has exited.
//   - FileTail(path) is the last 2000 bytes of a file (a server's log, for errors).
//   - AwaitStopped(pid, within): whether every thread of process `pid` is stopped (by
//     SIGSTOP, which kill() only sends: a thread running on another core may still answer
//     a message before it stops), polled until `within` has passed.
//   - HttpGet(port, target, headers, method) sends one HTTP/1.0 request to 127.0.0.1:port
//     and reads the response until the server closes (5 s without data fails it):
//     UNAVAILABLE when nothing answers.
//   - UrlEncode(text): percent-encoding of a query parameter.
#ifndef GRADWIRE_RPC_TESTS_CHILD_PROCESS_H_
#define GRADWIRE_RPC_TESTS_CHILD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gw::rpc::testing {

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Kill(); }

  absl::Status Start(const std::vector<std::string>& args, const std::string& log);
  void Kill();
  bool Exited();
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

std::string FileTail(const std::string& path);
bool AwaitStopped(pid_t pid, absl::Duration within);

struct HttpResponse {
  int status = 0;
  std::string head;  // the status line and the headers
  std::string body;
};
absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& target, const std::vector<std::string>& headers = {},
                                     const std::string& method = "GET");

std::string UrlEncode(const std::string& text);

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_CHILD_PROCESS_H_
