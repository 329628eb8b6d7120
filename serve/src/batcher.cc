#include "gradwire/serve/batcher.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/tensor/kernels.h"

namespace gw::serve {

Batcher::Batcher(std::string model, std::string worker, Shape sample_shape, DType dtype, BatchingOptions options,
                 Compute compute)
    : model_(std::move(model)),
      worker_(std::move(worker)),
      label_(absl::StrCat("model '", model_, "' on ", worker_)),
      sample_shape_(std::move(sample_shape)),
      dtype_(dtype),
      options_(options),
      compute_(std::move(compute)) {
  stats_.model = model_;
  stats_.worker = worker_;
  thread_ = std::thread([this] { Run(); });
}

Batcher::~Batcher() { Drain(); }

std::string Batcher::expected_input() const {
  std::string dims = "[N";
  for (int64_t d : sample_shape_) absl::StrAppend(&dims, ", ", d);
  return absl::StrCat(dims, "] ", DTypeName(dtype_));
}

void Batcher::Submit(Tensor input, absl::Time deadline, Done done) {
  const bool shape_ok = input.defined() && input.dtype() == dtype_ &&
                        input.dim() == static_cast<int64_t>(sample_shape_.size()) + 1 && input.sizes()[0] >= 1 &&
                        std::equal(sample_shape_.begin(), sample_shape_.end(), input.sizes().begin() + 1);
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (!shape_ok) {
      ++stats_.refused_shape;
      refused = absl::InvalidArgumentError(absl::StrCat(
          label_, ": expects input ", expected_input(), ", got ",
          input.defined() ? absl::StrCat(ShapeToString(input.sizes()), " ", DTypeName(input.dtype())) : "no tensor"));
    } else if (draining_) {
      refused = absl::UnavailableError(absl::StrCat(label_, " is draining (shutting down or withdrawn): ask another replica"));
    } else if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) {
      ++stats_.refused_full;
      refused = absl::ResourceExhaustedError(absl::StrCat(label_, ": the queue is full (", options_.max_queue,
                                                          " requests); retry later or add replicas"));
    } else {
      const int64_t rows = input.sizes()[0];
      const absl::Time now = absl::Now();
      queue_.push_back(Request{std::move(input), rows, deadline, now, std::move(done)});
      queued_rows_ += rows;
      ++stats_.requests;
      stats_.queue_depth = static_cast<int64_t>(queue_.size());
      stats_.max_queue_depth = std::max(stats_.max_queue_depth, stats_.queue_depth);
      return;
    }
  }
  done(refused);
}

void Batcher::Drain() {
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  absl::MutexLock join(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

ModelStats Batcher::stats() const {
  absl::MutexLock lock(&mu_);
  ModelStats s = stats_;
  s.version = version_;
  latency_.Percentiles(&s);
  return s;
}

std::deque<Batcher::Request> Batcher::TakeBatch() {
  absl::MutexLock lock(&mu_);
  const auto has_work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || draining_; };
  mu_.Await(absl::Condition(&has_work));
  if (queue_.empty()) return {};  // draining and nothing left
  if (options_.max_wait > absl::ZeroDuration() && !draining_) {
    const absl::Time close = queue_.front().queued + options_.max_wait;
    const auto full = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return queued_rows_ >= options_.max_batch_size || draining_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&full), close);
  }
  std::deque<Request> batch;
  int64_t rows = 0;
  while (!queue_.empty() && (batch.empty() || rows + queue_.front().rows <= options_.max_batch_size)) {
    rows += queue_.front().rows;
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  queued_rows_ -= rows;
  stats_.queue_depth = static_cast<int64_t>(queue_.size());
  return batch;
}

void Batcher::Run() {
  for (;;) {
    std::deque<Request> batch = TakeBatch();
    if (batch.empty()) return;
    ComputeBatch(std::move(batch));
  }
}

void Batcher::ComputeBatch(std::deque<Request> batch) {
  // Requests whose deadline passed are answered without being computed.
  const absl::Time start = absl::Now();
  std::vector<Request> live;
  live.reserve(batch.size());
  int64_t expired = 0;
  for (Request& r : batch) {
    if (r.deadline <= start) {
      ++expired;
      r.done(absl::DeadlineExceededError(absl::StrCat(label_, ": the request's deadline passed after ",
                                                      absl::FormatDuration(start - r.queued), " in the queue")));
    } else {
      live.push_back(std::move(r));
    }
  }
  if (expired > 0) {
    absl::MutexLock lock(&mu_);
    stats_.expired += expired;
  }
  if (live.empty()) return;
  Tensor input = live.front().input;
  int64_t rows = live.front().rows;
  if (live.size() > 1) {
    std::vector<Tensor> parts;
    parts.reserve(live.size());
    for (const Request& r : live) parts.push_back(r.input);
    input = kernels::Cat(parts, 0);
    rows = input.sizes()[0];
  }
  absl::StatusOr<Prediction> out = rpc::CatchExceptions("the model", [&] { return compute_(input); });
  if (out.ok() && (!out->output.defined() || out->output.dim() < 1 || out->output.sizes()[0] != rows)) {
    out = absl::InternalError(absl::StrCat(
        "the model's output ", out->output.defined() ? ShapeToString(out->output.sizes()) : "(none)",
        " does not have one row per input row (", rows, ")"));
  }
  if (!out.ok()) {
    {
      absl::MutexLock lock(&mu_);
      stats_.failed += static_cast<int64_t>(live.size());
      ++stats_.batches;
    }
    const absl::Status error(out.status().code(), absl::StrCat(label_, ": ", out.status().message()));
    for (Request& r : live) r.done(error);
    return;
  }
  // Counted before the answers go out, so a client that has its answer sees it counted.
  const absl::Time end = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    for (const Request& r : live) latency_.Add(end - r.queued);
    stats_.answered += static_cast<int64_t>(live.size());
    stats_.rows += rows;
    ++stats_.batches;
    stats_.max_batch_rows = std::max(stats_.max_batch_rows, rows);
    version_ = out->version;
  }
  int64_t offset = 0;
  for (Request& r : live) {
    r.done(Prediction{kernels::Narrow(out->output, 0, offset, r.rows), out->version, {}});
    offset += r.rows;
  }
}

}  // namespace gw::serve
