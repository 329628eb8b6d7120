#include "gradwire/serve/model_stats.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gw::serve {

std::string ModelStats::ToString() const {
  return absl::StrFormat(
      "%s@%s %s: %d answered in %d batches (mean %.1f rows, max %d), queue %d (max %d), "
      "latency p50 %.2f ms p90 %.2f ms p99 %.2f ms; refused %d full + %d bad shape, %d expired, %d failed",
      model, worker, version, answered, batches, mean_batch_rows(), max_batch_rows, queue_depth, max_queue_depth,
      p50_ms, p90_ms, p99_ms, refused_full, refused_shape, expired, failed);
}

void AppendSamples(const ModelStats& s, std::vector<rpc::Sample>& out) {
  const std::map<std::string, std::string> labels = {{"model", s.model}, {"worker", s.worker}};
  auto add = [&](const char* name, double value, std::map<std::string, std::string> more = {}) {
    more.insert(labels.begin(), labels.end());
    out.push_back({absl::StrCat("gradwire_serve_", name), std::move(more), value});
  };
  auto count = [](int64_t v) { return static_cast<double>(v); };
  add("requests_total", count(s.requests));
  add("answered_total", count(s.answered));
  add("rows_total", count(s.rows));
  add("batches_total", count(s.batches));
  add("refused_total", count(s.refused_full), {{"reason", "full"}});
  add("refused_total", count(s.refused_shape), {{"reason", "shape"}});
  add("expired_total", count(s.expired));
  add("failed_total", count(s.failed));
  add("queue_depth", count(s.queue_depth));
  add("max_queue_depth", count(s.max_queue_depth));
  add("max_batch_rows", count(s.max_batch_rows));
  add("mean_batch_rows", s.mean_batch_rows());
  add("latency_seconds", s.p50_ms / 1e3, {{"quantile", "0.5"}});
  add("latency_seconds", s.p90_ms / 1e3, {{"quantile", "0.9"}});
  add("latency_seconds", s.p99_ms / 1e3, {{"quantile", "0.99"}});
  add("version_info", 1, {{"version", s.version}});
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
  stats->p50_ms = QuantileOfSorted(sorted, 0.5);
  stats->p90_ms = QuantileOfSorted(sorted, 0.9);
  stats->p99_ms = QuantileOfSorted(sorted, 0.99);
}

double QuantileOfSorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(sorted.size());
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(rank))];
}

}  // namespace gw::serve
