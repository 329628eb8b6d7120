// Internal: Dispatcher, the inbound half of an agent: the registry of functions and the
// requests that peers send to them.
//
// Contract
//   - Register adds a handler under a name (ALREADY_EXISTS if taken); the agent decides
//     who may use reserved names (message.h).
//   - OnRequest(conn, envelope) runs on the transport I/O thread that decoded the request:
//     an unknown function is answered NOT_FOUND (MissingFunctionError); an inline
//     handler runs at once; pool handlers wait for OnFlush (the end of that read) and go to
//     the worker pool in at most one task per pool thread, so a read of many requests costs
//     one wake-up, and the replies ready when a task ends leave in one gather-write.
//   - Every handler runs inside the CallHooks scope of its request, behind the one
//     exception boundary (errors.h: CatchExceptions), and is answered exactly once: with
//     its result, later through the Future it returned, or UNAVAILABLE "<worker> is shutting
//     down" when the pool no longer takes work.
//   - InvokeLocal runs a registered function here as a call from `caller` would (RRef
//     creation and method calls on values owned here).
//   - Defer(fn) runs fn on the pool inside the current handler's scope; from an inline
//     handler, together with the rest of its read's pool work.
//   - A peer may have at most max_calls_in_flight requests here at once (PeerLimits;
//     0: no limit): a request past it is answered RESOURCE_EXHAUSTED at once, naming the
//     limit, and runs nothing; the peer's other calls and everyone else's go on. Requests
//     of gradwire's own protocols (reserved names) count but are never refused.
//   - AwaitIdle(deadline): no handler is running or awaiting its future. Thread-safe.
//   - Metrics (with a CallMetrics): every request is counted in the server-side series of
//     its caller and function (an unregistered one as CallMetrics::kUnknownFunction) when
//     its reply is encoded, refusals included: from its arrival to its reply, the
//     request's and the reply's bytes. running_by_peer() is how many requests of each
//     rank are running or queued here.
//   - Tracing (with an enabled Tracer): each handler run is a slice on its thread that
//     the request's flow arrow (Tracer::CallFlow) ends at and the reply's starts from
//     (a handler answering later through its future: a slice where the reply leaves).
//   - AppendWaits(out): what each thread runs now ("runs" records, waits.h): the
//     outermost handler of each thread, its caller and since when. Keeping it costs a
//     lock of the thread's own slot per request.
#ifndef GRADWIRE_RPC_SRC_CALLS_DISPATCHER_H_
#define GRADWIRE_RPC_SRC_CALLS_DISPATCHER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/rpc/call_hooks.h"
#include "gradwire/rpc/executor.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/rpc/transport.h"
#include "gradwire/rpc/waits.h"
#include "gradwire/rpc/worker.h"
#include "observe/call_metrics.h"
#include "observe/handler_slots.h"
#include "wire/codec.h"

namespace gw::rpc::internal {

// Where a request's reply is counted (CallMetrics), and since when.
struct RequestTiming {
  CallMetrics::Series* series = nullptr;
  std::chrono::steady_clock::time_point start = {};
  uint64_t received_bytes = 0;  // counted with the reply, by the thread that sends it
};

class Dispatcher {
 public:
  using Timing = RequestTiming;
  struct Peers {
    // A rank's worker name.
    std::function<std::string(int rank)> name_of;
    // The reply to request `id` for the worker of rank `to`, ready to send: the agent turns
    // RRefs into forks and lets the hooks annotate it.
    std::function<absl::StatusOr<Message>(int to, uint64_t id, const absl::StatusOr<Value>& result,
                                          const CallHooks::Scope& scope)>
        encode_reply;
  };

  Dispatcher(std::string self_name, ThreadPool& pool, Peers peers, int max_calls_in_flight = 0,
             CallMetrics* metrics = nullptr, Tracer* tracer = nullptr);
  ~Dispatcher();

  // REQUIRES: before any request arrives (Agent::Start's setup).
  void SetHooks(std::shared_ptr<CallHooks> hooks) { hooks_ = std::move(hooks); }
  absl::Status Register(const std::string& name, RawHandler handler, RegisterOptions options = {});
  bool Has(const std::string& name) const;
  // NOT_FOUND for a call of `function`, which is not registered here: a user's function
  // "<self> has no function 'f' (registered: ...)"; one of gradwire's own protocols
  // ("__" names) says which layer is not installed here and how to install it, naming
  // no internal function.
  absl::Status MissingFunctionError(const std::string& function) const;
  // Destroys the handlers (and what they own: a layer's state may close its resources,
  // calling out through the agent). The agent does it once closed, while the rest of it
  // still answers such calls with its closing error.
  void ClearHandlers();

