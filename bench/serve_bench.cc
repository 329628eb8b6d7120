// Benchmark W13 `serve_mlp` (BENCHMARKS.md): an MLP 784-256-128-10 served on one worker
// (serve::Serving, dynamic batching with the defaults: a batch starts as soon as the
// model is free, up to 64 rows), called by clients in 2 other processes through
// serve::Router, each request one 784-float sample, the reply 10 logits.
//
//   serve_bench [--quick] closed   C = 1, 16, 64 closed-loop clients (C/2 per process;
//                                  C = 1: one), 1 s warm-up, 5 s measured: requests/s,
//                                  p50 and p99 latency (ms)
//   serve_bench [--quick] open     open loop at rising rates (Poisson arrivals, half the
//                                  rate from each process; latency from the scheduled
//                                  send time, so a client falling behind counts): achieved
//                                  requests/s, p50 and p99 per offered rate, and the
//                                  requests refused (a full queue sheds load); stops
//                                  after the first rate whose p99 exceeds 1 s
//
// Process 0 serves and coordinates: it posts each configuration in the store, the two
// client processes (GW_BENCH_ROLE=client, ranks 1 and 2) run it and report their
// latencies with a call to "bench.report".
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bench_util.h"
#include "gradwire/gradwire.h"
#include "gradwire/worker/launcher.h"

