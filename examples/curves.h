// Curves: an example's training curves as TensorBoard event files, written by the worker
// that shows the progress: the loss at every step, samples/s and the time a step takes
// every 20 steps, the training and test accuracy at the end of each epoch (EpochProgress
// writes them). `tensorboard --logdir DIR` shows them. The examples that write them take
// --logdir DIR (logdir_flag.h).
//
// Contract
//   - Open(dir, on, first_step): a writer in `dir` when it is not empty and `on`; an
//     unusable directory is an error naming it (the program stops before it trains).
//     Steps are numbered from first_step (a resumed job's step), one per Advance().
//   - Add(tag, value, step): one scalar. The first write error is printed once on stderr,
//     naming the file, and the curves stop; training goes on.
//   Header-only.
#ifndef GRADWIRE_EXAMPLES_CURVES_H_
#define GRADWIRE_EXAMPLES_CURVES_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "gradwire/data/summary_writer.h"

namespace gw::examples {

class Curves {
 public:
  static absl::StatusOr<Curves> Open(const std::string& dir, bool on, int64_t first_step = 0) {
    Curves curves;
    curves.step_ = first_step;
    if (!on || dir.empty()) return curves;
    absl::StatusOr<std::unique_ptr<data::SummaryWriter>> writer = data::SummaryWriter::Open(dir);
    if (!writer.ok()) return writer.status();
    curves.writer_ = std::shared_ptr<data::SummaryWriter>(std::move(*writer));
    std::printf("training curves: %s\n", curves.writer_->path().c_str());
    return curves;
  }

  bool on() const { return writer_ != nullptr; }
  // The number of the step being trained.
  int64_t step() const { return step_; }
  void Advance() { ++step_; }
  void Add(std::string_view tag, double value, int64_t step) {
    if (!writer_) return;
    if (absl::Status s = writer_->AddScalar(tag, value, step); !s.ok()) {
      std::fprintf(stderr, "the training curves stop here: %s\n", std::string(s.message()).c_str());
      writer_.reset();
    }
  }
  void Flush() {
    if (writer_) (void)writer_->Flush();
  }

 private:
  std::shared_ptr<data::SummaryWriter> writer_;
  int64_t step_ = 0;
};

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_CURVES_H_
