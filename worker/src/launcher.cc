#include "gradwire/worker/launcher.h"

#include "process.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/security.h"

extern char** environ;

namespace gw::worker {
namespace {

using internal::DescribeStatus;
using internal::ErrnoError;
using internal::ExitCodeOf;
using internal::Fd;
using internal::JobSecret;
using internal::LaunchSlot;
using internal::MakePipe;
using internal::NofileRestore;
using internal::SignalName;
using internal::SignalPipe;
using internal::SubreaperScope;
using internal::WaitBlocking;

// LaunchOptions::rdzv's scheme (the workers parse the whole address: rpc/store.h).
constexpr char kEtcdScheme[] = "etcd://";
// Lines longer than this are written in pieces, so a worker that never prints '\n'
// cannot grow the launcher's buffer without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;
constexpr size_t kReadChunk = 64 * 1024;
// poll() never sleeps longer than this, as a safety net for a lost SIGCHLD wake-up.
constexpr absl::Duration kMaxPollWait = absl::Milliseconds(200);
// Once every worker has exited, how much longer than kill_grace to wait for processes
// that escaped their process group but still hold a worker's stdout/stderr open.
constexpr absl::Duration kDrainSlack = absl::Seconds(1);
// At most this many workers per launcher unless GRADWIRE_LAUNCH_MAX_WORKERS allows more:
// a larger -n is almost always a typo, and each worker is a process and two pipes here.
constexpr int kDefaultMaxLocalWorkers = 1024;
constexpr char kMaxLocalWorkersVar[] = "GRADWIRE_LAUNCH_MAX_WORKERS";
// File descriptors the launcher needs besides two per worker (its own, the signal pipe,
// /dev/null, a worker's pipes while it starts, the secret).
constexpr rlim_t kBaseDescriptors = 32;

struct Stream {
  Fd fd;
  std::FILE* dest = nullptr;
  std::string partial;  // bytes after the last '\n'
};

struct Worker {
  std::string name;
  std::string prefix;  // "[worker1] "
  int rank = 0;
  std::vector<std::string> env;  // as started, less GRADWIRE_RESTART_COUNT
  int restarts = 0;              // earlier incarnations of this rank
  pid_t pid = -1;                // also its process group id
  bool reaped = false;           // the main process
  int wait_status = 0;
  // Once the main process is reaped: no child of the launcher is left in the group. With
  // the launcher a child subreaper, orphans of the group are its children, so this means
  // the group is gone.
  bool group_empty = false;
  Stream streams[2];  // stdout, stderr
  std::optional<absl::Time> leftover_kill_at;

