// Helpers of the serve tests: the W13 model and a request's outcome to wait on.
#ifndef GRADWIRE_SERVE_TESTS_SERVE_TESTING_H_
#define GRADWIRE_SERVE_TESTS_SERVE_TESTING_H_

#include <cstring>
#include <memory>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gradwire/nn/layers.h"
#include "gradwire/serve/batcher.h"
#include "gradwire/tensor/kernels.h"

namespace gw::serve::testing {

// W13's model: an MLP 784-256-128-10 with ReLUs, seeded.
inline std::shared_ptr<nn::Module> Mlp(uint64_t seed, DType dtype = DType::kFloat32) {
  Generator gen(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(784, 256, gen, true, dtype), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(256, 128, gen, true, dtype), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 10, gen, true, dtype)});
}

// Whether two float32 tensors hold the same bits.
inline bool BitEqual(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor ca = kernels::Contiguous(a), cb = kernels::Contiguous(b);
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// One request's answer: Done() is the callback, Wait() its result (bounded).
class Outcome {
 public:
  Batcher::Done Done() {
    return [this](absl::StatusOr<Prediction> r) {
      {
        absl::MutexLock lock(&mu_);
        result_ = std::move(r);
      }
      done_.Notify();
    };
  }
  const absl::StatusOr<Prediction>& Wait() {
    if (!done_.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      absl::MutexLock lock(&mu_);
      if (!result_) result_ = absl::DeadlineExceededError("test: no answer within 30 s");
    }
    absl::MutexLock lock(&mu_);
    return *result_;
  }
  bool answered() const { return done_.HasBeenNotified(); }

 private:
  absl::Mutex mu_;
  std::optional<absl::StatusOr<Prediction>> result_;
  absl::Notification done_;
};

}  // namespace gw::serve::testing

#endif  // GRADWIRE_SERVE_TESTS_SERVE_TESTING_H_
