// EpochProgress: the progress line of one epoch in the examples whose trainers each train
// on their share of the data: a bar (on the trainer that shows it) with the mean loss, the
// training accuracy and samples/s over every trainer (this trainer's count times
// `trainers`, since every trainer sees as many), and rows pulled per step when counted.
// Header-only, no flags.
#ifndef GRADWIRE_EXAMPLES_EPOCH_PROGRESS_H_
#define GRADWIRE_EXAMPLES_EPOCH_PROGRESS_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "curves.h"
#include "gradwire/data/progress.h"
#include "gradwire/nn/loss.h"
#include "gradwire/tensor/tensor.h"

namespace gw::examples {

class EpochProgress {
 public:
  // `count_rows`: show rows/step (the rows argument of Step).
  EpochProgress(bool show, int epoch, int epochs, int64_t batches, int trainers, bool count_rows = false)
      : trainers_(trainers), count_rows_(count_rows) {
    if (show) bar_ = std::make_unique<data::ProgressBar>(absl::StrFormat("epoch %d/%d", epoch, epochs), batches);
  }

  // Writes this epoch's curves to `curves` (none when null or off).
  void LogTo(Curves* curves) { curves_ = curves != nullptr && curves->on() ? curves : nullptr; }

  // After a step on this trainer: its loss and logits, the batch's targets, rows pulled.
  void Step(const Tensor& loss, const Tensor& logits, const Tensor& targets, int64_t rows = 0) {
    const int64_t n = targets.size(0);
    const double l = loss.item();
    loss_sum_ += l;
    correct_ += nn::Accuracy(logits, targets) * static_cast<double>(n);
    seen_ += n;
    rows_ += rows;
    ++steps_;
    if (bar_) bar_->Update(steps_, Fields());
    if (curves_ != nullptr) {
      const int64_t step = curves_->step();
      curves_->Advance();
      curves_->Add("train/loss", l, step);
      if (steps_ % kEvery == 0) {
        const auto now = std::chrono::steady_clock::now();
        const double secs = std::chrono::duration<double>(now - last_log_).count();
        curves_->Add("train/samples_per_s", static_cast<double>(trainers_ * (seen_ - seen_at_log_)) / secs, step);
        curves_->Add("train/step_seconds", secs / kEvery, step);
        last_log_ = now;
        seen_at_log_ = seen_;
      }
    }
  }
  void Finish(double test_acc) const {
    if (bar_) bar_->Finish(Fields() + absl::StrFormat(" test_acc=%.4f", test_acc));
    if (curves_ != nullptr) {
      const int64_t step = curves_->step() - 1;  // the epoch's last
      curves_->Add("train/accuracy", correct_ / static_cast<double>(std::max<int64_t>(seen_, 1)), step);
      curves_->Add("test/accuracy", test_acc, step);
      curves_->Flush();
    }
  }

 private:
  std::string Fields() const {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
    return absl::StrFormat("loss=%.4f acc=%.4f%s %.0f samples/s", loss_sum_ / steps,
                           correct_ / static_cast<double>(std::max<int64_t>(seen_, 1)),
                           count_rows_ ? absl::StrFormat(" rows/step=%.0f", static_cast<double>(rows_) / steps) : "",
                           static_cast<double>(trainers_ * seen_) / std::max(secs, 1e-9));
  }

  const int trainers_;
  const bool count_rows_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::unique_ptr<data::ProgressBar> bar_;
  static constexpr int64_t kEvery = 20;
  Curves* curves_ = nullptr;
  int64_t seen_at_log_ = 0;
  std::chrono::steady_clock::time_point last_log_ = start_;
  double loss_sum_ = 0, correct_ = 0;
  int64_t seen_ = 0, steps_ = 0, rows_ = 0;
};

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_EPOCH_PROGRESS_H_