  bool HasOpenStreams() const { return streams[0].fd.valid() || streams[1].fd.valid(); }
  // Whether its process group may still have members worth signalling (and so still
  // owns its id): an unreaped child of the launcher in it, or something holding its pipes.
  bool MayHaveProcesses() const { return pid > 0 && (!reaped || !group_empty || HasOpenStreams()); }
  void SignalGroup(int sig) const {
    if (!MayHaveProcesses()) return;
    if (::kill(-pid, sig) != 0 && !reaped) ::kill(pid, sig);
  }
};

// The most workers Launch() starts: kDefaultMaxLocalWorkers, or GRADWIRE_LAUNCH_MAX_WORKERS.
absl::StatusOr<int> MaxLocalWorkers() {
  const char* v = std::getenv(kMaxLocalWorkersVar);
  if (v == nullptr || *v == '\0') return kDefaultMaxLocalWorkers;
  int most = 0;
  if (!absl::SimpleAtoi(v, &most) || most < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", kMaxLocalWorkersVar, "=", v, " (the most workers one launcher may start, e.g. 4096)"));
  }
  return most;
}

// The processes and file descriptors `num_workers` workers need, checked against this
// user's limits before any is started (rather than failing, or thrashing, half-way). The
// soft limit on file descriptors is raised towards the hard one when that is enough; the
// workers get the limits the launcher was started with (RunChild).
absl::Status CheckResourceLimits(int num_workers, rlimit* original_nofile) {
  rlimit nproc{};
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY &&
      static_cast<rlim_t>(num_workers) >= nproc.rlim_cur) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", num_workers, " workers: this user may run at most ", nproc.rlim_cur,
                     " processes (ulimit -u; hard limit ",
                     nproc.rlim_max == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(nproc.rlim_max),
                     "), and some already run; raise it with `ulimit -u N` or start fewer workers"));
  }
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) return absl::OkStatus();
  *original_nofile = nofile;
  const rlim_t needed = 2 * static_cast<rlim_t>(num_workers) + kBaseDescriptors;
  if (nofile.rlim_cur == RLIM_INFINITY || needed <= nofile.rlim_cur) return absl::OkStatus();
  if (nofile.rlim_max != RLIM_INFINITY && needed > nofile.rlim_max) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot start ", num_workers, " workers: the launcher needs about ", needed,
        " file descriptors (two per worker) and may open at most ", nofile.rlim_max,
        " (ulimit -Hn); raise the hard limit (as root, or in /etc/security/limits.conf) or start fewer workers"));
  }
  rlimit raised = nofile;
  raised.rlim_cur = needed;
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    return ErrnoError(
        absl::StrCat("cannot raise the limit on open files to ", needed, " for ", num_workers, " workers"), errno);
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const LaunchOptions& options, std::FILE* out, std::FILE* err) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers must be at least 1, got ", options.num_workers));
  }
  if (absl::StatusOr<int> most = MaxLocalWorkers(); !most.ok()) {
    return most.status();
  } else if (options.num_workers > *most) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_workers (-n) ", options.num_workers, " is more than the ", *most,
        " workers one launcher starts on a machine; if you mean it, set ", kMaxLocalWorkersVar, "=",
        options.num_workers, " (and check that the machine has the processes, memory and file descriptors)"));
  }
  if (static_cast<int64_t>(options.nnodes) * options.num_workers > rpc::GlobalId::kMaxRanks ||
      options.max_workers > rpc::GlobalId::kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a job has at most ", rpc::GlobalId::kMaxRanks, " ranks; got nnodes ", options.nnodes, " x num_workers ",
        options.num_workers, options.max_workers > 0 ? absl::StrCat(", max_workers ", options.max_workers) : ""));
  }
  if (options.command.empty() || options.command[0].empty()) {
    return absl::InvalidArgumentError("command is empty; give the program to run and its arguments");
  }
  if (options.metrics_port != 0) {
    const int ranks = std::max(options.max_workers, options.nnodes * options.num_workers);
    if (options.metrics_port < 1 || options.metrics_port + ranks - 1 > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("metrics_port (--metrics-port) ", options.metrics_port,
                                                     ": worker k serves its metrics on port ", options.metrics_port,
                                                     " + k, so the ports up to ", options.metrics_port + ranks - 1,
                                                     " must exist; give a port in 1-", 65536 - ranks));
    }
  }
  if (options.nnodes < 1 || options.node_rank < 0 || options.node_rank >= options.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat("node_rank must be in [0, nnodes) with nnodes >= 1, got node_rank ",
                                                   options.node_rank, " of nnodes ", options.nnodes));
  }
  if (!options.rdzv.empty()) {
    const size_t slash = options.rdzv.find('/', sizeof(kEtcdScheme) - 1);
    if (!options.rdzv.starts_with(kEtcdScheme) || slash == std::string::npos || slash + 1 == options.rdzv.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rdzv (--rdzv) must be etcd://HOST:PORT/JOB: an etcd's client address and a name for the job, "
                       "alike on every node; got '",
                       options.rdzv, "'"));
    }
  } else if (options.nnodes > 1 && options.master_port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job over ", options.nnodes,
                     " nodes needs master_port: every node's launcher must be given the same port "
                     "(a free port picked here means nothing on the other machines), e.g. --master-port 29500, "
                     "or meet through etcd (rdzv)"));
  }
  if (options.master_addr.empty()) {
    return absl::InvalidArgumentError("master_addr is empty; use e.g. 127.0.0.1");
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("master_port must be in [0, 65535] (0 picks a free port), got ", options.master_port));
  }
  if (options.max_restarts < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_restarts must not be negative, got ", options.max_restarts));
  }
  if (options.kill_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kill_grace must not be negative, got ", absl::FormatDuration(options.kill_grace)));
  }
  if (out == nullptr || err == nullptr) {
    return absl::InvalidArgumentError("out and err must be open streams, got a null FILE*");
  }
  for (const auto& [name, value] : options.extra_env) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("extra_env has an invalid variable name '", name, "' (empty or containing '=')"));
    }
    for (const char* reserved : kLaunchEnvVars) {
      if (name == reserved) {
        return absl::InvalidArgumentError(
            absl::StrCat("extra_env sets ", name, ", which Launch() sets for every worker; remove it"));
      }
    }
  }
  return absl::OkStatus();
}

