// ModelStats: what one served model on one worker has done, for operators and tests.
//
// Contract
//   - Counters are totals since the model started serving on this worker (a version swap
//     keeps them); every request the batcher accepted ends in exactly one of answered,
//     expired, failed or (at a drain that could not compute it) failed.
//   - Latency percentiles are server-side (queued to answered) over the most recent
//     kLatencyWindow answered requests, in milliseconds; 0 before the first answer.
//   - It travels as a record (message.h), so any worker or the inference endpoint can
//     read a replica's statistics (Serving::Stats, Router::Stats).
//   - AppendSamples(stats, out) gives them as the agent's statistics (rpc/statistics.h),
//     labelled by model and worker: gradwire_serve_requests_total, _answered_total,
//     _rows_total, _batches_total, _refused_total{reason="full"|"shape"},
//     _expired_total, _failed_total, _queue_depth, _max_queue_depth, _max_batch_rows,
//     _mean_batch_rows, _latency_seconds{quantile="0.5"|"0.9"|"0.99"} and
//     _version_info{version} (1). Serving adds them for every model it serves.
#ifndef GRADWIRE_SERVE_MODEL_STATS_H_
#define GRADWIRE_SERVE_MODEL_STATS_H_

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/statistics.h"

namespace gw::serve {

struct ModelStats {
  static constexpr int kLatencyWindow = 4096;

  std::string model;
  std::string worker;
  std::string version;
  int64_t requests = 0;        // accepted into the queue
  int64_t answered = 0;        // computed and answered
  int64_t rows = 0;            // rows computed
  int64_t batches = 0;         // model calls
  int64_t max_batch_rows = 0;
  int64_t refused_full = 0;    // RESOURCE_EXHAUSTED: the queue was full
  int64_t refused_shape = 0;   // INVALID_ARGUMENT: wrong shape or dtype
  int64_t expired = 0;         // DEADLINE_EXCEEDED before being computed
  int64_t failed = 0;          // the model's own error, or drained without computing
  int64_t queue_depth = 0;     // requests queued now
  int64_t max_queue_depth = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0;

  double mean_batch_rows() const { return batches == 0 ? 0.0 : static_cast<double>(rows) / static_cast<double>(batches); }
  // One line: "mnist@worker1 v2: 1200 answered in 80 batches (mean 15.0 rows, max 64), ...".
  std::string ToString() const;

  static constexpr auto Fields() {
    using S = ModelStats;
    return std::make_tuple(
        rpc::Field("model", &S::model), rpc::Field("worker", &S::worker), rpc::Field("version", &S::version),
        rpc::Field("requests", &S::requests), rpc::Field("answered", &S::answered), rpc::Field("rows", &S::rows),
        rpc::Field("batches", &S::batches), rpc::Field("max_batch_rows", &S::max_batch_rows),
        rpc::Field("refused_full", &S::refused_full), rpc::Field("refused_shape", &S::refused_shape),
        rpc::Field("expired", &S::expired), rpc::Field("failed", &S::failed),
        rpc::Field("queue_depth", &S::queue_depth), rpc::Field("max_queue_depth", &S::max_queue_depth),
        rpc::Field("p50_ms", &S::p50_ms), rpc::Field("p90_ms", &S::p90_ms), rpc::Field("p99_ms", &S::p99_ms));
  }
};

void AppendSamples(const ModelStats& stats, std::vector<rpc::Sample>& out);

// The q-quantile (q in [0, 1]) of `sorted` (ascending) by the nearest-rank rule; 0 when
// empty. The one rule behind every latency percentile of serve/ (LatencyWindow, RunLoad).
double QuantileOfSorted(const std::vector<double>& sorted, double q);

// The latencies of the most recent answered requests (a ring), and their percentiles.
class LatencyWindow {
 public:
  void Add(absl::Duration d);
  // Fills p50/p90/p99 of `stats` from the window.
  void Percentiles(ModelStats* stats) const;

 private:
  std::vector<double> ms_;
  size_t next_ = 0;
};

}  // namespace gw::serve

#endif  // GRADWIRE_SERVE_MODEL_STATS_H_
