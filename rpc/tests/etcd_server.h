// EtcdServer: a real etcd for tests (Debian's /usr/bin/etcd, package etcd-server, which
// scripts/setup-deps installs): one member on free loopback ports with its own data
// directory, which tests may stop (as a crash) and start again on the same data.
//
// Contract
//   - Available() tells whether /usr/bin/etcd exists; tests skip without it:
//       if (!EtcdServer::Available()) GTEST_SKIP() << EtcdServer::kMissing;
//   - Start() picks a free loopback client port and peer port, makes a temporary
//     directory (data dir and etcd's log), starts etcd with --listen-client-urls,
//     --advertise-client-urls, --listen-peer-urls, --initial-advertise-peer-urls and
//     --initial-cluster on them, and returns once it answers etcd's KV API (waiting on the
//     connection, within 30 s); otherwise an error with the tail of etcd's log.
//   - Stop() kills etcd (SIGKILL: a crash, as far as clients can tell) and reaps it; its
//     data stays. Restart() starts it again on the same ports and data dir and returns
//     once it answers. Both are idempotent where that makes sense (Stop of a stopped one).
//   - Url(job) is "etcd://127.0.0.1:<client port>/<job>"; endpoint() the "host:port".
//   - Metric(name, labels) reads etcd's Prometheus endpoint (GET /metrics on the client
//     port) and sums the samples of `name` whose labels contain `labels`; -1 when etcd
//     does not answer. AwaitMetric waits (re-reading every 10 ms, up to `timeout`) until
//     `holds` accepts the metric's value: the tests' way to know that a client watches
//     (etcd_debugging_mvcc_watcher_total >= 1), or that its watch is gone (== 0);
//     AwaitWatchers(holds) is that for the number of watchers.
//   - The destructor kills etcd, reaps it and removes the directory.
//   - FreeLoopbackPort() is a port of 127.0.0.1 that was free a moment ago;
//     FreeLoopbackPortPair() one whose next port was free too.
//   - EtcdTest: a GoogleTest fixture that starts one in SetUp (etcd_), or skips.
//   - etcd dies with the thread that started it (PR_SET_PDEATHSIG), so that no test leaves
//     one behind: Start and Restart from the test's main thread. Not thread-safe.
#ifndef GRADWIRE_RPC_TESTS_ETCD_SERVER_H_
#define GRADWIRE_RPC_TESTS_ETCD_SERVER_H_

#include <gtest/gtest.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "child_process.h"
#include "gradwire/rpc/security.h"

namespace gw::rpc::testing {

absl::StatusOr<int> FreeLoopbackPort();
// A port p of 127.0.0.1 such that p and p + 1 were both free a moment ago (for workers
// that take base + rank).
absl::StatusOr<int> FreeLoopbackPortPair();

class EtcdServer {
 public:
  static constexpr char kBinary[] = "/usr/bin/etcd";
  static constexpr char kMissing[] =
      "/usr/bin/etcd is missing: install Debian's etcd-server (scripts/setup-deps does) to run the etcd tests";

  static bool Available();
  // With tls: clients must use TLS and present a certificate the CA signed
  // (--client-cert-auth); etcd presents tls's certificate (it must name 127.0.0.1).
  static absl::StatusOr<std::unique_ptr<EtcdServer>> Start(const TlsOptions& tls = {});
  ~EtcdServer();

  void Stop();
  absl::Status Restart();

  std::string endpoint() const;
  std::string Url(absl::string_view job) const;
  double Metric(absl::string_view name, absl::string_view labels = "") const;
  bool AwaitMetric(absl::string_view name, absl::string_view labels, const std::function<bool(double)>& holds,
                   absl::Duration timeout = absl::Seconds(20)) const;
  bool AwaitWatchers(const std::function<bool(double)>& holds) const {
    return AwaitMetric("etcd_debugging_mvcc_watcher_total", "", holds);
  }

 private:
  EtcdServer() = default;
  absl::Status Launch();
  std::string LogTail() const;

  std::string dir_;
  TlsOptions tls_;
  int client_port_ = 0;
  int peer_port_ = 0;
  ChildProcess process_;
};

// A test fixture with a fresh etcd in etcd_ (skipped where etcd is not installed).
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdServer::Available()) GTEST_SKIP() << EtcdServer::kMissing;
    absl::StatusOr<std::unique_ptr<EtcdServer>> etcd = EtcdServer::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
  }

  std::unique_ptr<EtcdServer> etcd_;
};

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_ETCD_SERVER_H_
