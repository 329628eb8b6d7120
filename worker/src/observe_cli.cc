#include "observe_cli.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gradwire/rpc/metrics_endpoint.h"
#include "gradwire/rpc/security.h"
#include "gradwire/rpc/waits.h"
#include "job_view.h"
#include "trace_tool.h"

namespace gw::worker {

const char kObserveUsage[] =
    R"(usage: gradwire debug JOB [--timeout SECONDS]
       gradwire top JOB [--interval SECONDS] [--iterations K]
       gradwire trace merge DIR|FILE... [-o OUT]
       gradwire trace render MERGED [-o OUT.svg] [--from MS] [--to MS] [--width PX] [--title T]
JOB (which job, and how to reach its workers' metrics endpoints):
  --master-addr A --master-port P   the job's rendezvous store (rank 0's), as the job was
                                    launched (default: MASTER_ADDR, MASTER_PORT)
  --rdzv etcd://HOST:PORT/JOB       the job's etcd rendezvous (default: GRADWIRE_RDZV)
  --run-id ID                       the job's GRADWIRE_RUN_ID (default "gradwire")
  --metrics-port P -n N             or: N workers at 127.0.0.1:P ... P+N-1, as
                                    `gradwire launch -n N --metrics-port P` serves them
  --metrics-host H                  the host of those endpoints (default 127.0.0.1)
The job's secret (GRADWIRE_SECRET_FILE or GRADWIRE_SECRET) opens its store, and gives
the metrics token that endpoints beyond loopback ask for. Workers are reached through
their metrics endpoints: the job serves them when started with --metrics-port (gradwire
launch), GRADWIRE_METRICS_PORT or AgentOptions::metrics_port.
debug: gathers what every worker waits for and prints who waits on whom, naming the
       worker at the root of each chain and what it runs (a worker that does not answer
       within the timeout, default 1 s, is named as frozen or gone); waits shorter than
       --min-wait (default 1 s) are left out: a healthy job has many brief ones.
top:   calls/s, MB/s, p99 latency, requests running, queued tasks and parameter-server
       progress of each worker, refreshed every interval (default 1 s) until Ctrl-C.
trace: `merge` joins the workers' trace files (GRADWIRE_TRACE=DIR) onto one clock (default
       OUT: DIR/merged.trace.json), for ui.perfetto.dev; `render` draws a merged trace as
       an SVG: a lane per worker and thread, flows as arrows.
)";

namespace {

constexpr int kUsageError = 2;

int Usage(const std::string& message) {
  std::fprintf(stderr, "%s\n\n%s", message.c_str(), kObserveUsage);
  return kUsageError;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// JOB's options, and the command's own (name -> value) in `rest`.
struct Parsed {
  JobAddress job;
  std::map<std::string, std::string> rest;
  std::string error;
};

Parsed ParseJob(const std::string& who, const std::vector<std::string>& args, const std::vector<std::string>& own) {
  Parsed p;
  std::string addr = Env("MASTER_ADDR"), port = Env("MASTER_PORT"), rdzv = Env("GRADWIRE_RDZV");
  if (std::string run = Env("GRADWIRE_RUN_ID"); !run.empty()) p.job.run_id = run;
  bool by_ports = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i + 1 >= args.size()) {
      p.error = absl::StrCat(who, ": ", a, a.starts_with("-") ? " needs a value" : ": unexpected argument");
      return p;
    }
    const std::string& v = args[++i];
    if (a == "--master-addr") {
      addr = v;
    } else if (a == "--master-port") {
      port = v;
    } else if (a == "--rdzv") {
      rdzv = v;
    } else if (a == "--run-id") {
      p.job.run_id = v;
    } else if (a == "--metrics-port") {
      by_ports = true;
      if (!absl::SimpleAtoi(v, &p.job.metrics_port) || p.job.metrics_port < 1 || p.job.metrics_port > 65535) {
        p.error = absl::StrCat(who, ": --metrics-port expects a port, got '", v, "'");
        return p;
      }
    } else if (a == "-n") {
      if (!absl::SimpleAtoi(v, &p.job.workers) || p.job.workers < 1) {
        p.error = absl::StrCat(who, ": -n expects a number of workers, got '", v, "'");
        return p;
      }
    } else if (a == "--metrics-host") {
      p.job.metrics_host = v;
    } else if (std::find(own.begin(), own.end(), a) != own.end()) {
      p.rest[a] = v;
    } else {
      p.error = absl::StrCat(who, ": unknown option '", a, "'");
      return p;
    }
  }
  if (by_ports) {
    if (p.job.workers < 1) p.error = absl::StrCat(who, ": --metrics-port needs -n, the number of workers");
    return p;
  }
  if (!rdzv.empty()) {
    p.job.store = rdzv;
  } else if (!port.empty()) {
    p.job.store = absl::StrCat(addr.empty() ? "127.0.0.1" : addr, ":", port);
  } else {
    p.error = absl::StrCat(who, ": which job? give its rendezvous (--master-port P, --rdzv URL) or its workers' ",
                           "metrics ports (--metrics-port P -n N)");
  }
  return p;
}

