// Statistics: what a worker counts, as named samples: the agent's own and those of the
// layers on it (serving, ...), read in this process (Agent::statistics().Collect()), by
// any other worker (Agent::StatisticsOf), and by a metrics endpoint.
//
// Contract
//   - A Sample is a name in Prometheus's style (snake case, prefixed "gradwire_", counters
//     ending in _total, units as suffixes: _seconds, _bytes), labels ({"model": "mnist"})
//     and a value. It travels as a record (message.h).
//   - Statistics is a registry of sources (sources.h): Add(name, collect) adds one, whose
//     collect(out) appends its samples (quick, never blocking; its handle keeps it), and
//     Collect() runs them all, in the order they were added. ToText(samples) writes them in Prometheus's text format,
//     one per line
//     ("name{label="value",...} value"), labels sorted, for logs and scrapers.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_STATISTICS_H_
#define GRADWIRE_RPC_STATISTICS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/sources.h"

namespace gw::rpc {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels = {};
  double value = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("name", &Sample::name), Field("labels", &Sample::labels),
                           Field("value", &Sample::value));
  }
};

std::string ToText(const std::vector<Sample>& samples);

class Statistics : public Sources<Sample> {};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_STATISTICS_H_
