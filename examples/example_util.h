// What every example program shares: how it reports an error, how it loads
// Fashion-MNIST, and how it prints a benchmark result line (the format bench/run reads).
// Header-only, no flags.
#ifndef GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_
#define GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_

#include <chrono>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradwire/data/fashion_mnist.h"

namespace gw::examples {

// Says what failed and why on stderr; returns exit status 2 (could not set up or run).
inline int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "error: %s: %s\n", what, std::string(s.message()).c_str());
  return 2;
}

// Both splits of Fashion-MNIST from `dir`. With `show` (the worker that shows progress)
// it says what it loads and how long that took: a process's first progress bar comes only
// after it (about a second each, several when the workers of a job load at once).
struct FashionMnist {
  data::Dataset train, test;
};
inline absl::StatusOr<FashionMnist> LoadFashionMnist(const std::string& dir, bool show) {
  const auto start = std::chrono::steady_clock::now();
  if (show) {
    std::printf("loading Fashion-MNIST from %s\n", dir.c_str());
    std::fflush(stdout);
  }
  absl::StatusOr<data::Dataset> train = data::LoadFashionMnist(data::Split::kTrain, dir);
  if (!train.ok()) return train.status();
  absl::StatusOr<data::Dataset> test = data::LoadFashionMnist(data::Split::kTest, dir);
  if (!test.ok()) return test.status();
  if (show) {
    std::printf("loaded %lld training and %lld test images in %.1f s\n", static_cast<long long>(train->size()),
                static_cast<long long>(test->size()),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
  }
  return FashionMnist{*std::move(train), *std::move(test)};
}

// One line "workload=<w> impl=gradwire metric=<m> value=<v> unit=<u>".
inline void ReportLine(const char* workload, const char* metric, double value, const char* unit) {
  std::printf("workload=%s impl=gradwire metric=%s value=%.6g unit=%s\n", workload, metric, value, unit);
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_