// The environment shared by every worker: the launcher's, minus what is overridden.
int OmpThreadsPerWorker(int num_workers) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, num_workers));
}

std::vector<std::string> CommonEnvironment(const LaunchOptions& options, int port) {
  auto overridden = [&](const std::string& name) {
    if (options.extra_env.count(name) != 0) return true;
    for (const char* reserved : kLaunchEnvVars) {
      if (name == reserved) return true;
    }
    return false;
  };
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string var(*entry);
    if (!overridden(var.substr(0, var.find('=')))) env.push_back(var);
  }
  for (const auto& [name, value] : options.extra_env) env.push_back(absl::StrCat(name, "=", value));
  // As torchrun does: workers sharing this machine's cores get an equal share of OpenMP
  // threads (oneDNN's), unless the user chose; otherwise each worker's threads spin for
  // cores the others need.
  if (std::getenv("OMP_NUM_THREADS") == nullptr && options.extra_env.count("OMP_NUM_THREADS") == 0) {
    env.push_back(absl::StrCat("OMP_NUM_THREADS=", OmpThreadsPerWorker(options.num_workers)));
  }
  env.push_back(absl::StrCat("WORLD_SIZE=", options.nnodes * options.num_workers));
  if (options.max_workers > 0) env.push_back(absl::StrCat("GRADWIRE_MAX_WORLD_SIZE=", options.max_workers));
  if (options.join) env.push_back("GRADWIRE_JOIN=1");
  if (options.metrics_port != 0) env.push_back(absl::StrCat("GRADWIRE_METRICS_PORT_BASE=", options.metrics_port));
  env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", options.num_workers));
  env.push_back(absl::StrCat("GROUP_RANK=", options.node_rank));
  if (!options.rdzv.empty()) {
    env.push_back(absl::StrCat("GRADWIRE_RDZV=", options.rdzv));
  } else {
    env.push_back(absl::StrCat("MASTER_ADDR=", options.master_addr));
    env.push_back(absl::StrCat("MASTER_PORT=", port));
  }
  return env;
}

absl::Status ExecError(const std::string& worker, const std::string& program, int err) {
  const bool has_slash = program.find('/') != std::string::npos;
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(absl::StrCat("cannot start ", worker, ": program '", program, "' not found",
                                              has_slash ? "" : " in PATH",
                                              "; check the spelling or give its full path"));
    case EACCES:
      return absl::PermissionDeniedError(
          absl::StrCat("cannot start ", worker, ": program '", program,
                       "' is not executable (permission denied); check its mode (chmod +x) and path"));
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("cannot start ", worker, ": executing '", program, "' failed: ", std::strerror(err)));
  }
}

// What every worker inherits from the launcher besides its environment.
struct Inherited {
  int secret_fd = -1;            // the job secret's memfd (close-on-exec here), kept open in workers
  std::optional<rlimit> nofile;  // the limit on open files to give back (CheckResourceLimits raised it)
};

