#include "child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace gw::rpc::testing {

absl::Status ChildProcess::Start(const std::vector<std::string>& args, const std::string& log) {
  Kill();
  std::vector<char*> argv;  // made before fork: the child of a threaded process must not allocate
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork failed starting ", args[0]));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (out >= 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
    }
    if (in >= 0) ::dup2(in, STDIN_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  return absl::OkStatus();
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

bool ChildProcess::Exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  pid_ = -1;
  return true;
}

bool AwaitStopped(pid_t pid, absl::Duration within) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  for (const absl::Time deadline = absl::Now() + within;; absl::SleepFor(absl::Milliseconds(1))) {
    bool all = true, any = false;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream in(task.path() / "stat");
      std::string line;
      std::getline(in, line);
      // "<tid> (<comm>) <state> ...": the state follows the last ')'.
      const size_t close = line.rfind(')');
      const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
      any = true;
      if (state != 'T' && state != 't') all = false;
    }
    if (any && all) return true;
    if (absl::Now() >= deadline) return false;
  }
}

std::string FileTail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
}

absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& target, const std::vector<std::string>& headers,
                                     const std::string& method) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    std::string request = absl::StrCat(method, " ", target, " HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    for (const std::string& h : headers) absl::StrAppend(&request, h, "\r\n");
    request += "\r\n";
    if (::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[16384];
      for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) response.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t end = response.find("\r\n\r\n");
  if (end == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("no answer from 127.0.0.1:", port, target));
  }
  HttpResponse r;
  r.head = response.substr(0, end);
  r.body = response.substr(end + 4);
  const size_t space = r.head.find(' ');
  if (space == std::string::npos || !absl::SimpleAtoi(r.head.substr(space + 1, 3), &r.status)) {
    return absl::DataLossError(absl::StrCat("not an HTTP response from 127.0.0.1:", port, ": ", r.head));
  }
  return r;
}

std::string UrlEncode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

}  // namespace gw::rpc::testing