std::string Token() {
  absl::StatusOr<rpc::Security> security = rpc::Security::FromEnv();
  return security.ok() && !security->secret.empty() ? rpc::MetricsToken(security->secret) : "";
}

}  // namespace

int RunDebug(const std::vector<std::string>& args) {
  Parsed p = ParseJob("gradwire debug", args, {"--timeout", "--min-wait"});
  if (!p.error.empty()) return Usage(p.error);
  double timeout_s = 1, min_wait = 1;
  if (auto it = p.rest.find("--timeout");
      it != p.rest.end() && (!absl::SimpleAtod(it->second, &timeout_s) || timeout_s <= 0)) {
    return Usage(absl::StrCat("gradwire debug: --timeout expects seconds, got '", it->second, "'"));
  }
  if (auto it = p.rest.find("--min-wait");
      it != p.rest.end() && (!absl::SimpleAtod(it->second, &min_wait) || min_wait < 0)) {
    return Usage(absl::StrCat("gradwire debug: --min-wait expects seconds, got '", it->second, "'"));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<WorkerEndpoint>> endpoints = FindEndpoints(p.job, absl::Seconds(5));
  if (!endpoints.ok()) {
    std::fprintf(stderr, "gradwire debug: %s\n", std::string(endpoints.status().message()).c_str());
    return 1;
  }
  std::vector<absl::StatusOr<std::string>> bodies = ReadAll(*endpoints, "/waits", Token(), absl::Seconds(timeout_s));
  std::vector<rpc::WorkerWaits> all;
  int brief = 0;
  for (size_t i = 0; i < endpoints->size(); ++i) {
    const WorkerEndpoint& e = (*endpoints)[i];
    rpc::WorkerWaits w{.worker = e.worker, .rank = e.rank};
    absl::StatusOr<rpc::WorkerWaits> read =
        bodies[i].ok() ? rpc::WaitsFromJson(*bodies[i]) : absl::StatusOr<rpc::WorkerWaits>(bodies[i].status());
    if (read.ok()) {
      w.answered = true;
      // A healthy job waits all the time, briefly: only waits of min_wait or longer count.
      for (rpc::Wait& x : read->waits) {
        if (x.state == "waits" && x.seconds < min_wait) {
          ++brief;
        } else {
          w.waits.push_back(std::move(x));
        }
      }
    } else {
      w.error = std::string(read.status().message());
    }
    all.push_back(std::move(w));
  }
  std::printf("gradwire debug: %s, gathered in %s; %d wait(s) shorter than %gs left out (--min-wait)\n%s",
              p.job.store.empty()
                  ? absl::StrCat("workers at ", p.job.metrics_host, ":", p.job.metrics_port, "+k").c_str()
                  : absl::StrCat("job '", p.job.run_id, "' at ", p.job.store).c_str(),
              absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))).c_str(), brief, min_wait,
              rpc::WhoWaitsOnWhom(all).c_str());
  return 0;
}

