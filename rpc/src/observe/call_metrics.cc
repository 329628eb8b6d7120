#include "observe/call_metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/hash/hash.h"
#include "absl/strings/str_format.h"

namespace gw::rpc::internal {

void LatencyHistogram::Observe(double seconds) {
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin());
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  const double ns = std::max(0.0, seconds) * 1e9;
  sum_ns_.fetch_add(static_cast<uint64_t>(std::llround(ns)), std::memory_order_relaxed);
}

void LatencyHistogram::AppendTo(std::vector<Sample>& out, const std::string& name,
                                const std::map<std::string, std::string>& labels) const {
  // Read the buckets first: a count read after them is at least their sum, as
  // Prometheus expects (+Inf's bucket equals _count).
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    std::map<std::string, std::string> l = labels;
    l["le"] = i < kBounds.size() ? absl::StrFormat("%g", kBounds[i]) : "+Inf";
    out.push_back({name + "_bucket", std::move(l), static_cast<double>(cumulative)});
  }
  out.push_back({name + "_sum", labels, static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9});
  out.push_back({name + "_count", labels, static_cast<double>(cumulative)});
}

size_t CallMetrics::Hash::operator()(const KeyView& k) const {
  return absl::HashOf(static_cast<int>(k.side), k.peer, k.function);
}

namespace {
std::atomic<uint64_t> next_table_id{1};
}  // namespace

CallMetrics::CallMetrics() : id_(next_table_id.fetch_add(1, std::memory_order_relaxed)) {}

CallMetrics::Series& CallMetrics::For(Side side, int peer, std::string_view function) {
  struct Cached {
    uint64_t table = 0;  // 0: empty
    size_t hash = 0;
    Side side = Side::kClient;
    int peer = 0;
    std::string function;
    Series* series = nullptr;
  };
  thread_local std::array<Cached, 32> cache;
  const size_t hash = Hash{}(KeyView{side, peer, function});
  Cached& c = cache[hash % cache.size()];
  if (c.table == id_ && c.hash == hash && c.side == side && c.peer == peer && c.function == function) {
    return *c.series;
  }
  Series& series = FindOrAdd(side, peer, function);
  c.table = id_;
  c.hash = hash;
  c.side = side;
  c.peer = peer;
  c.function.assign(function);
  c.series = &series;
  return series;
}

CallMetrics::Series& CallMetrics::FindOrAdd(Side side, int peer, std::string_view function) {
  const KeyView key{side, peer, function};
  {
    absl::ReaderMutexLock lock(&mu_);
    if (auto it = series_.find(key); it != series_.end()) return *it->second;
  }
  absl::MutexLock lock(&mu_);
  auto [it, added] = series_.try_emplace(Key{side, peer, std::string(function)}, nullptr);
  if (added) it->second = std::make_unique<Series>();
  return *it->second;
}

void CallMetrics::Collect(std::vector<Sample>& out, const std::function<std::string(int)>& name_of) const {
  struct Row {
    Side side;
    int peer;
    std::string function;
    const Series* series;
  };
  std::vector<Row> rows;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [key, series] : series_) rows.push_back({key.side, key.peer, key.function, series.get()});
  }
  // A stable order: by side, function, peer.
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.side, a.function, a.peer) < std::tie(b.side, b.function, b.peer);
  });
  for (const Row& r : rows) {
    const std::string prefix = r.side == Side::kClient ? "gradwire_rpc_client_" : "gradwire_rpc_server_";
    const std::map<std::string, std::string> labels = {{"function", r.function}, {"peer", name_of(r.peer)}};
    auto add = [&](const char* name, const std::atomic<uint64_t>& v) {
      out.push_back({prefix + name, labels, static_cast<double>(v.load(std::memory_order_relaxed))});
    };
    add("calls_total", r.series->calls);
    add("errors_total", r.series->errors);
    add("sent_bytes_total", r.series->sent_bytes);
    add("received_bytes_total", r.series->received_bytes);
    r.series->latency.AppendTo(out, prefix + "latency_seconds", labels);
  }
}

}  // namespace gw::rpc::internal
