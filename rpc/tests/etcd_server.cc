// EtcdServer: a real etcd on loopback for tests (see etcd_server.h).
#include "etcd_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gradwire/rpc/store.h"

namespace gw::rpc::testing {

absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  if (!ok) return absl::InternalError("cannot find a free loopback port");
  return static_cast<int>(ntohs(a.sin_port));
}

namespace {

// The body of GET `path` from 127.0.0.1:port (HTTP/1.0: the server closes when done).
absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
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
    const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[16384];
      for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) response.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return absl::UnavailableError(absl::StrCat("no answer from 127.0.0.1:", port, path));
  return response.substr(body + 4);
}

}  // namespace

bool EtcdServer::Available() { return ::access(kBinary, X_OK) == 0; }

absl::StatusOr<std::unique_ptr<EtcdServer>> EtcdServer::Start(const TlsOptions& tls) {
  std::unique_ptr<EtcdServer> server(new EtcdServer());
  server->tls_ = tls;
  char dir[] = "/tmp/gw-etcd-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp failed");
  server->dir_ = dir;
  absl::StatusOr<int> client = FreeLoopbackPort(), peer = FreeLoopbackPort();
  if (!client.ok()) return client.status();
  if (!peer.ok()) return peer.status();
  server->client_port_ = *client;
  server->peer_port_ = *peer;
  if (absl::Status s = server->Launch(); !s.ok()) return s;
  return server;
}

EtcdServer::~EtcdServer() {
  Stop();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void EtcdServer::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

absl::Status EtcdServer::Restart() {
  Stop();
  return Launch();
}

std::string EtcdServer::endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }

std::string EtcdServer::Url(absl::string_view job) const { return absl::StrCat("etcd://", endpoint(), "/", job); }

absl::Status EtcdServer::Launch() {
  const std::string client = absl::StrCat(tls_.enabled() ? "https" : "http", "://127.0.0.1:", client_port_);
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  std::vector<std::string> args = {kBinary,
                                         "--name=gw-test",
                                         absl::StrCat("--data-dir=", dir_, "/data"),
                                         absl::StrCat("--listen-client-urls=", client),
                                         absl::StrCat("--advertise-client-urls=", client),
                                         absl::StrCat("--listen-peer-urls=", peer),
                                         absl::StrCat("--initial-advertise-peer-urls=", peer),
                                         absl::StrCat("--initial-cluster=gw-test=", peer),
                                         "--initial-cluster-state=new",
                                         "--initial-cluster-token=gw-test"};
  if (tls_.enabled()) {
    for (std::string flag : {absl::StrCat("--cert-file=", tls_.cert_file), absl::StrCat("--key-file=", tls_.key_file),
                             absl::StrCat("--trusted-ca-file=", tls_.ca_file), std::string("--client-cert-auth")}) {
      args.push_back(flag);
    }
  }
  const std::string log = absl::StrCat(dir_, "/etcd.log");
  std::vector<char*> argv;  // made before fork: the child of a threaded process must not allocate
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (out >= 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
    }
    if (in >= 0) ::dup2(in, STDIN_FILENO);
    ::execv(kBinary, argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  // Answering etcd's KV API is what ConnectStore waits for.
  Security security;
  security.tls = tls_;
  absl::StatusOr<std::unique_ptr<Store>> probe =
      ConnectStore(Url("probe"), absl::Now() + absl::Seconds(30), security);
  if (probe.ok()) return absl::OkStatus();
  int status = 0;
  const bool exited = ::waitpid(pid_, &status, WNOHANG) == pid_;
  if (exited) pid_ = -1;
  return absl::UnavailableError(absl::StrCat("etcd on ", endpoint(), exited ? " exited" : " does not answer", ": ",
                                             probe.status().message(), "; its log ends with:\n", LogTail()));
}

std::string EtcdServer::LogTail() const {
  std::ifstream in(absl::StrCat(dir_, "/etcd.log"));
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
}

double EtcdServer::Metric(absl::string_view name, absl::string_view labels) const {
  absl::StatusOr<std::string> body = HttpGet(client_port_, "/metrics");
  if (!body.ok()) return -1;
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (line.empty() || line[0] == '#' || !absl::ConsumePrefix(&line, name)) continue;
    if (line.empty() || (line[0] != '{' && line[0] != ' ')) continue;  // another metric with this prefix
    const size_t space = line.rfind(' ');
    if (line.substr(0, space).find(labels) == absl::string_view::npos) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &v)) sum += v;
  }
  return sum;
}

bool EtcdServer::AwaitMetric(absl::string_view name, absl::string_view labels,
                             const std::function<bool(double)>& holds, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (!holds(Metric(name, labels))) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));  // etcd tells nobody: its metrics are read
  }
  return true;
}

}  // namespace gw::rpc::testing