namespace {

// One reading of a worker's metrics, summed as `top` shows them.
struct Reading {
  bool ok = false;
  std::string error;
  double calls_out = 0, calls_in = 0, bytes = 0, running = 0, queued = 0;
  std::map<double, double> client_buckets;  // le -> cumulative count, summed over series
  std::optional<double> ps_clock;           // the lowest table clock of a parameter server
  std::optional<double> last_push;          // a trainer's last push (Unix seconds)
  std::optional<double> pushes;
};

Reading Read(const absl::StatusOr<std::string>& body) {
  Reading r;
  if (!body.ok()) {
    r.error = std::string(body.status().message());
    return r;
  }
  r.ok = true;
  for (const rpc::Sample& s : ParseMetrics(*body)) {
    const std::string& n = s.name;
    if (n == "gradwire_rpc_client_calls_total") r.calls_out += s.value;
    if (n == "gradwire_rpc_server_calls_total") r.calls_in += s.value;
    if (n.starts_with("gradwire_rpc_client_") && n.ends_with("_bytes_total")) r.bytes += s.value;
    if (n == "gradwire_rpc_server_requests_running") r.running += s.value;
    if (n == "gradwire_rpc_worker_pool_queued") r.queued += s.value;
    if (n == "gradwire_rpc_client_latency_seconds_bucket") {
      auto le = s.labels.find("le");
      double bound = INFINITY;
      if (le != s.labels.end() && le->second != "+Inf") (void)absl::SimpleAtod(le->second, &bound);
      r.client_buckets[bound] += s.value;
    }
    if (n == "gradwire_ps_table_clock") r.ps_clock = r.ps_clock ? std::min(*r.ps_clock, s.value) : s.value;
    if (n == "gradwire_ps_client_last_push_time_seconds" && s.value > 0) r.last_push = s.value;
    if (n == "gradwire_ps_client_pushes_total") r.pushes = s.value;
  }
  return r;
}

// The 99th percentile of the calls between two readings (from the bucket counts).
std::string P99(const Reading& before, const Reading& now) {
  std::vector<std::pair<double, double>> delta;
  for (const auto& [le, count] : now.client_buckets) {
    auto it = before.client_buckets.find(le);
    delta.emplace_back(le, count - (it == before.client_buckets.end() ? 0 : it->second));
  }
  if (delta.empty() || delta.back().second <= 0) return "-";
  const double want = 0.99 * delta.back().second;
  for (const auto& [le, count] : delta) {
    if (count >= want) return std::isinf(le) ? ">10000" : absl::StrFormat("%.2f", le * 1000);
  }
  return "-";
}

}  // namespace

int RunTop(const std::vector<std::string>& args) {
  Parsed p = ParseJob("gradwire top", args, {"--interval", "--iterations"});
  if (!p.error.empty()) return Usage(p.error);
  double interval = 1;
  int iterations = -1;
  if (auto it = p.rest.find("--interval");
      it != p.rest.end() && (!absl::SimpleAtod(it->second, &interval) || interval < 0.1)) {
    return Usage(absl::StrCat("gradwire top: --interval expects seconds (0.1 or more), got '", it->second, "'"));
  }
  if (auto it = p.rest.find("--iterations");
      it != p.rest.end() && (!absl::SimpleAtoi(it->second, &iterations) || iterations < 1)) {
    return Usage(absl::StrCat("gradwire top: --iterations expects a count, got '", it->second, "'"));
  }
  absl::StatusOr<std::vector<WorkerEndpoint>> endpoints = FindEndpoints(p.job, absl::Seconds(5));
  if (!endpoints.ok()) {
    std::fprintf(stderr, "gradwire top: %s\n", std::string(endpoints.status().message()).c_str());
    return 1;
  }
  const std::string token = Token();
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  std::vector<Reading> before;
  absl::Time before_at;
  for (int i = 0; iterations < 0 || i <= iterations; ++i) {
    const absl::Time at = absl::Now();
    std::vector<Reading> now;
    for (const auto& body : ReadAll(*endpoints, "/metrics", token, absl::Seconds(std::min(interval, 2.0)))) {
      now.push_back(Read(body));
    }
    if (!before.empty()) {
      const double dt = absl::ToDoubleSeconds(at - before_at);
      std::string screen = tty ? "\033[H\033[2J" : "";
      absl::StrAppendFormat(&screen, "gradwire top: %d workers, every %gs (%s)\n", static_cast<int>(now.size()),
                            interval, absl::FormatTime("%H:%M:%S", at, absl::LocalTimeZone()));
      absl::StrAppendFormat(&screen, "%-12s %10s %10s %9s %9s %8s %7s %9s %10s\n", "worker", "calls/s", "served/s",
                            "MB/s", "p99 ms", "running", "queued", "ps clock", "last push");
      for (size_t w = 0; w < now.size(); ++w) {
        const Reading& a = before[w];
        const Reading& b = now[w];
        const std::string& name = (*endpoints)[w].worker;
        if (!b.ok) {
          absl::StrAppendFormat(&screen, "%-12s %s\n", name, absl::StrCat("(no answer: ", b.error, ")"));
          continue;
        }
        std::string push = "-";
        if (b.last_push) {
          push = absl::StrFormat("%.1fs ago", absl::ToDoubleSeconds(at - absl::FromUnixSeconds(0)) - *b.last_push);
        }
        absl::StrAppendFormat(&screen, "%-12s %10.1f %10.1f %9.2f %9s %8.0f %7.0f %9s %10s\n", name,
                              a.ok ? (b.calls_out - a.calls_out) / dt : 0.0,
                              a.ok ? (b.calls_in - a.calls_in) / dt : 0.0, a.ok ? (b.bytes - a.bytes) / dt / 1e6 : 0.0,
                              a.ok ? P99(a, b) : "-", b.running, b.queued,
                              b.ps_clock ? absl::StrFormat("%.0f", *b.ps_clock) : "-", push);
      }
      std::fputs(screen.c_str(), stdout);
      std::fflush(stdout);
    }
    before = std::move(now);
    before_at = at;
    if (iterations >= 0 && i == iterations) break;
    absl::SleepFor(absl::Seconds(interval) - (absl::Now() - at));
  }
  return 0;
}

