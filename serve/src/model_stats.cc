#include "gradwire/serve/model_stats.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace gw::serve {

std::string ModelStats::ToString() const {
  return absl::StrFormat(
      "%s@%s %s: %d answered in %d batches (mean %.1f rows, max %d), queue %d (max %d), "
      "latency p50 %.2f ms p90 %.2f ms p99 %.2f ms; refused %d full + %d bad shape, %d expired, %d failed",
      model, worker, version, answered, batches, mean_batch_rows(), max_batch_rows, queue_depth, max_queue_depth,
      p50_ms, p90_ms, p99_ms, refused_full, refused_shape, expired, failed);
}

void LatencyWindow::Add(absl::Duration d) {
  const double ms = absl::ToDoubleMilliseconds(d);
  if (ms_.size() < ModelStats::kLatencyWindow) {
    ms_.push_back(ms);
  } else {
    ms_[next_] = ms;
    next_ = (next_ + 1) % ms_.size();
  }
}

void LatencyWindow::Percentiles(ModelStats* stats) const {
  if (ms_.empty()) return;
  std::vector<double> sorted = ms_;
  std::sort(sorted.begin(), sorted.end());
  const auto at = [&](double q) {
    return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * static_cast<double>(sorted.size())))];
  };
  stats->p50_ms = at(0.5);
  stats->p90_ms = at(0.9);
  stats->p99_ms = at(0.99);
}

}  // namespace gw::serve
