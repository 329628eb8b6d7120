// What every example program shares: how it reports an error and how it prints a
// benchmark result line (the format bench/run reads). Header-only, no flags.
#ifndef GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_
#define GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_

#include <cstdio>
#include <string>

#include "absl/status/status.h"

namespace gw::examples {

// Says what failed and why on stderr; returns exit status 2 (could not set up or run).
inline int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "error: %s: %s\n", what, std::string(s.message()).c_str());
  return 2;
}

// One line "workload=<w> impl=gradwire metric=<m> value=<v> unit=<u>".
inline void ReportLine(const char* workload, const char* metric, double value, const char* unit) {
  std::printf("workload=%s impl=gradwire metric=%s value=%.6g unit=%s\n", workload, metric, value, unit);
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_
