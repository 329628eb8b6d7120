// ThreadSanitizer support for Debian's prebuilt Abseil (ThreadSanitizer builds only).
//
// Debian's libabsl is not compiled with -fsanitize=thread, so absl::Mutex (futexes and
// atomics, not pthread mutexes) is invisible to TSan and every access it guards is
// reported as a race. This file interposes the exported absl::Mutex entry points: each
// forwards to the real one (dlsym RTLD_NEXT) and tells TSan about the happens-before
// edge it creates (release before unlocking, acquire after locking). Conditions that
// absl evaluates internally synchronise through one extra shared address, which is
// conservative (it can hide a race, never invent one).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace {

char g_conditions;  // address used for condition evaluation

template <typename Fn>
Fn Real(const char* mangled) {
  void* p = dlsym(RTLD_NEXT, mangled);
  if (p == nullptr) {
    std::fprintf(stderr, "tsan annotations: cannot find %s\n", mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

void Acquire(const void* mu) {
  __tsan_acquire(const_cast<void*>(mu));
  __tsan_acquire(&g_conditions);
}
void Release(const void* mu) {
  __tsan_release(const_cast<void*>(mu));
  __tsan_release(&g_conditions);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex6UnlockEv");
  Release(this);
  real(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

// Shared (reader) locks: reads under them happen after the last writer's unlock, and the
// next writer's lock happens after them.
void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Release(this);
  real(this, cond);
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  const bool r = real(this, cond, timeout);
  Acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  const bool r = real(this, cond, deadline);
  Acquire(this);
  return r;
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  Acquire(this);
}

bool Condition::Eval() const {
  static auto real = Real<bool (*)(const Condition*)>("_ZNK4absl7debian39Condition4EvalEv");
  __tsan_acquire(&g_conditions);
  const bool r = real(this);
  __tsan_release(&g_conditions);
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
