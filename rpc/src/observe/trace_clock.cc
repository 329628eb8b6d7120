#include "observe/trace_clock.h"

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace gw::rpc::internal {
namespace {

int64_t ReadCounter() {
#if defined(__x86_64__)
  return static_cast<int64_t>(__rdtsc());
#else
  return 0;
#endif
}

}  // namespace

TraceClock::TraceClock() : invariant_(InvariantCounter()), first_(Measure()) {}

int64_t TraceClock::RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

bool TraceClock::InvariantCounter() {
#if defined(__x86_64__)
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    const std::string flags = line + ' ';
    return flags.find(" constant_tsc ") != std::string::npos && flags.find(" nonstop_tsc ") != std::string::npos;
  }
#endif
  return false;
}

TraceClock::Pair TraceClock::Measure() {
  Pair best{0, 0};
  int64_t best_gap = -1;
  for (int i = 0; i < 3; ++i) {
    const int64_t before = ReadCounter();
    const int64_t ns = RealtimeNs();
    const int64_t after = ReadCounter();
    if (best_gap < 0 || after - before < best_gap) {
      best_gap = after - before;
      best = {before + (after - before) / 2, ns};
    }
  }
  return best;
}

int64_t TraceClock::Now() const {
  for (;;) {
    const uint64_t seq = seq_.load(std::memory_order_acquire);
    const uint64_t mult = mult_.load(std::memory_order_relaxed);
    const int64_t base_counter = base_counter_.load(std::memory_order_relaxed);
    const int64_t base_ns = base_ns_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((seq & 1) != 0 || seq_.load(std::memory_order_relaxed) != seq) continue;  // Calibrate wrote meanwhile
    if (mult == 0) return RealtimeNs() / 1000;
    const __int128 ticks = ReadCounter() - base_counter;
    return (base_ns + static_cast<int64_t>(ticks * mult >> 32)) / 1000;
  }
}

int64_t TraceClock::At(int64_t counter) const {
  const __int128 ticks = counter - base_counter_.load(std::memory_order_relaxed);
  return base_ns_.load(std::memory_order_relaxed) +
         static_cast<int64_t>(ticks * mult_.load(std::memory_order_relaxed) >> 32);
}

void TraceClock::Publish(int64_t base_counter, int64_t base_ns, uint64_t mult) {
  const uint64_t seq = seq_.load(std::memory_order_relaxed);
  seq_.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  base_counter_.store(base_counter, std::memory_order_relaxed);
  base_ns_.store(base_ns, std::memory_order_relaxed);
  mult_.store(mult, std::memory_order_relaxed);
  seq_.store(seq + 2, std::memory_order_release);
}

void TraceClock::Calibrate() {
  if (!invariant_) return;
  const Pair now = Measure();
  const int64_t ticks = now.counter - first_.counter;
  const int64_t ns = now.ns - first_.ns;
  if (ticks <= 0 || ns < 10'000'000) return;  // too short a baseline yet
  // The counter's rate, in nanoseconds per tick.
  const double rate = static_cast<double>(ns) / static_cast<double>(ticks);
  auto fixed = [](double ns_per_tick) { return static_cast<uint64_t>(ns_per_tick * 4294967296.0); };
  if (!reads_counter()) {
    Publish(now.counter, now.ns, fixed(rate));
    return;
  }
  const int64_t here = At(now.counter);
  const int64_t gap = now.ns - here;
  if (gap > kMostSteeredNs || gap < -kMostSteeredNs) {
    // The real-time clock was set: a step onto it, at the rate the counter had, which is
    // measured again from here.
    Publish(now.counter, now.ns, mult_.load(std::memory_order_relaxed));
    first_ = now;
    return;
  }
  // On from where the clock is, gaining `gap` over the next kSteerOverNs.
  Publish(now.counter, here, fixed(rate * (1.0 + static_cast<double>(gap) / kSteerOverNs)));
}

}  // namespace gw::rpc::internal
