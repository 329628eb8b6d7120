#include "job_view.h"

#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gradwire/rpc/metrics_endpoint.h"
#include "gradwire/rpc/security.h"
#include "gradwire/rpc/store.h"

namespace gw::worker {

absl::StatusOr<std::vector<WorkerEndpoint>> FindEndpoints(const JobAddress& where, absl::Duration timeout) {
  std::vector<WorkerEndpoint> out;
  if (where.store.empty()) {
    for (int k = 0; k < where.workers; ++k) {
      out.push_back({absl::StrCat("worker", k), k, absl::StrCat(where.metrics_host, ":", where.metrics_port + k)});
    }
    return out;
  }
  absl::StatusOr<rpc::Security> security = rpc::Security::FromEnv();
  if (!security.ok()) return security.status();
  absl::StatusOr<std::unique_ptr<rpc::Store>> store = rpc::ConnectStore(where.store, absl::Now() + timeout, *security);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("the job's rendezvous store ", where.store, ": ", store.status().message(),
                                     security->secret.empty() ? " (give the job's secret: GRADWIRE_SECRET_FILE)" : ""));
  }
  // The group's capacity (an elastic group may have holes); else ranks until the first gap.
  int capacity = -1;
  if (absl::StatusOr<std::string> group = (*store)->Get(absl::StrCat(where.run_id, "/group"), absl::Milliseconds(200));
      group.ok()) {
    std::vector<std::string> parts = absl::StrSplit(*group, ' ');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &capacity)) capacity = -1;
  }
  for (int r = 0; capacity < 0 || r < capacity; ++r) {
    absl::StatusOr<std::string> record =
        (*store)->Get(absl::StrCat(where.run_id, "/worker/", r), absl::Milliseconds(capacity < 0 ? 200 : 20));
    if (!record.ok()) {
      if (capacity < 0) break;
      continue;
    }
    WorkerEndpoint w{.rank = r};
    std::vector<std::string> lines = absl::StrSplit(*record, '\n');
    w.worker = lines.empty() ? absl::StrCat("rank ", r) : lines[0];
    if (absl::StatusOr<std::string> m =
            (*store)->Get(absl::StrCat(where.run_id, "/metrics/", r), absl::Milliseconds(20));
        m.ok()) {
      w.address = *m;
    }
    out.push_back(std::move(w));
  }
  if (out.empty()) {
    return absl::NotFoundError(absl::StrCat("the store ", where.store, " holds no worker of run '", where.run_id,
                                            "' (is the job running? --run-id names its GRADWIRE_RUN_ID)"));
  }
  return out;
}

std::vector<absl::StatusOr<std::string>> ReadAll(const std::vector<WorkerEndpoint>& endpoints, const std::string& path,
                                                 const std::string& token, absl::Duration timeout) {
  std::vector<absl::StatusOr<std::string>> out(endpoints.size(), absl::UnknownError("not read"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (endpoints[i].address.empty()) {
      out[i] = absl::NotFoundError(
          "it serves no metrics endpoint (start it with AgentOptions::metrics_port, "
          "GRADWIRE_METRICS_PORT or gradwire launch --metrics-port)");
      continue;
    }
    threads.emplace_back([&, i] { out[i] = rpc::ReadEndpoint(endpoints[i].address, path, token, timeout); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

std::vector<rpc::Sample> ParseMetrics(const std::string& text) {
  std::vector<rpc::Sample> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    rpc::Sample s;
    if (!absl::SimpleAtod(line.substr(space + 1), &s.value)) continue;
    absl::string_view head = line.substr(0, space);
    const size_t brace = head.find('{');
    s.name = std::string(head.substr(0, brace));
    if (brace != absl::string_view::npos) {
      // label="value",... (values escape \\, \" and \n)
      absl::string_view rest = head.substr(brace + 1);
      while (!rest.empty() && rest[0] != '}') {
        const size_t eq = rest.find("=\"");
        if (eq == absl::string_view::npos) break;
        std::string key(rest.substr(0, eq)), value;
        size_t i = eq + 2;
        for (; i < rest.size() && rest[i] != '"'; ++i) {
          if (rest[i] == '\\' && i + 1 < rest.size()) {
            ++i;
            value += rest[i] == 'n' ? '\n' : rest[i];
          } else {
            value += rest[i];
          }
        }
        s.labels[key] = value;
        rest = rest.substr(std::min(rest.size(), i + 1));
        if (!rest.empty() && rest[0] == ',') rest.remove_prefix(1);
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace gw::worker
