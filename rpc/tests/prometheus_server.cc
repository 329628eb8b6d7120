#include "prometheus_server.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcd_server.h"
#include "nlohmann/json.hpp"

namespace gw::rpc::testing {

bool PrometheusServer::Available() { return ::access(kBinary, X_OK) == 0; }

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(const std::vector<int>& target_ports,
                                                                          const std::string& bearer_token) {
  std::unique_ptr<PrometheusServer> server(new PrometheusServer());
  char dir[] = "/tmp/gw-prometheus-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp failed");
  server->dir_ = dir;
  absl::StatusOr<int> port = FreeLoopbackPort();
  if (!port.ok()) return port.status();
  server->port_ = *port;
  std::vector<std::string> targets;
  for (int p : target_ports) targets.push_back(absl::StrCat("'127.0.0.1:", p, "'"));
  const std::string config = absl::StrCat(dir, "/prometheus.yml");
  {
    std::ofstream out(config);
    out << "global:\n  scrape_interval: 250ms\n  scrape_timeout: 250ms\n"
        << "scrape_configs:\n  - job_name: gradwire\n"
        << (bearer_token.empty()
                ? ""
                : absl::StrCat("    authorization:\n      type: Bearer\n      credentials: ", bearer_token, "\n"))
        << "    static_configs:\n      - targets: [" << absl::StrJoin(targets, ", ") << "]\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", config));
  }
  const std::string log = absl::StrCat(dir, "/prometheus.log");
  if (absl::Status s = server->process_.Start(
          {kBinary, absl::StrCat("--config.file=", config), absl::StrCat("--storage.tsdb.path=", dir, "/data"),
           absl::StrCat("--web.listen-address=127.0.0.1:", server->port_)},
          log);
      !s.ok()) {
    return s;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    absl::StatusOr<HttpResponse> ready = HttpGet(server->port_, "/-/ready");
    if (ready.ok() && ready->status == 200) return server;
    if (server->process_.Exited() || absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("Prometheus on 127.0.0.1:", server->port_,
                                                 server->process_.running() ? " is not ready" : " exited",
                                                 "; its log ends with:\n", FileTail(log)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

PrometheusServer::~PrometheusServer() {
  process_.Kill();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::StatusOr<double> PrometheusServer::Query(const std::string& expr) const {
  absl::StatusOr<HttpResponse> r = HttpGet(port_, absl::StrCat("/api/v1/query?query=", UrlEncode(expr)));
  if (!r.ok()) return r.status();
  const nlohmann::json answer = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (answer.is_discarded())
    return absl::DataLossError(absl::StrCat("Prometheus answered what is not JSON: ", r->body));
  if (answer.value("status", "") != "success") {
    return absl::InvalidArgumentError(absl::StrCat("Prometheus: ", expr, ": ", answer.value("error", r->body)));
  }
  const nlohmann::json& result = answer["data"]["result"];
  if (result.empty()) return absl::NotFoundError(absl::StrCat("Prometheus has no sample of ", expr, " yet"));
  if (result.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(expr, " yields ", result.size(), " samples: ", result.dump()));
  }
  return std::stod(result[0]["value"][1].get<std::string>());
}

absl::StatusOr<double> PrometheusServer::AwaitValue(const std::string& expr, double value,
                                                    absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<double> v = Query(expr);
    if ((v.ok() && *v == value) || absl::Now() > deadline) return v;
    absl::SleepFor(absl::Milliseconds(100));
  }
}

std::string PrometheusServer::Targets() const {
  absl::StatusOr<HttpResponse> r = HttpGet(port_, "/api/v1/targets");
  return r.ok() ? r->body : std::string(r.status().message());
}

}  // namespace gw::rpc::testing