  // `from`: the rank of the connection's peer (the agent knows it from the hello).
  // `bytes`: the size of the request's frame.
  void OnRequest(const std::shared_ptr<Connection>& conn, int from, Envelope env, uint64_t bytes = 0);
  // Answers request `id` from rank `from` with an error without running anything.
  void Refuse(const std::shared_ptr<Connection>& conn, int from, uint64_t id, const absl::Status& why,
              const std::string& function = "", uint64_t bytes = 0);
  void OnFlush(const std::shared_ptr<Connection>& conn);

  // With `here`, on this thread whatever the function's mode (the caller is a pool thread).
  Future<Value> InvokeLocal(const CallInfo& info, ValueList args, bool here);
  void Defer(std::function<void()> fn);
  bool AwaitIdle(absl::Time deadline);
  std::vector<std::pair<int, int>> running_by_peer() const;
  void AppendWaits(std::vector<Wait>& out) const;
  // True while this thread runs a handler (which may still call out during shutdown).
  static bool InHandler() { return t_handler_depth > 0; }

 private:
  struct Handler {
    RawHandler fn;
    HandlerMode mode;
    Tracer::Name traced_name = 0;  // its name, interned when traced
  };
  struct Request {
    std::shared_ptr<Handler> handler;
    CallInfo info;
    uint64_t id = 0;
    ValueList args;
    CallHooks::Scope scope;  // from CallHooks::OnReceiveRequest
    Timing timing;
  };
  // Replies that leave together (one SendMany), and whose requests they answer: those
  // count as running until the replies are handed to the connection (Answered), so that
  // AwaitIdle does not return while an answer is still in a batch.
  struct ReplyBatch {
    std::vector<Message> messages;
    std::vector<int> to;
  };
  // The requests decoded from one read of a connection, until its OnFlush.
  struct ReadBatch {
    std::vector<Request> pool;
    ReplyBatch replies;
    std::vector<std::function<void()>> deferred;  // pool work started by inline handlers
  };

  std::shared_ptr<Handler> Find(const std::string& name) const;
  void MergeBatch(const std::shared_ptr<Connection>& conn, ReadBatch& batch);
  void Run(const std::shared_ptr<Connection>& conn, Request r, ReplyBatch* replies);
  // Encodes the answer to request `id` of rank `to`; appends it to `batch`, or sends it now
  // if null.
  void Reply(const std::shared_ptr<Connection>& conn, int to, uint64_t id, const absl::StatusOr<Value>& result,
             ReplyBatch* batch, const CallHooks::Scope& scope = nullptr, Timing timing = {});
  // Sends a batch of replies and counts their requests as done.
  void SendBatch(const std::shared_ptr<Connection>& conn, ReplyBatch batch);
  // The requests of these ranks were answered: no longer running.
  void Answered(const std::vector<int>& to);
  // The series a request of `function` from `from` is counted in (bytes received added).
  Timing Arrived(int from, const std::string& function, bool registered, uint64_t bytes);
  // Counts a request of `from` as running; returns how many of its requests now are.
  int Started(int from);
  // The slice of a handler's run, or of a later reply (`in`: the request's flow, 0 for
  // none), for request `id` of `caller`. `context`: the trace context the handler ran in.
  void TraceHandler(Tracer::Name name, int caller, uint64_t id, const Timing& timing, int64_t begin_us, uint64_t in,
                    bool replied, uint64_t context);

  // The read batch of the inline handler running on this I/O thread (see Defer).
  static thread_local ReadBatch* t_read_batch;
  static thread_local int t_handler_depth;

  const std::string self_name_;
  ThreadPool& pool_;
  const Peers peers_;
  const int max_calls_in_flight_;
  std::shared_ptr<CallHooks> hooks_;  // set in setup, then read-only
  CallMetrics* const metrics_;
  Tracer* const tracer_;
  Tracer::Name category_ = 0, peer_arg_ = 0, queued_arg_ = 0;
  HandlerSlots slots_;  // what each thread runs (AppendWaits)

  // Three locks, so that looking up handlers (every request, on I/O threads), counting
  // running handlers (I/O and pool threads) and merging read batches do not contend.
  mutable absl::Mutex mu_;  // handlers_: read per request (shared), written by Register
  absl::flat_hash_map<std::string, std::shared_ptr<Handler>> handlers_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex idle_mu_;
  int inflight_ ABSL_GUARDED_BY(idle_mu_) = 0;
  absl::flat_hash_map<int, int> inflight_by_peer_ ABSL_GUARDED_BY(idle_mu_);  // rank (-1: unidentified)
  absl::Mutex batch_mu_;
  absl::flat_hash_map<Connection*, ReadBatch> batches_ ABSL_GUARDED_BY(batch_mu_);
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CALLS_DISPATCHER_H_
