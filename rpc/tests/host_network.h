// HostNetwork: several "hosts" on this machine, for tests of jobs that span hosts. Each
// host is a Linux network namespace with its own loopback, one interface (eth0) with an
// address on a private /24, and no other route; a bridge in one more namespace (the
// switch) joins them through veth pairs. Processes started in different hosts reach each
// other only over that network, as on different machines (and the shm transport, which
// compares network namespaces, refuses shared memory between them).
//
// Contract
//   - Unsupported() is empty when this process can build one (root, iproute2's `ip`),
//     else says why: a test GTEST_SKIPs with it (CI runs as root, so they run there).
//   - Create(n) first sweeps what killed runs left behind (namespaces and log folders are
//     named "gwhost-<pid>-<seq>...", and those whose process is gone are deleted), then
//     makes n hosts; host i has address "10.201.0.<i+1>". An error names the `ip` command
//     that failed and what it said; whatever was made by then is deleted.
//   - Start(host, argv, env) runs argv[0] (a path) in that host's namespace (fork, setns,
//     exec) with this process's environment plus `env`, stdout and stderr into a log file
//     (HostProcess::output()). Started processes die with this process (PDEATHSIG).
//   - WaitAll(processes, deadline) waits on exit events (pidfds), not by polling; when one
//     exits non-zero the others are killed, as a launcher would, and at the deadline all
//     are. Exit codes: the status, 128 + signal.
//   - The destructor kills processes still running and deletes the namespaces (veth pairs
//     and bridge go with them) and the logs, also when the test failed. A test killed
//     with SIGKILL leaves them until the next Create, which sweeps them.
//   - Not thread-safe: use it from the test's thread.
#ifndef GRADWIRE_RPC_TESTS_HOST_NETWORK_H_
#define GRADWIRE_RPC_TESTS_HOST_NETWORK_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gw::testing {

class HostProcess {
 public:
  HostProcess(pid_t pid, int pidfd, std::string log) : pid_(pid), pidfd_(pidfd), log_(std::move(log)) {}
  ~HostProcess();
  HostProcess(const HostProcess&) = delete;
  HostProcess& operator=(const HostProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool exited() const { return exit_code_ >= 0; }
  int exit_code() const { return exit_code_; }  // -1 while running
  // Everything it wrote to stdout and stderr so far.
  std::string output() const;
  // The value of the last line "key=value" of output() ("" if none).
  std::string Field(const std::string& key) const;
  // Waits (on the log file's changes, inotify) until output() has a line "key=..." and
  // returns its value; "" if the deadline passed or the process exited without one. The
  // process must flush its output after printing the line.
  std::string AwaitField(const std::string& key, absl::Time deadline);
  // The same for `text` anywhere in output(): whether it is there.
  bool AwaitText(const std::string& text, absl::Time deadline);
  // Kills it (SIGKILL) and reaps it, if it still runs.
  void Kill();

 private:
  friend class HostNetwork;
  // Reaps it if it exited; true once it has.
  bool Reap();
  // Waits (inotify on the log, and the process's exit) until done() holds.
  bool AwaitOutput(const std::function<bool()>& done, absl::Time deadline);

  const pid_t pid_;
  const int pidfd_;
  const std::string log_;
  int exit_code_ = -1;
};

class HostNetwork {
 public:
  static std::string Unsupported();
  static absl::StatusOr<std::unique_ptr<HostNetwork>> Create(int hosts);
  ~HostNetwork();
  HostNetwork(const HostNetwork&) = delete;
  HostNetwork& operator=(const HostNetwork&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& address(int host) const { return hosts_.at(static_cast<size_t>(host)).address; }
  const std::string& namespace_name(int host) const { return hosts_.at(static_cast<size_t>(host)).name; }
  // Every namespace it made (the hosts and the switch).
  std::vector<std::string> namespaces() const { return made_; }

  // Pulls (up = false) or plugs back in the host's cable: its port on the switch goes
  // down, so nothing passes either way and no connection is told (no FIN, no RST): the
  // host is cut off, as by a partition or a dead switch port. (Delay: this machine's
  // kernel has no netem qdisc, so tests add latency with the fault transport's delay.)
  absl::Status SetLink(int host, bool up);

  // REQUIRES: argv[0] is a path to an executable.
  absl::StatusOr<HostProcess*> Start(int host, const std::vector<std::string>& argv,
                                     const std::map<std::string, std::string>& env = {});
  static std::vector<int> WaitAll(const std::vector<HostProcess*>& processes, absl::Time deadline);

  // Deletes namespaces and log folders of runs whose process is gone (Create does this).
  static void SweepStale();

 private:
  struct Host {
    std::string name;
    std::string address;
  };
  explicit HostNetwork(std::string base) : base_(std::move(base)) {}
  absl::Status Build(int hosts);
  absl::Status Ip(const std::vector<std::string>& args);
  absl::Status AddNamespace(const std::string& name);

  const std::string base_;  // "gwhost-<pid>-<seq>"
  std::string log_dir_;
  std::vector<std::string> made_;  // namespaces, in creation order
  std::vector<Host> hosts_;
  std::vector<std::unique_ptr<HostProcess>> processes_;
};

}  // namespace gw::testing

#endif  // GRADWIRE_RPC_TESTS_HOST_NETWORK_H_
