#include "process.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gradwire/rpc/security.h"

namespace gw::worker::internal {
namespace {

// Signal plumbing is process-wide by nature: the handler writes the signal number to the
// self-pipe of the Launch() that is running (at most one, see g_launch_running).
std::atomic<int> g_signal_pipe{-1};
std::atomic<bool> g_launch_running{false};

void OnSignal(int sig) {
  const int saved_errno = errno;
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);  // full pipe: already woken
  }
  errno = saved_errno;
}

}  // namespace

absl::Status ErrnoError(const std::string& what, int err) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case EMFILE:
    case ENFILE:
    case EAGAIN:
    case ENOMEM:
      return absl::ResourceExhaustedError(
          absl::StrCat(message, "; start fewer workers or raise the limits (ulimit -n / -u)"));
    default:
      return absl::InternalError(message);
  }
}

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

std::string DescribeStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("was killed by signal ", sig, " (", SignalName(sig), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

pid_t WaitBlocking(pid_t pid, int* status) {
  pid_t r;
  do {
    r = ::waitpid(pid, status, 0);
  } while (r < 0 && errno == EINTR);
  return r;
}

// A close-on-exec pipe; `flags` may add O_NONBLOCK (to both ends).
absl::Status MakePipe(Fd* read_end, Fd* write_end, int flags) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | flags) != 0) return ErrnoError("cannot create a pipe", errno);
  *read_end = Fd(fds[0]);
  *write_end = Fd(fds[1]);
  return absl::OkStatus();
}

LaunchSlot::LaunchSlot() : acquired_(!g_launch_running.exchange(true)) {}
LaunchSlot::~LaunchSlot() {
  if (acquired_) g_launch_running.store(false);
}

// Installs the SIGINT/SIGTERM/SIGCHLD handlers feeding a self-pipe; restores the previous
// handlers on destruction.
SignalPipe::~SignalPipe() {
  if (installed_) {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      ::sigaction(kHandledSignals[i], &previous_[i], nullptr);
    }
    g_signal_pipe.store(-1);
  }
}

absl::Status SignalPipe::Install() {
  if (absl::Status s = MakePipe(&read_, &write_, O_NONBLOCK); !s.ok()) return s;
  g_signal_pipe.store(write_.get());
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
    action.sa_flags = SA_RESTART | (kHandledSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(kHandledSignals[i], &action, &previous_[i]);
  }
  installed_ = true;
  return absl::OkStatus();
}

std::vector<int> SignalPipe::Drain() {
  std::vector<int> signals;
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(read_.get(), buf, sizeof buf)) > 0) {
    signals.insert(signals.end(), buf, buf + n);
  }
  return signals;
}

SubreaperScope::SubreaperScope() {
  int previous = 0;
  if (::prctl(PR_GET_CHILD_SUBREAPER, &previous) == 0 && previous != 0) {
    active_ = true;
  } else if (::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0) {
    active_ = set_by_us_ = true;
  }
}

SubreaperScope::~SubreaperScope() {
  if (set_by_us_) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// A fresh job secret that never touches a file system: a sealed memfd (only this user may
// read it, nobody may change it), close-on-exec here and kept open across the exec of
// every worker (RunChild), restarts included, which reads it as
// GRADWIRE_SECRET_FILE=/proc/self/fd/N like any secret file. The worker then marks it
// close-on-exec (rpc/src/security/security.cc): the programs a worker starts do not get the
// secret, and a wrapper that closed it on the way (Python's subprocess without pass_fds)
// is named in the worker's error. It goes away with the last process holding it, however
// the launcher ends (even by SIGKILL): nothing is left behind.
absl::Status JobSecret::Make() {
  Fd fd(::memfd_create("gradwire-job-secret", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoError("cannot make a memfd for the job secret", errno);
  // Above stdin, stdout and stderr, which RunChild overwrites in the child.
  fd_ = Fd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3));
  if (!fd_.valid()) return ErrnoError("cannot move the job secret's memfd", errno);
  const std::string secret = rpc::MakeJobSecret();
  if (::write(fd_.get(), secret.data(), secret.size()) != static_cast<ssize_t>(secret.size())) {
    return ErrnoError("cannot write the job secret to its memfd", errno);
  }
  if (::fchmod(fd_.get(), 0400) != 0 ||
      ::fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return ErrnoError("cannot seal the job secret's memfd", errno);
  }
  return absl::OkStatus();
}

std::string JobSecret::path() const { return absl::StrCat("/proc/self/fd/", fd_.get()); }

}  // namespace gw::worker::internal
