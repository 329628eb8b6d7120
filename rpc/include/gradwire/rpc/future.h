// Future<T> / Promise<T>: the result of an asynchronous operation, or its error.
//
// Contract
//   - A Promise is completed exactly once with an absl::StatusOr<T>; later attempts are
//     ignored and reported by returning false (errors "stick": the first one wins).
//   - Wait(deadline) blocks until the value is there or the deadline passes (then it
//     returns DEADLINE_EXCEEDED and the future stays pending). Every wait has a deadline;
//     the default is InfiniteFuture only for callers that have their own bound.
//   - Then(fn) registers fn(const absl::StatusOr<T>&) and returns a Future of its result
//     (fn may return U, absl::StatusOr<U> or Future<U>). fn always runs on the promise's
//     Executor, never inline in Then() and never while a lock is held. If fn throws, the
//     returned future fails with INTERNAL carrying the exception's message.
//   - Subscribe(fn) is the exception, for plumbing inside gradwire: fn runs on the thread
//     that completes the promise (or at once if it is complete), so results are passed
//     along without a thread hop. fn must be quick and must not block or throw.
//   - Map<U>(future, fn) is Then for plumbing: fn(const absl::StatusOr<T>&) ->
//     absl::StatusOr<U> runs where a subscriber would (the completing thread), so a
//     conversion of a result costs no thread hop; fn must be quick and not block. If fn
//     throws, the returned future fails with INTERNAL, as with Then.
//   - WhenAll(futures) completes with every result, in order, once all have completed, or
//     with the first error (in completion order).
//   - Futures are cheap shared handles; all methods are thread-safe. A completed future is
//     read without its lock (IsReady, Get, Subscribe, Then): its result never changes again.
#ifndef GRADWIRE_RPC_FUTURE_H_
#define GRADWIRE_RPC_FUTURE_H_

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/rpc/executor.h"

namespace gw {

template <typename T>
class Future;
template <typename T>
class Promise;

namespace internal {

template <typename T>
struct FutureState {
  explicit FutureState(rpc::Executor* e) : executor(e) {}
  rpc::Executor* const executor;
  absl::Mutex mu;
  std::atomic<bool> ready{false};  // mirrors `done`, for lock-free polling
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<T> result ABSL_GUARDED_BY(mu) = absl::UnknownError("pending");
  std::vector<std::function<void()>> callbacks ABSL_GUARDED_BY(mu);
  std::vector<std::function<void(const absl::StatusOr<T>&)>> subscribers ABSL_GUARDED_BY(mu);

  // The result once done: it never changes again, so it is read without the lock.
  // REQUIRES: done (or ready observed true, which is stored after it with release order).
  const absl::StatusOr<T>& final_result() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return result; }
  // Completes a state no other thread can see yet (MakeReadyFuture): no lock needed.
  void CompleteUnshared(absl::StatusOr<T> r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    result = std::move(r);
    done = true;
    ready.store(true, std::memory_order_release);
  }
};

template <typename U>
struct IsFuture : std::false_type {};
template <typename U>
struct IsFuture<Future<U>> : std::true_type {
  using Inner = U;
};
template <typename U>
struct IsStatusOr : std::false_type {};
template <typename U>
struct IsStatusOr<absl::StatusOr<U>> : std::true_type {
  using Inner = U;
};

// The value type of the Future returned by Then(fn) where fn returns R.
template <typename R>
struct ThenResult {
  using type = R;
};
template <typename U>
struct ThenResult<Future<U>> {
  using type = U;
};
template <typename U>
struct ThenResult<absl::StatusOr<U>> {
  using type = U;
};
template <>
struct ThenResult<void> {
  using type = bool;
};
template <>
struct ThenResult<absl::Status> {
  using type = bool;
};

}  // namespace internal

template <typename T>
class Future {
 public:
  Future() = default;

  bool valid() const { return state_ != nullptr; }
  // A completed future is read without its lock (the result never changes again).
  bool IsReady() const { return state_->ready.load(std::memory_order_acquire); }

  // OK when ready (whatever the result), DEADLINE_EXCEEDED if still pending at deadline.
  absl::Status Wait(absl::Time deadline) const {
    if (IsReady()) return absl::OkStatus();
    absl::MutexLock lock(&state_->mu);
    if (!state_->mu.AwaitWithDeadline(absl::Condition(&state_->done), deadline)) {
      return absl::DeadlineExceededError("Future::Wait: deadline passed before the result arrived");
    }
    return absl::OkStatus();
  }
  absl::Status WaitFor(absl::Duration timeout) const { return Wait(absl::Now() + timeout); }