// Child side of StartWorker, between fork and exec: async-signal-safe calls only.
[[noreturn]] void RunChild(pid_t parent, int stdin_fd, int stdout_fd, int stderr_fd, int exec_error_fd,
                           const Inherited& inherited, char* const* argv, char* const* envp) {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::sigaction(sig, &default_action, nullptr);
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
  // Move the three sources above 2 first so no dup2 clobbers another source.
  const int sources[3] = {::fcntl(stdin_fd, F_DUPFD_CLOEXEC, 3), ::fcntl(stdout_fd, F_DUPFD_CLOEXEC, 3),
                          ::fcntl(stderr_fd, F_DUPFD_CLOEXEC, 3)};
  for (int target = 0; target < 3; ++target) {
    if (sources[target] < 0 || ::dup2(sources[target], target) < 0) {
      const int e = errno;
      [[maybe_unused]] const ssize_t n = ::write(exec_error_fd, &e, sizeof e);
      ::_exit(127);
    }
  }
  // The secret's descriptor (above 2: JobSecret) stays open across exec, so the worker
  // reads it as GRADWIRE_SECRET_FILE=/proc/self/fd/N.
  if (inherited.secret_fd >= 0) ::fcntl(inherited.secret_fd, F_SETFD, 0);
  if (inherited.nofile) ::setrlimit(RLIMIT_NOFILE, &*inherited.nofile);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvpe(argv[0], argv, envp);
  const int e = errno;
  [[maybe_unused]] const ssize_t n = ::write(exec_error_fd, &e, sizeof e);
  ::_exit(127);
}

