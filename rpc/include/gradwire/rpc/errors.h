// The failure model and its vocabulary: what each error code means for a call, an RRef
// operation or a backward pass, and how every layer words it, so that a caller can tell
// them apart by code alone.
//
// The failure model (agent.h's calls and every layer above follow it):
//     CANCELLED          this agent is shutting down or has shut down: calls made then
//                        (but those its handlers and the RRef protocol still make while a
//                        graceful shutdown runs), calls pending when it closes, RRef
//                        operations and backward passes cut short by it. "<self> is
//                        shutting down: ...".
//     UNAVAILABLE        the peer is dead, unreachable, or shutting down; always names it
//                        ("<peer> is unavailable: ..." or "call to <peer>.<function>
//                        failed: ..."). The only error a retry can fix (IsRetryable).
//                        A connection that closes while the agent runs declares its peer
//                        dead, and so does silence: a peer that answers no heartbeat
//                        for peer_timeout (frozen, or cut off) has its connections
//                        closed, every call pending on it fails, and the layers above
//                        are told (WatchPeers, RRefs, autograd contexts). Plain calls
//                        dial again, but RRefs and autograd contexts refuse that peer
//                        from then on (DeclaredDeadError).
//     DEADLINE_EXCEEDED  the call (or operation) did not finish in time; names the peer.
//     NOT_FOUND          no such worker, or the callee has no such function (names both).
//     INVALID_ARGUMENT   an argument or the result has the wrong type or count, or the
//                        handler's tensor math refused its inputs (a gw::Error thrown).
//     FAILED_PRECONDITION the peer speaks an incompatible protocol version.
//     other codes        the handler's own error, prefixed "<worker>.<function>: "; a
//                        handler that throws something else is INTERNAL.
//   Exceptions become a Status at one boundary (the dispatcher, StatusFromException). A failing call
//   never affects other calls; the agent keeps serving. Retries go through one policy
//   (retry.h) on the agent's TimerQueue, and only of UNAVAILABLE.
//
// Contract
//   - ShuttingDownError: CANCELLED, "<worker> is shutting down: <what>". The one code for
//     "this agent is shutting down or has shut down": calls made then, calls still pending
//     when it closes, RRef operations and backward passes cut short by it.
//   - UnavailableError: UNAVAILABLE, "<peer> is unavailable: <detail>". A dead or
//     unreachable peer, always named. A peer that refuses work because *it* is shutting
//     down answers UNAVAILABLE too: from the caller's side that peer is going away.
//   - DeclaredDeadError: UNAVAILABLE, the same, for a peer this agent declared dead when
//     a connection to it closed; the stateful layers (RRefs, autograd contexts) refuse it
//     from then on (agent.h).
//   - IsRetryable: only what a retry can fix, UNAVAILABLE (a dropped connection is
//     redialled, a restarted worker announces its new address). Never a handler's own
//     error, never DEADLINE_EXCEEDED (the time is spent), never CANCELLED.
//   - NamesWorker(message, worker): whether an error already says which worker it is
//     about, the worker's name appearing as a whole word ("worker1" is not named by
//     "worker10 is unavailable"); a layer that passes an error on prefixes the worker
//     only when it does not.
//   - StatusFromException / CatchExceptions: the one place an exception becomes a Status.
//     gw::Error (tensor math refusing shapes or dtypes it was given) becomes
//     INVALID_ARGUMENT, any other std::exception INTERNAL; both read "<where> threw: <what>".
#ifndef GRADWIRE_RPC_ERRORS_H_
#define GRADWIRE_RPC_ERRORS_H_

#include <exception>
#include "absl/strings/string_view.h"
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gw::rpc {

absl::Status ShuttingDownError(absl::string_view worker, absl::string_view what = "");
absl::Status UnavailableError(absl::string_view peer, absl::string_view detail);
absl::Status DeclaredDeadError(absl::string_view peer);
inline bool IsRetryable(const absl::Status& s) { return s.code() == absl::StatusCode::kUnavailable; }

// Whether `worker` occurs in `message` as a whole word: not preceded or followed by a
// letter, digit or '_' that would make it part of a longer name (where the name itself
// begins or ends with such a character). False for an empty name.
bool NamesWorker(absl::string_view message, absl::string_view worker);

// REQUIRES: called inside a catch block (it rethrows the current exception to classify it).
absl::Status StatusFromException(absl::string_view where);

// Runs fn(); an exception it throws comes back as a Status (see the contract). fn returns
// void, absl::Status or absl::StatusOr<T>; CatchExceptions returns Status or StatusOr<T>.
template <typename F>
auto CatchExceptions(absl::string_view where, F&& fn) {
  using R = std::invoke_result_t<F&>;
  if constexpr (std::is_void_v<R>) {
    try {
      fn();
      return absl::OkStatus();
    } catch (...) {
      return StatusFromException(where);
    }
  } else {
    try {
      return R(fn());
    } catch (...) {
      return R(StatusFromException(where));
    }
  }
}

// Moves r's value into `out`, or returns its error: for setups that install layers,
//   return rpc::Assign(DistAutograd::Install(agent), engine);
template <typename T>
absl::Status Assign(absl::StatusOr<T> r, T& out) {
  if (!r.ok()) return r.status();
  out = *std::move(r);
  return absl::OkStatus();
}

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_ERRORS_H_
