// Internal: TraceClock, the tracer's clock (Tracer::Now): microseconds since the Unix
// epoch on this host's real-time clock, read from the CPU's time-stamp counter (11 ns a
// read on the VM of BENCHMARKS.md, where clock_gettime takes 26 through kvm-clock). A
// traced call reads it six times.
//
// Contract
//   - Now() is thread-safe and lock-free. It is clock_gettime(CLOCK_REALTIME) where the
//     counter does not tick at one rate in every state and on every core (Linux's
//     constant_tsc and nonstop_tsc flags, /proc/cpuinfo; not x86-64), and until the first
//     Calibrate that has a baseline of at least 10 ms.
//   - Calibrate() is called by one thread (the tracer's writer, every kSteerOverNs). It
//     measures the counter's rate against the real-time clock over all the time since
//     the clock was made, and steers the clock back onto the real-time one over the next
//     kSteerOverNs, continuing from where it is: reads of one thread do not decrease, and
//     the clock stays within microseconds of the real-time one. Two exceptions, where a
//     read may be below an earlier one: by under a microsecond where it starts reading
//     the counter, and where a gap over kMostSteeredNs (the real-time clock was set) is
//     closed at once, by a step (the rate is then measured again from there).
#ifndef GRADWIRE_RPC_SRC_OBSERVE_TRACE_CLOCK_H_
#define GRADWIRE_RPC_SRC_OBSERVE_TRACE_CLOCK_H_

#include <atomic>
#include <cstdint>

namespace gw::rpc::internal {

class TraceClock {
 public:
  static constexpr int64_t kSteerOverNs = 100'000'000;  // 100 ms
  static constexpr int64_t kMostSteeredNs = 1'000'000;  // 1 ms

  TraceClock();

  int64_t Now() const;
  void Calibrate();
  // Whether Now() reads the counter (after a Calibrate, where it is invariant).
  bool reads_counter() const { return mult_.load(std::memory_order_relaxed) != 0; }

  // Whether this machine's time-stamp counter is invariant (see the contract).
  static bool InvariantCounter();
  // clock_gettime(CLOCK_REALTIME) in nanoseconds.
  static int64_t RealtimeNs();

 private:
  // The counter and the real-time clock at one instant (the counter's reads around the
  // clock's, the closest of three tries).
  struct Pair {
    int64_t counter;
    int64_t ns;
  };
  static Pair Measure();
  // The clock's value at `counter` for the segment now published (REQUIRES: mult_ != 0).
  int64_t At(int64_t counter) const;
  void Publish(int64_t base_counter, int64_t base_ns, uint64_t mult);

  const bool invariant_;
  Pair first_;  // the rate's baseline (Calibrate's)

  // The segment: ns = base_ns_ + (counter - base_counter_) * mult_ / 2^32, mult_ 0 for
  // the real-time clock. Written by Calibrate under the sequence count seq_ (odd while
  // writing); Now() retries a read that overlapped a write.
  std::atomic<uint64_t> seq_{0};
  std::atomic<int64_t> base_counter_{0};
  std::atomic<int64_t> base_ns_{0};
  std::atomic<uint64_t> mult_{0};
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_OBSERVE_TRACE_CLOCK_H_
