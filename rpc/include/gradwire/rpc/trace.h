// Tracer: what a worker does, as spans on a timeline, written as Chrome trace-event JSON
// (opened by Perfetto, ui.perfetto.dev, or chrome://tracing) for `gradwire trace merge`
// and `gradwire trace render`.
//
// Contract
//   - A worker traces when AgentOptions::trace_dir (GRADWIRE_TRACE) names a directory:
//     its agent writes DIR/<worker>.trace.json; Agent::tracer() is that worker's tracer.
//     Without one the tracer is disabled: every call below returns at once, having
//     recorded nothing (one relaxed load), so layers trace unconditionally.
//   - Record(span) is one slice [begin, end) on the calling thread's lane ("X"), or an
//     async span (`async`: a call that other threads complete, drawn on its own track).
//     A span may end a flow (flow_in: the arrow from the span that started it, possibly
//     on another worker) and start one (flow_out). Flow ids are unique in the job: a
//     layer takes its own from Agent::NewId(); a call's are CallFlow/ReplyFlow, which
//     both ends compute from the caller's rank and the call's id, sending nothing.
//   - A span belongs to a trace context (`context`: a distributed-autograd context's
//     GlobalId bits, written as args.context "<rank>:<counter>"), so that one context can
//     be followed across workers, from its forward calls through its backward pass to
//     its optimizer step. Record fills it, when the layer left it 0, from the context
//     source (SetContextSource: distributed autograd's context current on the thread);
//     the agent's call spans on the caller take it where the call was made, and the
//     callee's handler span where its handler ran.
//   - Spans of one thread must nest (as the trace format asks): record a slice when it
//     ends, its begin taken when it began (Now, or a Scope).
//   - Recording appends to a buffer of the calling thread (no lock shared with other
//     threads); a writer thread moves the buffers into a spill file,
//     DIR/<worker>.trace.spill, every 100 ms (and at Flush): the spans' own bytes, not
//     yet JSON, so that tracing costs a running job little. A buffer that the writer has
//     not drained within 64k spans drops the spans after those, counted and written into
//     the file ("dropped_spans"), never blocking.
//   - A directory that cannot be written is reported once on stderr, naming the path and
//     why, and tracing stays off: the job goes on (Open returns the disabled tracer).
//   - Close writes what is buffered and turns the spill into the JSON: the spans, the
//     threads' names, the clock offsets to the other workers (SetClockOffset). The JSON
//     appears whole (written aside, then renamed) and the spill is removed; a large one
//     is announced on stderr. The destructor closes. Thread-safe.
//   - The spill of a worker that never closed its trace (killed) is read up to its last
//     whole record by ConvertSpill, as `gradwire trace merge` does.
//   - Times are microseconds of this host's real-time clock (Now, read from the CPU's
//     counter where it can be); `gradwire trace merge` aligns the workers with the
//     offsets measured over the job's own connections.
#ifndef GRADWIRE_RPC_TRACE_H_
#define GRADWIRE_RPC_TRACE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace gw::rpc {

class Tracer {
 public:
  // An interned name: cheap to record (Intern once, keep the id).
  using Name = uint32_t;

  struct Span {
    Name category = 0;
    Name name = 0;
    int64_t begin_us = 0;
    int64_t end_us = 0;
    uint64_t flow_in = 0;   // 0: none
    uint64_t flow_out = 0;  // 0: none
    bool async = false;     // drawn on an async track, keyed by async_id
    uint64_t async_id = 0;
    // Up to two numeric arguments, shown with the span ("peer": 1, "bytes": 4096).
    Name arg_names[2] = {0, 0};
    int64_t arg_values[2] = {0, 0};
    Name note = 0;         // a string argument ("note"), 0: none
    uint64_t context = 0;  // the trace context (GlobalId bits), 0: the current one
  };

  // A disabled tracer.
  Tracer();
  // Traces worker `worker` (rank `rank`) into dir/<worker>.trace.json. An unusable
  // directory is reported once on stderr and gives a disabled tracer.
  static std::unique_ptr<Tracer> Open(const std::string& dir, const std::string& worker, int rank);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  int rank() const { return rank_; }
  // The file written ("" when disabled).
  const std::string& path() const;

  // Microseconds since the Unix epoch on this host's real-time clock, read from the CPU's
  // time-stamp counter where it is invariant (twice as fast as clock_gettime), steered
  // onto the real-time clock by the writer every 100 ms. A thread's successive reads do
  // not go back (rpc/src/observe/trace_clock.h names the two exceptions).
  int64_t Now() const;
  // An id for an async span, unique in this tracer's file.
  uint64_t NewAsyncId() { return next_async_id_.fetch_add(1, std::memory_order_relaxed); }

  // The trace context current on the calling thread (0: none), as a layer above rpc
  // tells it: `source` is called on the recording thread. Set once, before calls are
  // made (in Agent::Start's setup).
  using ContextSource = uint64_t (*)();
  void SetContextSource(ContextSource source) { context_source_.store(source, std::memory_order_release); }
  uint64_t CurrentContext() const {
    ContextSource source = context_source_.load(std::memory_order_acquire);
    return source != nullptr ? source() : 0;
  }
  Name Intern(std::string_view text);
  void Record(const Span& span);

  // A slice from construction to destruction on this thread.
  class Scope {
   public:
    Scope(Tracer& tracer, Name category, Name name);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Span& span() { return span_; }

   private:
    Tracer* tracer_;  // null: disabled
    Span span_;
  };

  // The offset of worker `rank`'s clock from this one (theirs minus ours), measured with
  // a round trip of `rtt_us`; the best (shortest round trip) is kept.
  void SetClockOffset(int rank, int64_t offset_us, int64_t rtt_us);

  // Moves what the threads buffered into the spill now (the writer does every 100 ms).
  void Flush();

  // Writes everything, closes the spill and turns it into the JSON file (later spans are
  // dropped). Errors name the path.
  absl::Status Close();

  // Writes the JSON of a spill (DIR/<worker>.trace.spill) that its tracer did not turn
  // into one, up to its last whole record; `closed`: whether its tracer was closed.
  // INVALID_ARGUMENT for what is not a spill of this build, errors naming the path.
  static absl::Status ConvertSpill(const std::string& spill_path, const std::string& json_path, bool* closed);

  // The top bit keeps them apart from GlobalIds (global_id.h).
  static uint64_t CallFlow(int caller, uint64_t call_id) {
    return uint64_t{1} << 63 | (uint64_t(caller) + 1) << 48 | (call_id << 1 & ((uint64_t{1} << 48) - 1));
  }
  static uint64_t ReplyFlow(int caller, uint64_t call_id) { return CallFlow(caller, call_id) | 1; }

  struct Impl;

 private:
  Name InternShared(std::string_view text);

  std::atomic<bool> enabled_{false};
  std::atomic<ContextSource> context_source_{nullptr};
  std::atomic<uint64_t> next_async_id_{1};
  int rank_ = -1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_TRACE_H_