namespace {

using gw::Tensor;
using gw::rpc::Agent;
using gw::rpc::AgentOptions;

constexpr int kWorld = 3;  // the server and two client processes

AgentOptions Options(int rank, int port) {
  AgentOptions o;
  o.rank = rank;
  o.world_size = kWorld;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.start_timeout = absl::Seconds(60);
  o.default_timeout = absl::Seconds(120);
  o.shutdown_timeout = absl::Seconds(60);
  return o;
}

std::shared_ptr<gw::nn::Module> Mlp() {
  gw::Generator gen(13);
  return std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{
      std::make_shared<gw::nn::Linear>(784, 256, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(256, 128, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(128, 10, gen)});
}

// One configuration as the store carries it: "closed <clients in this process> <warm-up s>
// <measured s>" or "open <rate from this process> <offset s> <warm-up s> <measured s>".
struct Config {
  bool open = false;
  int clients = 0;
  double rate = 0, offset = 0, warmup = 0, measure = 0;
};

// What one client process measured: latencies (ms) of the requests completed inside the
// measured window, and how many failed.
struct Measured {
  std::vector<double> ms;
  int64_t failed = 0;
};

// Runs one configuration through serve::RunLoad (load_generator.h, which the example uses
// too): an open-loop client starts `offset` seconds late so that the processes' arrivals
// interleave.
Measured Run(const gw::serve::Router& router, const Config& c, const Tensor& x) {
  gw::serve::LoadOptions o;
  o.clients = c.open ? 0 : c.clients;
  o.rate = c.open ? c.rate : 0;
  o.warmup = absl::Seconds(c.warmup);
  o.duration = absl::Seconds(c.measure);
  o.seed = static_cast<uint64_t>(c.offset * 1e9) + 1;
  if (c.open) absl::SleepFor(absl::Seconds(c.offset));
  gw::serve::LoadReport r = gw::serve::RunLoad(router, o, [&x](int64_t) { return x; });
  if (!r.first_error.ok()) std::fprintf(stderr, "serve_bench client: %s\n", r.first_error.ToString().c_str());
  return Measured{std::move(r.latency_ms), r.failed};
}

int Client(int rank, int port) {
  std::shared_ptr<gw::serve::Serving> serving;
  auto agent = Agent::Start(Options(rank, port), [&](Agent& a) -> absl::Status {
    absl::StatusOr<std::shared_ptr<gw::serve::Serving>> s = gw::serve::Serving::Install(a);
    if (s.ok()) serving = *s;
    return s.status();
  });
  if (!agent.ok()) {
    std::fprintf(stderr, "serve_bench client: %s\n", std::string(agent.status().message()).c_str());
    return 1;
  }
  if (!(*agent)->store().Get("bench/serving", absl::Seconds(60)).ok()) return 1;
  absl::StatusOr<gw::serve::Router> router = gw::serve::Router::Create(serving, "mlp");
  if (!router.ok()) return 1;
  gw::Generator gen(static_cast<uint64_t>(rank));
  const Tensor x = Tensor::Randn({1, 784}, gen);
  for (int i = 0;; ++i) {
    absl::StatusOr<std::string> spec =
        (*agent)->store().Get(absl::StrCat("bench/config/", i, "/", rank), absl::Seconds(600));
    if (!spec.ok() || *spec == "end") break;
    const std::vector<std::string> f = absl::StrSplit(*spec, ' ');
    Config c;
    c.open = f[0] == "open";
    if (c.open) {
      (void)(absl::SimpleAtod(f[1], &c.rate) && absl::SimpleAtod(f[2], &c.offset) &&
             absl::SimpleAtod(f[3], &c.warmup) && absl::SimpleAtod(f[4], &c.measure));
    } else {
      (void)(absl::SimpleAtoi(f[1], &c.clients) && absl::SimpleAtod(f[2], &c.warmup) &&
             absl::SimpleAtod(f[3], &c.measure));
    }
    Measured m;
    if (c.open ? c.rate > 0 : c.clients > 0) m = Run(*router, c, x);
    Tensor ms = Tensor::FromVector(m.ms, {static_cast<int64_t>(m.ms.size())});
    if (absl::StatusOr<bool> r = (*agent)->Sync<bool>("worker0", "bench.report", int64_t{i}, ms, m.failed); !r.ok()) {
      std::fprintf(stderr, "serve_bench client: %s\n", r.status().ToString().c_str());
      return 1;
    }
  }
  return (*agent)->Shutdown().ok() ? 0 : 1;
}

// The server's side of the reports: each configuration's latencies from both clients.
struct Reports {
  absl::Mutex mu;
  std::map<int64_t, std::vector<Measured>> by_config;
  bool Add(int64_t config, const Tensor& ms, int64_t failed) {
    absl::MutexLock lock(&mu);
    by_config[config].push_back(Measured{ms.ToVector<double>(), failed});
    return true;
  }
  Measured Await(int64_t config) {
    absl::MutexLock lock(&mu);
    auto both = [&] { return by_config[config].size() == 2; };
    mu.Await(absl::Condition(&both));
    Measured all;
    for (const Measured& m : by_config[config]) {
      all.ms.insert(all.ms.end(), m.ms.begin(), m.ms.end());
      all.failed += m.failed;
    }
    return all;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_BENCH_ROLE")) {
    int port = 0, rank = 0;
    if (std::strcmp(role, "client") != 0 || !absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port) ||
        !absl::SimpleAtoi(std::getenv("GW_BENCH_RANK"), &rank)) {
      return 2;
    }
    return Client(rank, port);
  }
  bool quick = false;
  std::string mode;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      mode = argv[i];
    }
  }
  if (mode != "closed" && mode != "open") {
    std::fprintf(stderr, "usage: serve_bench [--quick] closed|open\n");
    return 2;
  }
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", std::string(port.status().message()).c_str());
    return 1;
  }
  std::vector<pid_t> children;
  for (int rank : {1, 2}) {
    children.push_back(gw::bench::SpawnSelf(
        {{"GW_BENCH_ROLE", "client"}, {"GW_BENCH_PORT", std::to_string(*port)}, {"GW_BENCH_RANK", std::to_string(rank)}}));
  }
  Reports reports;
  std::shared_ptr<gw::serve::Serving> serving;
  auto agent = Agent::Start(Options(0, *port), [&](Agent& a) -> absl::Status {
    absl::StatusOr<std::shared_ptr<gw::serve::Serving>> s = gw::serve::Serving::Install(a);
    if (s.ok()) serving = *s;
    if (!s.ok()) return s.status();
    return a.Register("bench.report", [&](int64_t config, Tensor ms, int64_t failed) {
      return reports.Add(config, ms, failed);
    });
  });
  if (!agent.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", std::string(agent.status().message()).c_str());
    for (pid_t c : children) ::kill(c, SIGKILL);
    return 1;
  }
  const gw::serve::ModelConfig config{.name = "mlp", .input_shape = {784}, .batching = {.max_batch_size = 64, .max_queue = 4096}};
  if (absl::Status s = serving->Serve(config, Mlp(), "v1"); !s.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  (void)(*agent)->store().Set("bench/serving", "1");
  const double warmup = quick ? 0.3 : 1.0, measure = quick ? 1.0 : 5.0;
  int64_t index = 0;
  // Posts one configuration to both clients and reports what they measured.
  auto run = [&](const std::string& spec1, const std::string& spec2, double window_s, const std::string& suffix) {
    (void)(*agent)->store().Set(absl::StrCat("bench/config/", index, "/1"), spec1);
    (void)(*agent)->store().Set(absl::StrCat("bench/config/", index, "/2"), spec2);
    const gw::serve::ModelStats before = *serving->Stats("mlp");
    Measured m = reports.Await(index++);
    const gw::serve::ModelStats after = *serving->Stats("mlp");
    const double rps = static_cast<double>(m.ms.size()) / window_s;
    gw::bench::Report("serve_mlp", absl::StrCat(suffix.rfind("_r", 0) == 0 ? "open_rps" : "rps", suffix), rps, "req/s");
    gw::bench::Report("serve_mlp", absl::StrCat(suffix.rfind("_r", 0) == 0 ? "open_p50_ms" : "p50_ms", suffix),
                      gw::bench::Quantile(m.ms, 0.5), "ms");
    gw::bench::Report("serve_mlp", absl::StrCat(suffix.rfind("_r", 0) == 0 ? "open_p99_ms" : "p99_ms", suffix),
                      gw::bench::Quantile(m.ms, 0.99), "ms");
    if (suffix.rfind("_r", 0) == 0) {
      gw::bench::Report("serve_mlp", absl::StrCat("open_failed", suffix), static_cast<double>(m.failed), "requests");
    }
    const double batches = static_cast<double>(after.batches - before.batches);
    const double mean_batch = batches == 0 ? 0 : static_cast<double>(after.rows - before.rows) / batches;
    std::fprintf(stderr, "serve_mlp: gradwire %s: %.0f req/s, p50 %.3f ms, p99 %.3f ms, %lld failed, mean batch %.1f rows\n",
                 suffix.c_str() + 1, rps, gw::bench::Quantile(m.ms, 0.5), gw::bench::Quantile(m.ms, 0.99),
                 static_cast<long long>(m.failed), mean_batch);
    return gw::bench::Quantile(m.ms, 0.99);
  };
  if (mode == "closed") {
    for (int clients : {1, 16, 64}) {
      const int first = (clients + 1) / 2, second = clients / 2;
      std::fprintf(stderr, "serve_mlp: gradwire, C = %d closed-loop clients (%d + %d), %.1f s warm-up + %.1f s\n",
                   clients, first, second, warmup, measure);
      run(absl::StrCat("closed ", first, " ", warmup, " ", measure), absl::StrCat("closed ", second, " ", warmup, " ", measure),
          measure, absl::StrCat("_c", clients));
    }
  } else {
    const std::vector<int> rates = quick ? std::vector<int>{1000, 8000}
                                         : std::vector<int>{250, 500, 1000, 2000, 4000, 8000, 16000, 32000, 64000};
    const double open_measure = quick ? 0.5 : 2.0;
    for (int rate : rates) {
      std::fprintf(stderr, "serve_mlp: gradwire, open loop at %d req/s, %.1f s warm-up + %.1f s\n", rate, warmup, open_measure);
      const double half = rate / 2.0, offset = 0.5 / rate;
      const double p99 = run(absl::StrCat("open ", half, " 0 ", warmup, " ", open_measure),
                             absl::StrCat("open ", half, " ", offset, " ", warmup, " ", open_measure), open_measure,
                             absl::StrCat("_r", rate));
      if (p99 > 1000) break;
    }
  }
  for (int64_t i : {1, 2}) (void)(*agent)->store().Set(absl::StrCat("bench/config/", index, "/", i), "end");
  const bool ok = (*agent)->Shutdown(true).ok();
  bool children_ok = true;
  for (pid_t c : children) {
    int status = 0;
    ::waitpid(c, &status, 0);
    children_ok = children_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok && children_ok ? 0 : 1;
}