  // Like Wait, but first polls for up to `spin` without sleeping. A caller waiting for a
  // fast round trip then sees the result without a thread wake-up (which costs tens of
  // microseconds on virtual machines); beyond `spin` it blocks as Wait does.
  absl::Status WaitSpinning(absl::Time deadline, absl::Duration spin) const {
    const absl::Time spin_until = std::min(deadline, absl::Now() + spin);
    for (int i = 0; !state_->ready.load(std::memory_order_acquire); ++i) {
      if ((i & 63) == 0 && absl::Now() >= spin_until) break;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    return Wait(deadline);
  }

  // Waits (bounded) and returns the result, or DEADLINE_EXCEEDED.
  absl::StatusOr<T> Get(absl::Duration timeout = absl::InfiniteDuration()) const {
    if (!IsReady()) {
      if (absl::Status s = Wait(absl::Now() + timeout); !s.ok()) return s;
    }
    return ResultRef();
  }

  // The status of a completed future (UNKNOWN "pending" before).
  absl::Status status() const { return IsReady() ? ResultRef().status() : absl::UnknownError("pending"); }

  template <typename F>
  auto Then(F fn) const -> Future<typename internal::ThenResult<
      std::invoke_result_t<F, const absl::StatusOr<T>&>>::type>;

  rpc::Executor* executor() const { return state_->executor; }

  // Runs fn(result) on the completing thread (see the contract).
  void Subscribe(std::function<void(const absl::StatusOr<T>&)> fn) const {
    if (!IsReady()) {
      absl::MutexLock lock(&state_->mu);
      if (!state_->done) {
        state_->subscribers.push_back(std::move(fn));
        return;
      }
    }
    fn(ResultRef());
  }

 private:
  friend class Promise<T>;
  template <typename U>
  friend class Future;  // Then() chains futures of different types
  template <typename U>
  friend Future<U> MakeReadyFuture(rpc::Executor& executor, absl::StatusOr<U> result);
  explicit Future(std::shared_ptr<internal::FutureState<T>> s) : state_(std::move(s)) {}
  // Runs cb on the executor once the result is there.
  void OnReady(std::function<void()> cb) const {
    if (!IsReady()) {
      absl::MutexLock lock(&state_->mu);
      if (!state_->done) {
        state_->callbacks.push_back(std::move(cb));
        return;
      }
    }
    if (!state_->executor->Post(cb)) cb();  // executor gone: run rather than lose it
  }
  const absl::StatusOr<T>& ResultRef() const { return state_->final_result(); }  // REQUIRES done

  std::shared_ptr<internal::FutureState<T>> state_;
};

template <typename T>
class Promise {
 public:
  // REQUIRES: `executor` outlives every callback registered on the future.
  explicit Promise(rpc::Executor& executor)
      : state_(std::make_shared<internal::FutureState<T>>(&executor)) {}

  Future<T> future() const { return Future<T>(state_); }

  // Completes the future; returns false if it was already completed.
  bool Set(absl::StatusOr<T> result) const {
    std::vector<std::function<void()>> callbacks;
    std::vector<std::function<void(const absl::StatusOr<T>&)>> subscribers;
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->done) return false;
      state_->result = std::move(result);
      state_->done = true;
      state_->ready.store(true, std::memory_order_release);
      callbacks.swap(state_->callbacks);
      subscribers.swap(state_->subscribers);
    }
    for (auto& fn : subscribers) fn(state_->final_result());
    for (auto& cb : callbacks) {
      if (!state_->executor->Post(cb)) cb();
    }
    return true;
  }
  bool SetError(absl::Status s) const { return Set(std::move(s)); }

 private:
  std::shared_ptr<internal::FutureState<T>> state_;
};

// A future that is already complete.
template <typename T>
Future<T> MakeReadyFuture(rpc::Executor& executor, absl::StatusOr<T> result) {
  auto state = std::make_shared<internal::FutureState<T>>(&executor);
  state->CompleteUnshared(std::move(result));
  return Future<T>(std::move(state));
}

template <typename U, typename T, typename F>
Future<U> Map(const Future<T>& future, F fn) {
  Promise<U> out(*future.executor());
  future.Subscribe([out, fn = std::move(fn)](const absl::StatusOr<T>& r) {
    try {
      out.Set(fn(r));
    } catch (const std::exception& e) {
      out.Set(absl::InternalError(std::string("callback threw: ") + e.what()));
    }
  });
  return out.future();
}

template <typename T>
Future<std::vector<T>> WhenAll(rpc::Executor& executor, std::vector<Future<T>> futures) {
  Promise<std::vector<T>> done(executor);
  if (futures.empty()) {
    done.Set(std::vector<T>{});
    return done.future();
  }
  struct State {
    absl::Mutex mu;
    std::vector<T> results;
    size_t left;
    absl::Status error;
  };
  auto state = std::make_shared<State>();
  state->results.resize(futures.size());
  state->left = futures.size();
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].Subscribe([state, done, i](const absl::StatusOr<T>& r) {
      absl::StatusOr<std::vector<T>> result;
      {
        absl::MutexLock lock(&state->mu);
        if (r.ok()) {
          state->results[i] = *r;
        } else if (state->error.ok()) {
          state->error = r.status();
        }
        if (--state->left > 0) return;
        if (state->error.ok()) {
          result = std::move(state->results);
        } else {
          result = state->error;
        }
      }
      done.Set(std::move(result));
    });
  }
  return done.future();
}

template <typename T>
template <typename F>
auto Future<T>::Then(F fn) const -> Future<typename internal::ThenResult<
    std::invoke_result_t<F, const absl::StatusOr<T>&>>::type> {
  using R = std::invoke_result_t<F, const absl::StatusOr<T>&>;
  using U = typename internal::ThenResult<R>::type;
  Promise<U> next(*state_->executor);
  Future<T> self = *this;
  OnReady([self, next, fn = std::move(fn)]() mutable {
    const absl::StatusOr<T>& in = self.ResultRef();
    try {
      if constexpr (std::is_void_v<R>) {
        fn(in);
        next.Set(true);
      } else if constexpr (std::is_same_v<R, absl::Status>) {
        absl::Status s = fn(in);
        next.Set(s.ok() ? absl::StatusOr<bool>(true) : absl::StatusOr<bool>(s));
      } else if constexpr (internal::IsFuture<R>::value) {
        Future<U> inner = fn(in);
        inner.OnReady([inner, next] { next.Set(inner.ResultRef()); });
      } else {
        next.Set(fn(in));
      }
    } catch (const std::exception& e) {
      next.Set(absl::InternalError(std::string("callback threw: ") + e.what()));
    }
  });
  return next.future();
}

}  // namespace gw

#endif  // GRADWIRE_RPC_FUTURE_H_
