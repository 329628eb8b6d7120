// EtcdServer: a real etcd on loopback for tests (see etcd_server.h).
#include "etcd_server.h"

#include "child_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gradwire/rpc/store.h"

namespace gw::rpc::testing {

namespace {

// Binds 127.0.0.1:port (0: any) and returns the port bound, or -1; the socket is closed.
int BindLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  return ok ? static_cast<int>(ntohs(a.sin_port)) : -1;
}

}  // namespace

absl::StatusOr<int> FreeLoopbackPort() {
  const int port = BindLoopback(0);
  if (port < 0) return absl::InternalError("cannot find a free loopback port");
  return port;
}

absl::StatusOr<int> FreeLoopbackPortPair() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = BindLoopback(0);
    if (port > 0 && port < 65535 && BindLoopback(port + 1) == port + 1) return port;
  }
  return absl::InternalError("cannot find two consecutive free loopback ports");
}

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

void EtcdServer::Stop() { process_.Kill(); }

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
  if (absl::Status s = process_.Start(args, absl::StrCat(dir_, "/etcd.log")); !s.ok()) return s;
  // Answering etcd's KV API is what ConnectStore waits for.
  Security security;
  security.tls = tls_;
  absl::StatusOr<std::unique_ptr<Store>> probe =
      ConnectStore(Url("probe"), absl::Now() + absl::Seconds(30), security);
  if (probe.ok()) return absl::OkStatus();
  const bool exited = process_.Exited();
  return absl::UnavailableError(absl::StrCat("etcd on ", endpoint(), exited ? " exited" : " does not answer", ": ",
                                             probe.status().message(), "; its log ends with:\n", LogTail()));
}

std::string EtcdServer::LogTail() const { return FileTail(absl::StrCat(dir_, "/etcd.log")); }

double EtcdServer::Metric(absl::string_view name, absl::string_view labels) const {
  absl::StatusOr<HttpResponse> response = HttpGet(client_port_, "/metrics");
  if (!response.ok()) return -1;
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(response->body, '\n')) {
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
