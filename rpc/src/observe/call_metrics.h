// Internal: CallMetrics, what this worker's calls cost, by side (the calls it makes, the
// requests it serves), peer and function: counts, errors, bytes and a latency histogram.
// The agent records every call here; a metrics endpoint (metrics_endpoint.h) and
// Agent::StatisticsOf read them as Statistics samples.
//
// Contract
//   - For(side, peer, function) returns the series of that triple, made on first use; it
//     lives as long as the CallMetrics. Finding one costs a hash of the triple: each
//     thread keeps the series it found last in a small cache of its own, so only a miss
//     takes the table's lock (a shared lock, taken by every thread, would move its cache
//     line between cores on every call). Recording (Series::Record, the byte counters) is
//     lock-free; the agent records each call's side from one thread, the one that
//     completes it, so a series' cache lines stay with that thread.
//   - A series counts a call once: Record(seconds, ok) when it completes (a client's call:
//     reply, error or timeout; a served request: its reply is encoded).
//   - Collect(out, name_of) appends, for each series, with labels {function, peer}
//     (peer = name_of(rank)):
//       gradwire_rpc_{client,server}_calls_total, _errors_total,
//       gradwire_rpc_{client,server}_sent_bytes_total, _received_bytes_total,
//       gradwire_rpc_{client,server}_latency_seconds (a histogram: _bucket{le=...}, _sum,
//       _count, in Prometheus' form). A client's latency is from the call to its result;
//       a server's from the request's arrival to its reply (queueing and the handler).
//   - Functions a peer names that are not registered here are counted under the function
//     "(unknown)", so a peer cannot grow the table without bound.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_SRC_OBSERVE_CALL_METRICS_H_
#define GRADWIRE_RPC_SRC_OBSERVE_CALL_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/frame.h"
#include "gradwire/rpc/statistics.h"

namespace gw::rpc::internal {

// A latency histogram with fixed buckets (upper bounds in seconds, 10 us to 10 s), as
// Prometheus' client libraries keep one: a counter per bucket, the sum and the count.
class LatencyHistogram {
 public:
  static constexpr std::array<double, 19> kBounds = {10e-6,  25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3,
                                                     2.5e-3, 5e-3,  10e-3, 25e-3,  50e-3,  100e-3, 250e-3,
                                                     500e-3, 1.0,   2.5,   5.0,    10.0};
  void Observe(double seconds);
  // name_bucket (cumulative, le="+Inf" last), name_sum, name_count.
  void AppendTo(std::vector<Sample>& out, const std::string& name,
                const std::map<std::string, std::string>& labels) const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1>
      buckets_{};  // the last: above every bound; their sum is the count
  std::atomic<uint64_t> sum_ns_{0};
};

class CallMetrics {
 public:
  enum class Side { kClient, kServer };
  static constexpr std::string_view kUnknownFunction = "(unknown)";

  struct Series {
    // Written by the thread that completes a call (a client's I/O thread, the server's
    // replying thread)...
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<uint64_t> received_bytes{0};
    LatencyHistogram latency;
    // ... and, on its own cache line, by a client's calling threads.
    alignas(64) std::atomic<uint64_t> sent_bytes{0};
    void Record(double seconds, bool ok) {
      calls.fetch_add(1, std::memory_order_relaxed);
      if (!ok) errors.fetch_add(1, std::memory_order_relaxed);
      latency.Observe(seconds);
    }
    void Sent(uint64_t bytes) { sent_bytes.fetch_add(bytes, std::memory_order_relaxed); }
    void Received(uint64_t bytes) { received_bytes.fetch_add(bytes, std::memory_order_relaxed); }
  };

  CallMetrics();
  Series& For(Side side, int peer, std::string_view function);
  void Collect(std::vector<Sample>& out, const std::function<std::string(int rank)>& name_of) const;

 private:
  Series& FindOrAdd(Side side, int peer, std::string_view function);

  struct Key {
    Side side;
    int peer;
    std::string function;
  };
  struct KeyView {
    Side side;
    int peer;
    std::string_view function;
  };
  struct Hash {
    using is_transparent = void;
    size_t operator()(const KeyView& k) const;
    size_t operator()(const Key& k) const { return (*this)(KeyView{k.side, k.peer, k.function}); }
  };
  struct Eq {
    using is_transparent = void;
    static KeyView View(const Key& k) { return {k.side, k.peer, k.function}; }
    static KeyView View(const KeyView& k) { return k; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      const KeyView x = View(a), y = View(b);
      return x.side == y.side && x.peer == y.peer && x.function == y.function;
    }
  };

  // Names this table in the threads' caches: never reused, unlike an address.
  const uint64_t id_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::unique_ptr<Series>, Hash, Eq> series_ ABSL_GUARDED_BY(mu_);
};

// A frame's size as its series count it: the header and the tensors' bytes.
inline uint64_t MessageBytes(const Message& m) {
  uint64_t bytes = m.header.size();
  for (const Tensor& t : m.tensors) bytes += t.nbytes();
  return bytes;
}

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_OBSERVE_CALL_METRICS_H_
