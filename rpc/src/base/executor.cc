#include "gradwire/rpc/executor.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <memory>

namespace gw::rpc {

ThreadPool::ThreadPool(size_t num_threads, std::string name) : name_(std::move(name)) {
  for (size_t i = 0; i < std::max<size_t>(num_threads, 1); ++i) {
    threads_.emplace_back([this] { Loop(); });
    pthread_setname_np(threads_.back().native_handle(), name_.substr(0, 15).c_str());
  }
}

ThreadPool::~ThreadPool() { Shutdown(); }

bool ThreadPool::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  queue_.push_back(std::move(fn));
  return true;
}

size_t ThreadPool::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void ThreadPool::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void ThreadPool::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void ParallelFor(Executor& executor, int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1) return fn(0);
  // Tasks are claimed from a counter, by the caller and by whichever helpers get to run;
  // the caller waits only for tasks that a helper already started.
  struct State {
    explicit State(const std::function<void(int64_t)>& f, int64_t count) : fn(f), n(count) {}
    const std::function<void(int64_t)>& fn;  // outlives every claimed task (the caller waits)
    const int64_t n;
    std::atomic<int64_t> next{0};
    absl::Mutex mu;
    int64_t done ABSL_GUARDED_BY(mu) = 0;
    void Work() {
      int64_t finished = 0;
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        fn(i);
        ++finished;
      }
      if (finished > 0) {
        absl::MutexLock lock(&mu);
        done += finished;
      }
    }
  };
  auto state = std::make_shared<State>(fn, n);
  for (int64_t h = 0; h < n - 1; ++h) {
    if (!executor.Post([state] { state->Work(); })) break;
  }
  state->Work();
  absl::MutexLock lock(&state->mu);
  state->mu.Await(absl::Condition(
      +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->done == s->n; }, state.get()));
}

}  // namespace gw::rpc
