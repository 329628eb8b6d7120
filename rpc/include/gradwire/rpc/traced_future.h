// TracedUntilReady: an async span of the trace (rpc/trace.h) that ends when a future
// completes, on whichever thread completes it: a parameter-server push or pull, a
// pipeline's micro-batch forward.
//
// Contract
//   - TracedUntilReady(tracer, span, start) runs start() and returns its future's result
//     unchanged. With the tracer enabled, `span` (its begin taken before start() runs,
//     its async id set here) is recorded when that result is ready, a failure's message
//     as its note. With it disabled, it is start() and nothing else.
//   - The tracer must outlive the future (an agent's tracer outlives its calls).
#ifndef GRADWIRE_RPC_TRACED_FUTURE_H_
#define GRADWIRE_RPC_TRACED_FUTURE_H_

#include <functional>
#include <string_view>

#include "absl/status/statusor.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/trace.h"

namespace gw::rpc {

template <typename T>
Future<T> TracedUntilReady(Tracer& tracer, Tracer::Span span, const std::function<Future<T>()>& start) {
  if (!tracer.enabled()) return start();
  span.begin_us = tracer.Now();
  span.async = true;
  span.async_id = tracer.NewAsyncId();
  return Map<T>(start(), [&tracer, span](const absl::StatusOr<T>& r) -> absl::StatusOr<T> {
    Tracer::Span ended = span;
    ended.end_us = tracer.Now();
    if (!r.ok()) {
      const absl::string_view why = r.status().message();
      ended.note = tracer.Intern(std::string_view(why.data(), why.size()));
    }
    tracer.Record(ended);
    return r;
  });
}

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_TRACED_FUTURE_H_
