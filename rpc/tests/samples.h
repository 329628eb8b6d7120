// SampleValue: a test's view of Statistics samples (statistics.h).
#ifndef GRADWIRE_RPC_TESTS_SAMPLES_H_
#define GRADWIRE_RPC_TESTS_SAMPLES_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gradwire/rpc/statistics.h"

namespace gw::rpc::testing {

// The value of the first sample named `name` whose labels include `labels`; -1 if none.
inline double SampleValue(const std::vector<Sample>& samples, const std::string& name,
                          const std::map<std::string, std::string>& labels = {}) {
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      match = match && it != s.labels.end() && it->second == v;
    }
    if (match) return s.value;
  }
  return -1;
}

// Waits until `collect()`'s sample `name` with `labels` has `value` (statistics have no
// event of their own: re-read every millisecond, up to `timeout`); the last value read.
inline double AwaitSampleValue(const std::function<std::vector<Sample>()>& collect, const std::string& name,
                               const std::map<std::string, std::string>& labels, double value,
                               absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  double v = SampleValue(collect(), name, labels);
  while (v != value && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    v = SampleValue(collect(), name, labels);
  }
  return v;
}

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_SAMPLES_H_