// Forks and execs one worker; on success fills worker->pid and its streams.
absl::Status StartWorker(const std::vector<std::string>& command, std::vector<std::string> env, int devnull,
                         const Inherited& inherited, std::FILE* out, std::FILE* err, Worker* worker) {
  Fd out_r, out_w, err_r, err_w, exec_r, exec_w;
  if (absl::Status s = MakePipe(&out_r, &out_w); !s.ok()) return s;
  if (absl::Status s = MakePipe(&err_r, &err_w); !s.ok()) return s;
  if (absl::Status s = MakePipe(&exec_r, &exec_w); !s.ok()) return s;

  std::vector<char*> argv;
  for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& var : env) envp.push_back(var.data());
  envp.push_back(nullptr);

  // Block signals across fork so the child never runs the launcher's handlers (which
  // would write into the launcher's self-pipe); the child resets them before unblocking.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    RunChild(parent, devnull, out_w.get(), err_w.get(), exec_w.get(), inherited, argv.data(), envp.data());
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) return ErrnoError(absl::StrCat("cannot start ", worker->name, ": fork"), fork_errno);

  ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
  out_w.Reset();
  err_w.Reset();
  exec_w.Reset();
  int exec_errno = 0;
  size_t got = 0;
  while (got < sizeof exec_errno) {
    const ssize_t n = ::read(exec_r.get(), reinterpret_cast<char*>(&exec_errno) + got, sizeof exec_errno - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got == sizeof exec_errno) {  // exec failed; the child has exited (or is about to)
    int status;
    WaitBlocking(pid, &status);
    return ExecError(worker->name, command[0], exec_errno);
  }

  worker->pid = pid;
  for (Fd* fd : {&out_r, &err_r}) ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  worker->streams[0].fd = std::move(out_r);
  worker->streams[0].dest = out;
  worker->streams[1].fd = std::move(err_r);
  worker->streams[1].dest = err;
  return absl::OkStatus();
}

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, Inherited inherited, std::FILE* out, std::FILE* err)
      : options_(options), inherited_(std::move(inherited)), out_(out), err_(err) {}

  absl::StatusOr<LaunchResult> Run(int port) {
    Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!devnull.valid()) return ErrnoError("cannot open /dev/null for the workers' stdin", errno);
    if (absl::Status s = signals_.Install(); !s.ok()) return s;

    const std::vector<std::string> common = CommonEnvironment(options_, port);
    for (int local = 0; local < options_.num_workers; ++local) {
      Worker& w = workers_.emplace_back();  // only workers that were started are in workers_
      w.rank = options_.node_rank * options_.num_workers + local;
      w.name = options_.join ? absl::StrCat("joiner", local) : absl::StrCat(options_.name_prefix, w.rank);
      w.prefix = absl::StrCat("[", w.name, "] ");
      w.env = common;
      w.env.push_back(absl::StrCat("LOCAL_RANK=", local));
      if (!options_.join) {  // a worker that joins gets its rank and name from the group
        w.env.push_back(absl::StrCat("RANK=", w.rank));
        w.env.push_back(absl::StrCat("GRADWIRE_WORKER_NAME=", w.name));
      }
      if (absl::Status s = Start(w, devnull.get()); !s.ok()) {
        KillStarted();
        return s;
      }
      // A SIGINT/SIGTERM while starting many workers stops the starting: the workers
      // started so far get the signal (then SIGKILL after kill_grace), as in Supervise.
      if (StopSignalled()) break;
    }
    Supervise(devnull.get());
    return Result();
  }

 private:
  absl::Status Start(Worker& w, int devnull) {
    std::vector<std::string> env = w.env;
    env.push_back(absl::StrCat("GRADWIRE_RESTART_COUNT=", w.restarts));
    return StartWorker(options_.command, std::move(env), devnull, inherited_, out_, err_, &w);
  }

  // Takes the signals received so far (SIGCHLD needs nothing here: Supervise reaps);
  // whether the launch is to stop.
  bool StopSignalled() {
    for (int sig : signals_.Drain()) {
      if (sig == SIGINT || sig == SIGTERM) OnLauncherSignal(sig);
    }
    return launcher_signals_ > 0;
  }

  // Whether a worker that just failed is started again (max_restarts) instead of
  // stopping the job.
  bool Restartable(const Worker& w) const {
    return w.restarts < options_.max_restarts && (w.rank != 0 || !options_.rdzv.empty()) && !failure_ &&
           launcher_signals_ == 0;
  }

  // The workers OnExit chose to restart: a new incarnation of each, under the same rank.
  void RestartPending(int devnull) {
    std::vector<size_t> pending;
    pending.swap(restart_pending_);
    for (size_t index : pending) {
      if (failure_ || launcher_signals_ > 0) return;  // the job is stopping after all
      const Worker& old = workers_[index];
      Worker& w = workers_.emplace_back();
      w.name = old.name;
      w.prefix = old.prefix;
      w.rank = old.rank;
      w.env = old.env;
      w.restarts = old.restarts + 1;
      std::fprintf(err_, "gradwire launch: restarting %s (restart %d of %d)\n", w.name.c_str(), w.restarts,
                   options_.max_restarts);
      if (absl::Status s = Start(w, devnull); !s.ok()) {
        w.reaped = w.group_empty = true;  // never ran
        Fail(w, LaunchResult{.exit_code = 1,
                             .failed_worker = w.name,
                             .reason = absl::StrCat("could not be restarted: ", s.message())});
      }
    }
  }
  // Startup failed: SIGKILL and reap whatever was started; their output is dropped.
  void KillStarted() {
    for (Worker& w : workers_) {
      if (w.pid <= 0 || w.reaped) continue;
      w.SignalGroup(SIGKILL);
      WaitBlocking(w.pid, &w.wait_status);
      w.reaped = true;
      int status;
      while (WaitBlocking(-w.pid, &status) > 0) {
      }  // orphans of the group (children of this subreaper)
      w.group_empty = true;
    }
  }

  void Supervise(int devnull) {
    std::vector<pollfd> fds;
    std::vector<Stream*> polled;
    for (;;) {
      const absl::Time now = absl::Now();
      RunTimers(now);
      const bool all_reaped = std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.reaped; });
      const bool any_busy = std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
        return w.HasOpenStreams() || (subreaper_.active() && !w.group_empty);
      });
      if (all_reaped && !any_busy) break;
      if (all_reaped && !drain_deadline_) drain_deadline_ = now + options_.kill_grace + kDrainSlack;
      if (drain_deadline_ && now >= *drain_deadline_) {
        // Something outside the workers' process groups holds their output open, or a
        // process of a group will not die even of SIGKILL: stop waiting for it.
        for (Worker& w : workers_) {
          for (Stream& s : w.streams) CloseStream(w, s);
        }
        break;
      }

      fds.clear();
      polled.clear();
      fds.push_back({signals_.read_fd(), POLLIN, 0});
      polled.push_back(nullptr);
      for (Worker& w : workers_) {
        for (Stream& s : w.streams) {
          if (!s.fd.valid()) continue;
          fds.push_back({s.fd.get(), POLLIN, 0});
          polled.push_back(&s);
        }
      }
      const int rc = ::poll(fds.data(), fds.size(), PollTimeoutMs(now));
      if (rc > 0) {
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents == 0) continue;
          ReadStream(OwnerOf(polled[i]), *polled[i]);
        }
      }
      for (int sig : signals_.Drain()) {
        if (sig == SIGINT || sig == SIGTERM) OnLauncherSignal(sig);
      }
      ReapExited();
      RestartPending(devnull);
      std::fflush(out_);
      std::fflush(err_);
    }
    std::fflush(out_);
    std::fflush(err_);
  }

  Worker& OwnerOf(const Stream* s) {
    for (Worker& w : workers_) {
      if (s == &w.streams[0] || s == &w.streams[1]) return w;
    }
    return workers_.front();  // unreachable
  }

  int PollTimeoutMs(absl::Time now) const {
    absl::Time wake = now + kMaxPollWait;
    if (kill_at_) wake = std::min(wake, *kill_at_);
    if (drain_deadline_) wake = std::min(wake, *drain_deadline_);
    for (const Worker& w : workers_) {
      if (w.leftover_kill_at) wake = std::min(wake, *w.leftover_kill_at);
    }
    const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(wake - now, absl::Milliseconds(1)));
    return static_cast<int>(std::max<int64_t>(ms, 0));
  }

  void RunTimers(absl::Time now) {
    if (kill_at_ && now >= *kill_at_) {
      for (const Worker& w : workers_) w.SignalGroup(SIGKILL);
      kill_at_.reset();
    }
    for (Worker& w : workers_) {
      if (w.leftover_kill_at && now >= *w.leftover_kill_at) {
        w.SignalGroup(SIGKILL);
        w.leftover_kill_at.reset();
      }
    }
  }

  void ReadStream(Worker& w, Stream& s) {
    char buf[kReadChunk];
    const ssize_t n = ::read(s.fd.get(), buf, sizeof buf);
    if (n > 0) {
      s.partial.append(buf, static_cast<size_t>(n));
      EmitLines(w, s, /*at_eof=*/false);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      CloseStream(w, s);
    }
  }

  void CloseStream(Worker& w, Stream& s) {
    if (!s.fd.valid()) return;
    EmitLines(w, s, /*at_eof=*/true);
    s.fd.Reset();
  }

  void EmitLines(const Worker& w, Stream& s, bool at_eof) {
    std::string text;
    auto emit = [&](size_t start, size_t length) {
      absl::StrAppend(&text, w.prefix);
      text.append(s.partial, start, length);
      text.push_back('\n');
    };
    size_t start = 0;
    for (;;) {
      const size_t newline = s.partial.find('\n', start);
      const size_t remaining = s.partial.size() - start;
      if (newline != std::string::npos && newline - start <= kMaxLineBytes) {
        emit(start, newline - start);
        start = newline + 1;
      } else if (remaining >= kMaxLineBytes) {
        emit(start, kMaxLineBytes);
        start += kMaxLineBytes;
      } else {
        if (at_eof && remaining > 0) {
          emit(start, remaining);
          start += remaining;
        }
        break;
      }
    }
    s.partial.erase(0, start);
    if (!text.empty()) std::fwrite(text.data(), 1, text.size(), s.dest);
  }

  void ReapExited() {
    for (Worker& w : workers_) {
      if (!w.reaped) ReapMain(w);
      ReapGroup(w);
    }
  }

  void ReapMain(Worker& w) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == ECHILD) {  // someone else in this process reaped it
        w.reaped = true;
        w.wait_status = -1;
        OnExit(w, /*known=*/false);
      }
      return;
    }
    if (info.si_pid != w.pid) return;  // still running
    // The exited main process is still a zombie, so its process group id cannot have
    // been reused: whatever it left running in the group gets SIGTERM now.
    ::kill(-w.pid, SIGTERM);
    WaitBlocking(w.pid, &w.wait_status);
    w.reaped = true;
    OnExit(w, /*known=*/true);
  }

  // Reaps the group's orphans that became the launcher's children (as a subreaper).
  void ReapGroup(Worker& w) {
    if (w.group_empty) return;
    for (;;) {
      siginfo_t info{};
      if (::waitid(P_PGID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
        if (errno == EINTR) continue;
        if (w.reaped) w.group_empty = true;  // ECHILD: no child of ours left in the group
        return;
      }
      if (info.si_pid == 0) return;  // children left, none exited
      if (info.si_pid == w.pid) {    // the main process, exited since ReapMain looked
        if (w.reaped) return;
        ReapMain(w);
        continue;
      }
      int status;
      WaitBlocking(info.si_pid, &status);
    }
  }

  void OnExit(Worker& w, bool known) {
    const absl::Time now = absl::Now();
    w.leftover_kill_at = now + options_.kill_grace;  // for what it left in its group
    const bool ok = known && WIFEXITED(w.wait_status) && WEXITSTATUS(w.wait_status) == 0;
    if (ok || failure_ || launcher_signals_ > 0) return;  // later exits are consequences
    const std::string reason = known ? DescribeStatus(w.wait_status)
                                     : "was reaped by someone else in the launcher process; exit status unknown";
    if (Restartable(w)) {
      std::fprintf(err_, "gradwire launch: %s %s\n", w.name.c_str(), reason.c_str());
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (&workers_[i] == &w) restart_pending_.push_back(i);
      }
      return;
    }
    Fail(w, LaunchResult{
                .exit_code = known ? ExitCodeOf(w.wait_status) : 1,
                .failed_worker = w.name,
                .reason = w.restarts > 0 ? absl::StrCat(reason, " (after ", w.restarts, " restart(s))") : reason});
  }

  // The job fails with `result`: every other worker gets SIGTERM, then SIGKILL.
  void Fail(const Worker& w, LaunchResult result) {
    failure_ = std::move(result);
    for (const Worker& other : workers_) {
      if (&other != &w) other.SignalGroup(SIGTERM);
    }
    if (!kill_at_) kill_at_ = absl::Now() + options_.kill_grace;
  }

  void OnLauncherSignal(int sig) {
    if (launcher_signals_++ == 0) {
      first_launcher_signal_ = sig;
      for (const Worker& w : workers_) w.SignalGroup(sig);
      if (!kill_at_) kill_at_ = absl::Now() + options_.kill_grace;
    } else {
      for (const Worker& w : workers_) w.SignalGroup(SIGKILL);
    }
  }

  LaunchResult Result() const {
    if (failure_) return *failure_;
    if (launcher_signals_ > 0) {
      return LaunchResult{
          .exit_code = 128 + first_launcher_signal_,
          .failed_worker = "",
          .reason = absl::StrCat("received ", SignalName(first_launcher_signal_), "; forwarded it to the workers")};
    }
    return LaunchResult{};
  }

  const LaunchOptions& options_;
  const Inherited inherited_;
  std::FILE* out_;
  std::FILE* err_;
  SignalPipe signals_;
  SubreaperScope subreaper_;
  std::deque<Worker> workers_;                // every incarnation (references stay valid as it grows)
  std::vector<size_t> restart_pending_;       // indices into workers_, from OnExit
  std::optional<absl::Time> kill_at_;         // SIGKILL every group at this time
  std::optional<absl::Time> drain_deadline_;  // stop waiting for output at this time
  std::optional<LaunchResult> failure_;
  int launcher_signals_ = 0;
  int first_launcher_signal_ = 0;
};

}  // namespace

