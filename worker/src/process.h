// The process primitives of `gradwire launch` (worker/src/launcher.cc), internal: file
// descriptors and pipes, the signal self-pipe, the child subreaper, wait statuses, the job
// secret's memfd and the limit on open files.
//
// Contract
//   - ErrnoError(what, err): RESOURCE_EXHAUSTED for running out of descriptors, processes or
//     memory (EMFILE, ENFILE, EAGAIN, ENOMEM; the message says to start fewer workers or
//     raise the limits), INTERNAL otherwise; the message is "what: strerror(err)".
//   - Fd owns one descriptor (closed on destruction or Reset; movable, not copyable).
//     MakePipe makes a close-on-exec pipe; `flags` may add O_NONBLOCK to both ends.
//   - LaunchSlot marks the one Launch() running in this process (acquired() is false for a
//     second one): the signal plumbing is process-wide.
//   - SignalPipe::Install sets SIGINT/SIGTERM/SIGCHLD handlers that write the signal's
//     number to a non-blocking self-pipe (read_fd() for poll); Drain() returns the signals
//     received since the last call, in order. The destructor restores the previous handlers.
//     At most one installed at a time (hold a LaunchSlot).
//   - SubreaperScope makes this process a child subreaper (PR_SET_CHILD_SUBREAPER) while it
//     lives, so that orphans of a worker's process group become its children and can be
//     reaped; active() says whether it is one (already, or made by this scope).
//   - DescribeStatus / ExitCodeOf: a wait status in words ("exited with status 3", "was
//     killed by signal 9 (SIGKILL)") and as a shell would report it (128 + signal).
//     SignalName(9) is "SIGKILL". WaitBlocking(pid, &status) is waitpid retried on EINTR.
//   - JobSecret::Make: a fresh job secret in a sealed memfd (mode 0400, no writes, no
//     resizing), close-on-exec here, at descriptor 3 or above; path() is
//     /proc/self/fd/N, which a worker that inherited the descriptor reads as its secret file.
//   - NofileRestore puts back the limit on open files (RLIMIT_NOFILE) given to it, if any,
//     when it goes.
#ifndef GRADWIRE_WORKER_SRC_PROCESS_H_
#define GRADWIRE_WORKER_SRC_PROCESS_H_

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace gw::worker::internal {

absl::Status ErrnoError(const std::string& what, int err);
std::string SignalName(int sig);
std::string DescribeStatus(int wait_status);
int ExitCodeOf(int wait_status);
pid_t WaitBlocking(pid_t pid, int* status);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

absl::Status MakePipe(Fd* read_end, Fd* write_end, int flags = 0);

class LaunchSlot {
 public:
  LaunchSlot();
  ~LaunchSlot();
  LaunchSlot(const LaunchSlot&) = delete;
  LaunchSlot& operator=(const LaunchSlot&) = delete;
  bool acquired() const { return acquired_; }

 private:
  bool acquired_;
};

inline constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGCHLD};

class SignalPipe {
 public:
  SignalPipe() = default;
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  ~SignalPipe();

  absl::Status Install();
  int read_fd() const { return read_.get(); }
  std::vector<int> Drain();

 private:
  Fd read_, write_;
  bool installed_ = false;
  struct sigaction previous_[std::size(kHandledSignals)]{};
};

class SubreaperScope {
 public:
  SubreaperScope();
  ~SubreaperScope();
  SubreaperScope(const SubreaperScope&) = delete;
  SubreaperScope& operator=(const SubreaperScope&) = delete;
  bool active() const { return active_; }

 private:
  bool active_ = false;
  bool set_by_us_ = false;
};

class JobSecret {
 public:
  absl::Status Make();
  int fd() const { return fd_.get(); }
  std::string path() const;

 private:
  Fd fd_;
};

class NofileRestore {
 public:
  explicit NofileRestore(std::optional<rlimit> original) : original_(original) {}
  ~NofileRestore() {
    if (original_) ::setrlimit(RLIMIT_NOFILE, &*original_);
  }
  NofileRestore(const NofileRestore&) = delete;
  NofileRestore& operator=(const NofileRestore&) = delete;

 private:
  std::optional<rlimit> original_;
};

}  // namespace gw::worker::internal

#endif  // GRADWIRE_WORKER_SRC_PROCESS_H_
