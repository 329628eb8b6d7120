#include "gradwire/serve/load_generator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gradwire/serve/model_stats.h"

namespace gw::serve {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What the clients share: the window, the counts and the latencies.
struct Run : std::enable_shared_from_this<Run> {
  const Router* router = nullptr;
  const std::function<Tensor(int64_t)>* input = nullptr;
  const std::function<void(int64_t, const Prediction&)>* on_answer = nullptr;
  double start = 0, from = 0, to = 0;  // seconds; `to` infinite without a duration
  int64_t limit = 0;                   // requests (max when unlimited)
  std::atomic<int64_t> next{0};        // the next request's index
  std::atomic<int64_t> sent{0};
  std::atomic<int64_t> outstanding{0};
  std::atomic<int> chains{0};          // closed loop: clients still sending
  absl::Notification chains_done;

  absl::Mutex mu;
  LoadReport report ABSL_GUARDED_BY(mu);
  std::vector<double> recent_ms ABSL_GUARDED_BY(mu);  // since the last progress report
  int64_t recent_answered ABSL_GUARDED_BY(mu) = 0;
  double last_progress ABSL_GUARDED_BY(mu) = 0;

  // Sends request i, due at `due`; `then` runs after its answer was recorded.
  void Send(int64_t i, double due, std::function<void(bool ok)> then) {
    ++outstanding;
    ++sent;
    router->Predict((*input)(i)).Subscribe(
        [self = shared_from_this(), i, due, then = std::move(then)](const absl::StatusOr<Prediction>& r) {
          const double now = Now();
          if (r.ok() && *self->on_answer) (*self->on_answer)(i, *r);
          {
            absl::MutexLock lock(&self->mu);
            if (r.ok()) {
              ++self->report.answered;
              self->recent_ms.push_back((now - due) * 1e3);  // progress shows the warm-up too
              ++self->recent_answered;
              if (now >= self->from && due < self->to) self->report.latency_ms.push_back((now - due) * 1e3);
            } else {
              ++self->report.failed;
              if (self->report.first_error.ok()) self->report.first_error = r.status();
            }
          }
          --self->outstanding;
          if (then) then(r.ok());
        });
  }

  // Closed loop: one client's next request, until the window or the count ends.
  void Chain() {
    const int64_t i = next++;
    if (i >= limit || Now() >= to) {
      if (--chains == 0) chains_done.Notify();
      return;
    }
    Send(i, Now(), [self = shared_from_this()](bool ok) {
      if (ok) {
        self->Chain();
      } else if (--self->chains == 0) {  // never spin on errors: a failed client stops
        self->chains_done.Notify();
      }
    });
  }

  LoadProgress Progress(bool reset) {
    absl::MutexLock lock(&mu);
    LoadProgress p;
    const double now = Now();
    p.seconds = now - start;
    p.sent = sent;
    p.answered = report.answered;
    p.failed = report.failed;
    p.warming_up = now < from;
    const double since = std::max(1e-9, now - std::max(last_progress, start));
    p.recent_rps = static_cast<double>(recent_answered) / since;
    std::sort(recent_ms.begin(), recent_ms.end());
    p.recent_p50_ms = QuantileOfSorted(recent_ms, 0.5);
    p.recent_p90_ms = QuantileOfSorted(recent_ms, 0.9);
    p.recent_p99_ms = QuantileOfSorted(recent_ms, 0.99);
    if (reset) {
      recent_ms.clear();
      recent_answered = 0;
      last_progress = now;
    }
    return p;
  }
};

}  // namespace

double LoadReport::throughput() const {
  return measured_seconds > 0 ? static_cast<double>(latency_ms.size()) / measured_seconds : 0;
}

double LoadReport::Percentile(double q) const {
  std::vector<double> sorted = latency_ms;
  std::sort(sorted.begin(), sorted.end());
  return QuantileOfSorted(sorted, q);
}

std::string LoadReport::ToString() const {
  std::vector<double> sorted = latency_ms;
  std::sort(sorted.begin(), sorted.end());
  return absl::StrFormat("%.0f requests/s, p50 %.3f ms, p90 %.3f ms, p99 %.3f ms (%d answered, %d failed%s)",
                         throughput(), QuantileOfSorted(sorted, 0.5), QuantileOfSorted(sorted, 0.9),
                         QuantileOfSorted(sorted, 0.99), answered,
                         failed, first_error.ok() ? "" : absl::StrCat("; first error: ", first_error.message()));
}

std::string LoadProgress::ToString() const {
  return absl::StrFormat("%5.1f s%s  %d sent  %d answered  %d failed  %.0f req/s  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms",
                         seconds, warming_up ? " (warm-up)" : "", sent, answered, failed, recent_rps, recent_p50_ms,
                         recent_p90_ms, recent_p99_ms);
}

LoadReport RunLoad(const Router& router, const LoadOptions& options, const std::function<Tensor(int64_t)>& input,
                   const std::function<void(int64_t, const Prediction&)>& on_answer) {
  auto run = std::make_shared<Run>();
  run->router = &router;
  run->input = &input;
  run->on_answer = &on_answer;
  run->start = Now();
  run->from = run->start + absl::ToDoubleSeconds(options.warmup);
  const bool timed = options.duration > absl::ZeroDuration();
  run->to = timed ? run->from + absl::ToDoubleSeconds(options.duration) : std::numeric_limits<double>::infinity();
  run->limit = options.requests > 0 ? options.requests : std::numeric_limits<int64_t>::max();
  const bool open = options.rate > 0;
  if ((!open && options.clients <= 0) || (!timed && options.requests <= 0)) {
    LoadReport bad;
    bad.first_error = absl::InvalidArgumentError(
        "RunLoad needs clients > 0 (closed loop) or rate > 0 (open loop), and a duration or a number of requests");
    return bad;
  }
  double next_progress = run->start + absl::ToDoubleSeconds(options.progress_every);
  auto maybe_progress = [&] {
    if (!options.progress || Now() < next_progress) return;
    options.progress(run->Progress(/*reset=*/true));
    next_progress = Now() + absl::ToDoubleSeconds(options.progress_every);
  };
  if (!open) {
    run->chains = options.clients;
    for (int c = 0; c < options.clients; ++c) run->Chain();
    const absl::Duration tick = options.progress ? options.progress_every : absl::Milliseconds(100);
    while (!run->chains_done.WaitForNotificationWithTimeout(tick)) maybe_progress();
  } else {
    std::mt19937_64 rng(options.seed);
    std::exponential_distribution<double> gap(options.rate);
    for (double due = run->start + gap(rng); due < run->to && run->next < run->limit; due += gap(rng)) {
      while (Now() < due) {
        const double wait = due - Now();
        if (wait > 200e-6) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(wait * 1e6) - 100));
      }
      while (run->outstanding >= options.max_outstanding) std::this_thread::sleep_for(std::chrono::microseconds(100));
      run->Send(run->next++, due, nullptr);
      maybe_progress();
    }
  }
  // Every request sent is answered or failed (the router's timeout bounds it).
  while (run->outstanding > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    maybe_progress();
  }
  if (options.progress) options.progress(run->Progress(/*reset=*/true));
  absl::MutexLock lock(&run->mu);
  LoadReport out = std::move(run->report);
  out.sent = run->sent;
  out.measured_seconds = std::max(0.0, std::min(Now(), run->to) - run->from);
  return out;
}

}  // namespace gw::serve