absl::StatusOr<int> PickFreePort(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(address.c_str(), "0", &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot pick a free port: cannot resolve master address '", address,
                                                   "': ", ::gai_strerror(rc),
                                                   "; use an address of this machine such as 127.0.0.1"));
  }
  std::string why = "no usable address";
  std::optional<int> port;
  for (addrinfo* ai = found; ai != nullptr && !port; ai = ai->ai_next) {
    Fd sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!sock.valid()) {
      why = absl::StrCat("socket: ", std::strerror(errno));
      continue;
    }
    if (::bind(sock.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      why = absl::StrCat("bind: ", std::strerror(errno));
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      why = absl::StrCat("getsockname: ", std::strerror(errno));
      continue;
    }
    if (bound.ss_family == AF_INET) {
      port = ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    } else if (bound.ss_family == AF_INET6) {
      port = ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
    }
  }
  ::freeaddrinfo(found);
  if (!port) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot pick a free port on '", address, "' (", why,
                     "); the master address must belong to this machine, or set the port explicitly"));
  }
  return *port;
}

// Whether the user gave the job's secret (or turned authentication off), in the
// launcher's environment or in extra_env.
bool UserGaveSecret(const LaunchOptions& options) {
  for (const char* name : {"GRADWIRE_SECRET", "GRADWIRE_SECRET_FILE"}) {
    const char* v = std::getenv(name);
    if ((v != nullptr && *v != '\0') || options.extra_env.count(name) != 0) return true;
  }
  const char* auth = std::getenv("GRADWIRE_AUTH");
  auto it = options.extra_env.find("GRADWIRE_AUTH");
  const std::string off = it != options.extra_env.end() ? it->second : auth != nullptr ? auth : "";
  return off == "off" || off == "OFF" || off == "Off";
}

