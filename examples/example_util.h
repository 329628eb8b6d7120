// What every example program shares: how it reports an error, how it loads
// Fashion-MNIST, how it measures test accuracy (TestAccuracy: in batches, in eval mode,
// without gradients) and how it prints a benchmark result line (the format bench/run
// reads). Header-only, no flags.
#ifndef GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_
#define GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/data/fashion_mnist.h"
#include "gradwire/nn/loss.h"
#include "gradwire/nn/module.h"

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

// The fraction of `test` that `model` classifies right, `batch` images at a time (a CNN
// on all 10,000 images at once would need gigabytes), in eval mode (dropout off,
// BatchNorm's running statistics) and without gradients; the model's mode is restored.
inline double TestAccuracy(nn::Module& model, const data::Dataset& test, int64_t batch = 1000) {
  const bool was_training = model.is_training();
  model.Eval();
  autograd::NoGradGuard no_grad;
  double correct = 0;
  const int64_t total = test.size();
  const Device device = model.device();  // a GPU trainer's model: its images go there
  for (int64_t begin = 0; begin < total; begin += batch) {
    const int64_t n = std::min(batch, total - begin);
    const Tensor logits = model.Forward(kernels::ToDevice(Narrow(test.images, 0, begin, n), device));
    correct += nn::Accuracy(logits, Narrow(test.labels, 0, begin, n)) * static_cast<double>(n);
  }
  model.Train(was_training);
  return total > 0 ? correct / static_cast<double>(total) : 0.0;
}

// One line "workload=<w> impl=gradwire metric=<m> value=<v> unit=<u>".
inline void ReportLine(const char* workload, const char* metric, double value, const char* unit) {
  std::printf("workload=%s impl=gradwire metric=%s value=%.6g unit=%s\n", workload, metric, value, unit);
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_EXAMPLE_UTIL_H_