namespace {

// Writes a command's output file; its exit status (1, naming the path, when it cannot).
int WriteOutput(const char* who, const std::string& path, const std::string& text, const char* hint) {
  std::ofstream file(path, std::ios::binary);
  file << text;
  file.close();
  if (!file) {
    std::fprintf(stderr, "%s: cannot write %s: %s\n", who, path.c_str(), std::strerror(errno));
    return 1;
  }
  std::printf("%s: wrote %s%s\n", who, path.c_str(), hint);
  return 0;
}

}  // namespace

int RunTrace(const std::vector<std::string>& args) {
  if (args.empty()) return Usage("gradwire trace: merge or render?");
  const std::string& what = args[0];
  std::vector<std::string> inputs;
  std::map<std::string, std::string> opts;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].starts_with("-")) {
      if (i + 1 >= args.size()) return Usage(absl::StrCat("gradwire trace: ", args[i], " needs a value"));
      opts[args[i]] = args[i + 1];
      ++i;
    } else {
      inputs.push_back(args[i]);
    }
  }
  if (what == "merge") {
    for (const auto& [k, v] : opts) {
      if (k != "-o") return Usage(absl::StrCat("gradwire trace merge: unknown option '", k, "'"));
    }
    if (inputs.empty()) return Usage("gradwire trace merge: give the trace directory (GRADWIRE_TRACE) or files");
    std::vector<std::string> notes;
    absl::StatusOr<std::string> merged = MergeTraces(inputs, &notes);
    for (const std::string& n : notes) std::fprintf(stderr, "gradwire trace merge: note: %s\n", n.c_str());
    if (!merged.ok()) {
      std::fprintf(stderr, "gradwire trace merge: %s\n", std::string(merged.status().message()).c_str());
      return 1;
    }
    const std::string out = opts.contains("-o") ? opts["-o"] : absl::StrCat(inputs[0], "/merged.trace.json");
    return WriteOutput("gradwire trace merge", out, *merged, " (open it at ui.perfetto.dev)");
  }
  if (what == "render") {
    if (inputs.size() != 1) return Usage("gradwire trace render: give one merged trace");
    RenderOptions o;
    for (const auto& [k, v] : opts) {
      bool ok = true;
      if (k == "--from") {
        ok = absl::SimpleAtod(v, &o.from_ms);
      } else if (k == "--to") {
        ok = absl::SimpleAtod(v, &o.to_ms);
      } else if (k == "--width") {
        ok = absl::SimpleAtoi(v, &o.width_px) && o.width_px >= 400;
      } else if (k == "--title") {
        o.title = v;
      } else if (k != "-o") {
        return Usage(absl::StrCat("gradwire trace render: unknown option '", k, "'"));
      }
      if (!ok) return Usage(absl::StrCat("gradwire trace render: bad value '", v, "' for ", k));
    }
    std::ifstream in(inputs[0], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "gradwire trace render: cannot open %s: %s\n", inputs[0].c_str(), std::strerror(errno));
      return 1;
    }
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<std::string> svg = RenderTrace(text, o);
    if (!svg.ok()) {
      std::fprintf(stderr, "gradwire trace render: %s: %s\n", inputs[0].c_str(),
                   std::string(svg.status().message()).c_str());
      return 1;
    }
    const std::string out = opts.contains("-o") ? opts["-o"] : absl::StrCat(inputs[0], ".svg");
    return WriteOutput("gradwire trace render", out, *svg, "");
  }
  return Usage(absl::StrCat("gradwire trace: unknown subcommand '", what, "' (merge or render)"));
}

}  // namespace gw::worker