absl::Status CheckLaunchOptions(const LaunchOptions& options) {
  if (absl::Status s = ValidateOptions(options, stdout, stderr); !s.ok()) return s;
  if (UserGaveSecret(options)) return absl::OkStatus();
  const bool others_join = options.join || options.max_workers > options.nnodes * options.num_workers;
  if (options.nnodes > 1 || others_join) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.nnodes > 1 ? "a job over several machines"
        : options.join     ? "a worker that joins a running job"
                           : "a job that others may join (max_workers, --max-workers)",
        " needs one secret shared by every launcher, and none is set: make one with `gradwire secret > job.secret` "
        "(then chmod 600 job.secret; copy it to every machine), and set GRADWIRE_SECRET_FILE=job.secret for every "
        "launcher",
        options.join ? ", the one that started the job too" : "",
        " (or GRADWIRE_AUTH=off on a network where every process is trusted)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchResult> Launch(const LaunchOptions& given, std::FILE* out, std::FILE* err) {
  if (absl::Status s = ValidateOptions(given, out, err); !s.ok()) return s;
  if (absl::Status s = CheckLaunchOptions(given); !s.ok()) return s;
  LaunchOptions options = given;
  JobSecret secret;
  Inherited inherited;
  if (!UserGaveSecret(options)) {
    if (absl::Status s = secret.Make(); !s.ok()) return s;
    options.extra_env["GRADWIRE_SECRET_FILE"] = secret.path();
    inherited.secret_fd = secret.fd();
  }
  // Lines a worker prints reach the launcher as it prints them (its stdout is a pipe, so
  // stdio would buffer whole blocks): the rpc library makes stdout line-buffered when this
  // is set (rpc/src/agent_options.cc); GRADWIRE_LINE_BUFFERED=0 keeps the default buffering.
  if (std::getenv("GRADWIRE_LINE_BUFFERED") == nullptr) {
    options.extra_env.emplace(std::string("GRADWIRE_LINE_BUFFERED"), std::string("1"));  // unless extra_env has it
  }
  LaunchSlot slot;
  if (!slot.acquired()) {
    return absl::FailedPreconditionError(
        "another Launch() is already running in this process; run launches one at a time");
  }
  rlimit nofile{};
  if (absl::Status s = CheckResourceLimits(options.num_workers, &nofile); !s.ok()) return s;
  rlimit now{};
  if (::getrlimit(RLIMIT_NOFILE, &now) == 0 && now.rlim_cur != nofile.rlim_cur) inherited.nofile = nofile;
  NofileRestore restore(inherited.nofile);
  int port = options.master_port;
  if (port == 0 && options.rdzv.empty()) {
    absl::StatusOr<int> picked = PickFreePort(options.master_addr);
    if (!picked.ok()) return picked.status();
    port = *picked;
  }
  std::fflush(out);  // so nothing the caller wrote earlier lands after the workers' lines
  std::fflush(err);
  Supervisor supervisor(options, inherited, out, err);
  return supervisor.Run(port);
}

}  // namespace gw::worker
