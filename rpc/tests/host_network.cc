// HostNetwork: simulated hosts (network namespaces on a bridge) for tests only.
#include "host_network.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace gw::testing {
namespace {

constexpr char kPrefix[] = "gwhost-";
constexpr char kNetnsDir[] = "/run/netns";
constexpr char kLogRoot[] = "/tmp";

// iproute2's `ip`, looked up on PATH and in the sbin folders a non-login root shell may
// not have on it; empty if absent.
std::string IpPath() {
  std::string dirs = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  for (absl::string_view dir : absl::StrSplit(dirs + ":/usr/sbin:/sbin:/usr/bin:/bin", ':', absl::SkipEmpty())) {
    const std::string path = absl::StrCat(dir, "/ip");
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// Runs argv (argv[0] a path) to completion: its exit code and what it printed.
absl::StatusOr<std::pair<int, std::string>> RunCommand(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", std::strerror(rc)));
  }
  std::string output;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(out[0], buffer, sizeof(buffer))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) output.append(buffer, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return std::pair{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// The pid in "gwhost-<pid>-...", or 0.
pid_t OwnerOf(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return 0;
  const std::string rest = name.substr(std::strlen(kPrefix));
  int pid = 0;
  return absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid) && pid > 0 ? pid : 0;
}

std::atomic<int> next_network{0};  // names stay unique within this process

}  // namespace

// ---------------------------------------------------------------- HostProcess

HostProcess::~HostProcess() {
  Kill();
  if (pidfd_ >= 0) ::close(pidfd_);
}

std::string HostProcess::output() const {
  std::ifstream in(log_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string HostProcess::Field(const std::string& key) const {
  std::string value;
  for (absl::string_view line : absl::StrSplit(output(), '\n')) {
    if (absl::ConsumePrefix(&line, key + "=")) value = std::string(line);
  }
  return value;
}

bool HostProcess::AwaitOutput(const std::function<bool()>& done, absl::Time deadline) {
  const int fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return done();
  ::inotify_add_watch(fd, log_.c_str(), IN_MODIFY);
  bool holds = false;
  for (;;) {
    holds = done();  // after the watch exists: no write is missed
    if (holds || Reap() || absl::Now() >= deadline) break;
    pollfd fds[2] = {{fd, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    const int64_t ms = std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()), 0, 1000);
    ::poll(fds, 2, static_cast<int>(ms));
    char events[4096];
    while (::read(fd, events, sizeof events) > 0) {
    }
  }
  ::close(fd);
  return holds || done();
}

std::string HostProcess::AwaitField(const std::string& key, absl::Time deadline) {
  AwaitOutput([&] { return !Field(key).empty(); }, deadline);
  return Field(key);
}

bool HostProcess::AwaitText(const std::string& text, absl::Time deadline) {
  return AwaitOutput([&] { return output().find(text) != std::string::npos; }, deadline);
}

bool HostProcess::Reap() {
  if (exited()) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

void HostProcess::Kill() {
  if (exited()) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---------------------------------------------------------------- HostNetwork

std::string HostNetwork::Unsupported() {
  if (::geteuid() != 0) return "needs root to make network namespaces (CI runs as root)";
  if (IpPath().empty()) return "needs iproute2's `ip` (scripts/setup-deps installs it)";
  return "";
}

void HostNetwork::SweepStale() {
  std::error_code ec;
  const std::string ip = IpPath();
  for (const auto& entry : std::filesystem::directory_iterator(kNetnsDir, ec)) {
    const std::string name = entry.path().filename();
    const pid_t owner = OwnerOf(name);
    if (owner != 0 && !Alive(owner) && !ip.empty()) (void)RunCommand({ip, "netns", "delete", name});
  }
  for (const auto& entry : std::filesystem::directory_iterator(kLogRoot, ec)) {
    const pid_t owner = OwnerOf(entry.path().filename());
    if (owner != 0 && !Alive(owner)) std::filesystem::remove_all(entry.path(), ec);
  }
}

absl::StatusOr<std::unique_ptr<HostNetwork>> HostNetwork::Create(int hosts) {
  if (std::string why = Unsupported(); !why.empty()) return absl::FailedPreconditionError(why);
  if (hosts < 1 || hosts > 250) return absl::InvalidArgumentError(absl::StrCat("cannot make ", hosts, " hosts"));
  SweepStale();
  std::unique_ptr<HostNetwork> network(
      new HostNetwork(absl::StrCat(kPrefix, ::getpid(), "-", next_network.fetch_add(1))));
  if (absl::Status s = network->Build(hosts); !s.ok()) return s;  // the destructor cleans up
  return network;
}

absl::Status HostNetwork::Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {IpPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::pair<int, std::string>> result = RunCommand(argv);
  if (!result.ok()) return result.status();
  if (result->first != 0) {
    return absl::InternalError(absl::StrCat("`ip ", absl::StrJoin(args, " "), "` failed (exit ", result->first,
                                            "): ", result->second));
  }
  return absl::OkStatus();
}

absl::Status HostNetwork::AddNamespace(const std::string& name) {
  if (absl::Status s = Ip({"netns", "add", name}); !s.ok()) return s;
  made_.push_back(name);
  return absl::OkStatus();
}

absl::Status HostNetwork::Build(int hosts) {
  log_dir_ = absl::StrCat(kLogRoot, "/", base_);
  std::error_code ec;
  std::filesystem::remove_all(log_dir_, ec);
  if (!std::filesystem::create_directory(log_dir_, ec)) {
    return absl::InternalError(absl::StrCat("cannot make ", log_dir_, ": ", ec.message()));
  }
  const std::string sw = base_ + "-sw";
  if (absl::Status s = AddNamespace(sw); !s.ok()) return s;
  for (const auto& step : std::vector<std::vector<std::string>>{{"-n", sw, "link", "add", "br0", "type", "bridge"},
                                                                {"-n", sw, "link", "set", "br0", "up"}}) {
    if (absl::Status s = Ip(step); !s.ok()) return s;
  }
  for (int i = 0; i < hosts; ++i) {
    Host host{absl::StrCat(base_, "-h", i), absl::StrCat("10.201.0.", i + 1)};
    if (absl::Status s = AddNamespace(host.name); !s.ok()) return s;
    const std::string port = absl::StrCat("p", i);
    const std::vector<std::vector<std::string>> steps = {
        {"-n", host.name, "link", "set", "lo", "up"},
        {"-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.name},
        {"-n", sw, "link", "set", port, "master", "br0"},
        {"-n", sw, "link", "set", port, "up"},
        {"-n", host.name, "addr", "add", host.address + "/24", "dev", "eth0"},
        {"-n", host.name, "link", "set", "eth0", "up"},
    };
    for (const auto& step : steps) {
      if (absl::Status s = Ip(step); !s.ok()) return s;
    }
    hosts_.push_back(std::move(host));
  }
  return absl::OkStatus();
}

absl::Status HostNetwork::SetLink(int host, bool up) {
  if (host < 0 || host >= size()) return absl::InvalidArgumentError(absl::StrCat("no host ", host));
  return Ip({"-n", base_ + "-sw", "link", "set", absl::StrCat("p", host), up ? "up" : "down"});
}

HostNetwork::~HostNetwork() {
  processes_.clear();  // killed and reaped: nothing keeps a namespace alive
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
    if (absl::Status s = Ip({"netns", "delete", *it}); !s.ok()) std::fprintf(stderr, "HostNetwork: %s\n", s.ToString().c_str());
  }
  std::error_code ec;
  if (!log_dir_.empty()) std::filesystem::remove_all(log_dir_, ec);
}

absl::StatusOr<HostProcess*> HostNetwork::Start(int host, const std::vector<std::string>& argv,
                                                const std::map<std::string, std::string>& env) {
  if (host < 0 || host >= size() || argv.empty()) return absl::InvalidArgumentError("no such host, or no program");
  // Everything the child needs is prepared here: after fork it only makes system calls.
  const std::string ns_path = absl::StrCat(kNetnsDir, "/", namespace_name(host));
  const int ns = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0) return absl::InternalError(absl::StrCat("cannot open ", ns_path, ": ", std::strerror(errno)));
  const std::string log = absl::StrCat(log_dir_, "/h", host, "-", processes_.size(), ".log");
  const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    ::close(ns);
    return absl::InternalError(absl::StrCat("cannot create ", log, ": ", std::strerror(errno)));
  }
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) merged[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  args.push_back(nullptr);
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);  // the test died meanwhile
    if (::setns(ns, CLONE_NEWNET) != 0) ::_exit(125);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(ns);
  ::close(out);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(fork_errno)));
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  processes_.push_back(std::make_unique<HostProcess>(pid, pidfd, log));
  if (pidfd < 0) return absl::InternalError(absl::StrCat("pidfd_open: ", std::strerror(errno)));
  return processes_.back().get();
}

std::vector<int> HostNetwork::WaitAll(const std::vector<HostProcess*>& processes, absl::Time deadline) {
  while (true) {
    bool failed = false;
    std::vector<pollfd> running;
    for (HostProcess* p : processes) {
      if (p->Reap()) {
        failed = failed || p->exit_code() != 0;
      } else {
        running.push_back({p->pidfd_, POLLIN, 0});
      }
    }
    const absl::Duration left = deadline - absl::Now();
    if (running.empty()) break;
    if (failed || left <= absl::ZeroDuration()) {
      for (HostProcess* p : processes) p->Kill();
      break;
    }
    const int ms = static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1, 1 << 30));
    (void)::poll(running.data(), running.size(), ms);  // an exit, or the deadline
  }
  std::vector<int> codes;
  for (HostProcess* p : processes) codes.push_back(p->exit_code());
  return codes;
}

}  // namespace gw::testing
