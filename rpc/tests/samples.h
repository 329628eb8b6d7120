// SampleValue: a test's view of Statistics samples (statistics.h).
#ifndef GRADWIRE_RPC_TESTS_SAMPLES_H_
#define GRADWIRE_RPC_TESTS_SAMPLES_H_

#include <map>
#include <string>
#include <vector>

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

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_SAMPLES_H_
