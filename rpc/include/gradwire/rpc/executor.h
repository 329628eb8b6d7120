// Executor and ThreadPool: where callbacks and user functions run.
//
// Contract
//   - Executor::Post(fn) runs fn later on some thread of the executor, never inline.
//   - ThreadPool runs posted functions on `num_threads` threads in FIFO order. Shutdown()
//     (also run by the destructor) stops accepting work, runs what was queued, and joins
//     the threads. Posting after shutdown drops the function and returns false.
//     REQUIRES: Shutdown and the destructor are not called from one of the pool's threads.
//   - An exception escaping a posted function terminates the process (a bug in the
//     caller); gradwire's own tasks never throw.
//   - ParallelFor(executor, n, fn) runs fn(0) ... fn(n - 1), each once, on the calling
//     thread and on helpers posted to the executor, and returns when all are done. The
//     caller takes tasks too, so it finishes even when no helper ever runs (a busy or
//     shut-down pool): it may be called from one of the executor's own threads. fn must
//     not throw.
//   - Thread-safe.
#ifndef GRADWIRE_RPC_EXECUTOR_H_
#define GRADWIRE_RPC_EXECUTOR_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gw::rpc {

class Executor {
 public:
  virtual ~Executor() = default;
  // Returns false (and drops fn) when the executor no longer accepts work.
  virtual bool Post(std::function<void()> fn) = 0;
};

class ThreadPool final : public Executor {
 public:
  ThreadPool(size_t num_threads, std::string name);
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  bool Post(std::function<void()> fn) override;
  void Shutdown();
  size_t num_threads() const { return threads_.size(); }
  // Tasks posted and not yet started (metrics: the worker pool's queue).
  size_t queued() const;

 private:
  void Loop();

  const std::string name_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

void ParallelFor(Executor& executor, int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_EXECUTOR_H_
