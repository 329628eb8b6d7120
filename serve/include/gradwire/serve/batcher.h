// Batcher: the dynamic batching queue in front of one served model.
//
// Contract
//   - Submit(input, deadline, done) queues a request of `rows` samples (input is
//     [rows, *sample_shape] of the model's dtype, rows >= 1) and returns at once; done is
//     called exactly once with the request's rows of the output (Prediction) or an error:
//       INVALID_ARGUMENT    the input's shape or dtype is not [N, *sample_shape] of the
//                           model's dtype (the message names the expected shape); at once.
//       RESOURCE_EXHAUSTED  max_queue requests are already queued; at once, so memory
//                           stays bounded by max_queue requests.
//       UNAVAILABLE         the batcher is draining (Drain) and takes nothing new; at once.
//       DEADLINE_EXCEEDED   the deadline passed before the request's batch started; the
//                           request is not computed.
//       the model's error   when the batch's computation failed (every request of it).
//   - Batches: a dedicated thread takes queued requests in arrival order, up to
//     max_batch_size rows (a request is never split; a larger request runs alone), and
//     runs Compute once on their rows concatenated. When max_wait is zero (the default)
//     a batch starts the moment the model is free: a lone request pays no wait, and under
//     load the requests that arrived during one batch make the next. With max_wait > 0 a
//     batch that is not full waits for more requests until its first request has waited
//     max_wait (the classic batching window, for models whose fixed cost per call
//     dominates).
//   - Compute returns the output ([total rows, ...], same first dimension) and the
//     version that computed it; every request of the batch gets that version. Output
//     rows are views of the batch's output.
//   - done runs on the batcher's thread (or inline in Submit for the immediate refusals):
//     it must be quick and must not block.
//   - Drain() refuses new requests, answers every queued one (computing them), then stops
//     the thread; the destructor drains. REQUIRES: not called from `done` or Compute.
//     stats() is a snapshot. Thread-safe.
#ifndef GRADWIRE_SERVE_BATCHER_H_
#define GRADWIRE_SERVE_BATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/serve/model_stats.h"
#include "gradwire/serve/prediction.h"
#include "gradwire/tensor/tensor.h"

namespace gw::serve {

struct BatchingOptions {
  int64_t max_batch_size = 64;                     // rows per model call
  absl::Duration max_wait = absl::ZeroDuration();  // 0: start a batch as soon as the model is free
  int64_t max_queue = 1024;                        // queued requests
};

class Batcher {
 public:
  using Compute = std::function<absl::StatusOr<Prediction>(const Tensor& batch)>;
  using Done = std::function<void(absl::StatusOr<Prediction>)>;

  // Errors name the model and the worker ("model 'mnist' on worker1: ...").
  Batcher(std::string model, std::string worker, Shape sample_shape, DType dtype, BatchingOptions options,
          Compute compute);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  void Submit(Tensor input, absl::Time deadline, Done done);
  void Drain();
  ModelStats stats() const;
  // "[N, 784] float32": what Submit accepts.
  std::string expected_input() const;

 private:
  struct Request {
    Tensor input;
    int64_t rows;
    absl::Time deadline;
    absl::Time queued;
    Done done;
  };
  void Run();
  // The next batch's requests (empty once drained and stopped).
  std::deque<Request> TakeBatch();
  void ComputeBatch(std::deque<Request> batch);

  const std::string model_, worker_, label_;
  const Shape sample_shape_;
  const DType dtype_;
  const BatchingOptions options_;
  const Compute compute_;

  mutable absl::Mutex mu_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_rows_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  ModelStats stats_ ABSL_GUARDED_BY(mu_);
  LatencyWindow latency_ ABSL_GUARDED_BY(mu_);
  std::string version_ ABSL_GUARDED_BY(mu_);
  absl::Mutex join_mu_;  // one Drain joins the thread
  std::thread thread_;
};

}  // namespace gw::serve

#endif  // GRADWIRE_SERVE_BATCHER_H_
