// RunLoad: a load generator for a served model, closed or open loop, measuring what a
// client sees (sent to answered) with a progress report; used by examples/
// serve_fashion_mnist and bench/serve_bench (W13).
//
// Contract
//   - Closed loop (options.clients > 0): that many clients, each sending its next
//     request when its previous one is answered. A client whose request fails stops (it
//     never spins on errors). Open loop (options.rate > 0): requests at that rate with
//     Poisson arrivals (exponential gaps, options.seed), whatever the answers; latency is
//     measured from when a request was due, so a generator that falls behind counts its
//     own lateness; at most options.max_outstanding in flight (then it waits).
//   - Requests are sent until options.warmup + options.duration has passed, or
//     options.requests were sent (whichever comes first; a zero duration means no time
//     limit, and then requests must be set). Request i (0, 1, ...) is input(i); every
//     answer goes to on_answer(i, prediction) (on the completing thread; optional).
//   - The report counts every request sent: answered or failed (the first error kept).
//     Latencies (ms) are those of requests answered within the measured window (after
//     the warm-up); throughput is answered requests in the window per second.
//   - options.progress, if set, is called every options.progress_every on the calling
//     thread with the window so far (requests, throughput and latency percentiles of the
//     requests answered since the previous call).
//   - Blocks until every request sent was answered or failed (the router's own timeout
//     bounds that). The router must outlive the call.
#ifndef GRADWIRE_SERVE_LOAD_GENERATOR_H_
#define GRADWIRE_SERVE_LOAD_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gradwire/serve/router.h"

namespace gw::serve {

struct LoadProgress {
  double seconds = 0;       // since the start, warm-up included
  int64_t sent = 0, answered = 0, failed = 0;
  double recent_rps = 0;    // answers per second since the previous report
  double recent_p50_ms = 0, recent_p90_ms = 0, recent_p99_ms = 0;
  bool warming_up = false;
  std::string ToString() const;  // one line for a progress display
};

struct LoadOptions {
  int clients = 0;                                 // closed loop
  double rate = 0;                                 // or open loop, requests/s
  absl::Duration warmup = absl::ZeroDuration();
  absl::Duration duration = absl::Seconds(10);     // measured (0: until `requests` were sent)
  int64_t requests = 0;                            // at most this many (0: no limit)
  int max_outstanding = 4096;                      // open loop
  uint64_t seed = 1;                               // open loop arrivals
  absl::Duration progress_every = absl::Milliseconds(500);
  std::function<void(const LoadProgress&)> progress = {};
};

struct LoadReport {
  int64_t sent = 0, answered = 0, failed = 0;
  absl::Status first_error = absl::OkStatus();
  std::vector<double> latency_ms;   // answered in the measured window, in completion order
  double measured_seconds = 0;      // the window's length as it happened
  double throughput() const;        // latency_ms.size() / measured_seconds
  double Percentile(double q) const;  // of latency_ms, q in [0, 1]; 0 when empty
  std::string ToString() const;     // "12,345 requests/s, p50 0.41 ms, p90 ..., p99 ..., 0 failed"
};

LoadReport RunLoad(const Router& router, const LoadOptions& options, const std::function<Tensor(int64_t)>& input,
                   const std::function<void(int64_t, const Prediction&)>& on_answer = {});

}  // namespace gw::serve

#endif  // GRADWIRE_SERVE_LOAD_GENERATOR_H_
