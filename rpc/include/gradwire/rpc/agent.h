// Agent: one process's endpoint in a group of named workers that call each other's
// registered functions with tensors as arguments.
//
// Contract
//   - Agent::Start joins the group through the rendezvous store (hosted by rank 0 unless
//     told otherwise, or an etcd cluster: AgentOptions::rendezvous "etcd://HOST:PORT/JOB")
//     and returns once every worker has joined, or an error naming the missing ranks
//     after start_timeout. Through etcd nobody hosts the store, JOB namespaces the keys
//     (jobs sharing one etcd never mix), an etcd that restarts meanwhile only delays the
//     rendezvous, and a graceful Shutdown's last worker out removes the run's keys, so
//     the job's name can be used again; a job that did not shut down gracefully leaves
//     them (`etcdctl del --prefix /gradwire/JOB/` removes them; or use a new JOB).
//   - Register(name, fn) exposes a C++ callable (in Start's `setup`, so that it exists
//     before any peer can call; registering later is allowed, and a peer that calls too
//     early gets NOT_FOUND); its parameter and return types must have
//     ValueTraits (value.h). fn may return T, absl::Status, absl::StatusOr<T> or
//     Future<T> (to answer later). Handlers run on the agent's worker pool. Names that
//     start with "__" are reserved for gradwire's own protocols (message.h): Register
//     refuses them with INVALID_ARGUMENT.
//   - Async/Sync call a function on a worker by name. Every call has a deadline
//     (CallOptions::timeout, else AgentOptions::default_timeout).
//   - Handle<M>/Send<M> serve and send the typed messages of gradwire's layers (message.h).
//   - Every connection opens with a hello carrying the protocol version: a peer built
//     with an incompatible version is refused at connect time, and calls to it fail with
//     FAILED_PRECONDITION naming both versions.
//
// The failure model, which calls, RRefs, distributed autograd and every layer above
// follow, is worded in errors.h.
//
//   - Shutdown(graceful=true): stops new calls, waits for this worker's pending calls,
//     then waits (bounded by shutdown_timeout) until every worker reached shutdown while
//     still serving their calls, then closes. Shutdown(false) closes at once and fails
//     pending calls with CANCELLED. The destructor does Shutdown(false) if needed.
//   - Elastic groups: a job started with max_world_size above world_size may grow. A
//     worker started with AgentOptions::join (GRADWIRE_JOIN=1) joins the running group
//     instead of forming one: Start gets it the next free rank (world_size, world_size+1,
//     ...; RESOURCE_EXHAUSTED when max_world_size ranks are used), finds the members in
//     the store and introduces itself to each (its hello carries its record), so every
//     member can call it by name once its Start returned, and each member's
//     WatchMembers functions see it join. Leave() takes a worker out of a running group
//     (Shutdown ends the whole group's run): it stops calling, waits for its own calls,
//     tells every member (their WatchMembers see it leave, and the layers that hold
//     state for it let go, as for a dead peer: RRefs it owns, autograd contexts it took
//     part in, parameter-server trainers; calls to it fail at once with UNAVAILABLE "<name> is unavailable: it
//     left the job"), finishes serving the requests it has, and closes; the graceful
//     Shutdown of the others does not wait for it (nor for a worker that joined and died:
//     its connections closed). members() is the group now (those
//     that joined included, those that left not); workers() stays Start's group. With a
//     store hosted by rank 0, rank 0 cannot leave (use etcd, where any worker may).
//   - A worker that dies and is started again with the same rank (and name) announces
//     its new address in the store; calls to it fail with UNAVAILABLE while it is down
//     and reach the new process once it has joined (the agent re-reads the address when
//     dialling fails). workers() keeps the addresses seen at Start.
//   - Addresses: the transport binds AgentOptions::listen_host and the agent announces
//     advertise_host (or, when empty, the listen host; when that is a wildcard such as
//     0.0.0.0, the address of this host's interface that reaches the rendezvous host) in
//     the store: every peer must be able to dial it. A job whose workers run on several
//     hosts needs addresses other than loopback (FromEnv picks them: see there).
//     transport_stats() says how much went through shared memory, which is used only
//     between processes that share this host's memory and network namespace.
//   - statistics() is this worker's Statistics (statistics.h): the agent's own samples
//     (gradwire_rpc_*, gradwire_rref_*, gradwire_shm_*) and those its layers add
//     (serving: gradwire_serve_*). StatisticsOf(worker) collects another worker's (one
//     message, answered on its transport thread) or, for this worker, its own.
//   - WatchPeers(fn) tells a layer (collectives, serving) which workers were declared dead.
//   - Remote/Own create remote references (rref.h); rref_stats() counts them and
//     AwaitRRefs waits (on events, not by polling) until they satisfy a condition.
//   - Thread-safe: Register, calls and Shutdown may be used from any thread.
//   - Start turns off Abseil's mutex deadlock detector for the process unless the
//     environment sets GRADWIRE_MUTEX_DEADLOCK_DETECTION=1 (gradwire's tests do). Debian's
//     libabsl is built without NDEBUG, so the detector, meant for debug builds, otherwise
//     runs on every absl::Mutex lock: a process-wide graph behind one global spin lock,
//     measured at ~30% of the CPU of small calls (BENCHMARKS.md, issue 12).
#ifndef GRADWIRE_RPC_AGENT_H_
#define GRADWIRE_RPC_AGENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gradwire/rpc/call_hooks.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/executor.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/internal/handler.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/rpc/security.h"
#include "gradwire/rpc/statistics.h"
#include "gradwire/rpc/store.h"
#include "gradwire/rpc/timer_queue.h"
#include "gradwire/rpc/transport.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/worker.h"

namespace gw::rpc {

class Agent;
class Tracer;  // trace.h
class Waits;   // waits.h

// What Agent::Start runs before announcing the worker: any callable taking Agent& and
// returning void or absl::Status. An error makes Start fail with it (e.g. a layer's
// Install that failed).
class Setup {
 public:
  Setup() = default;
  Setup(std::nullptr_t) {}  // NOLINT(runtime/explicit)
  template <typename F, std::enable_if_t<std::is_invocable_v<F&, Agent&> && !std::is_same_v<std::decay_t<F>, Setup>, int> = 0>
  Setup(F fn) {  // NOLINT(runtime/explicit)
    if constexpr (std::is_pointer_v<F> || internal::IsStdFunction<F>::value) {
      if (!fn) return;  // an empty std::function or a null function pointer
    }
    fn_ = [fn = std::move(fn)](Agent& agent) mutable -> absl::Status {
      if constexpr (std::is_void_v<std::invoke_result_t<F&, Agent&>>) {
        fn(agent);
        return absl::OkStatus();
      } else {
        return fn(agent);
      }
    };
  }
  absl::Status operator()(Agent& agent) const { return fn_ ? fn_(agent) : absl::OkStatus(); }

 private:
  std::function<absl::Status(Agent&)> fn_;
};

class Agent {
 public:
  // `setup` runs before this worker is announced to the others (register functions
  // there: then no peer can call before they exist). In setup, self() and Register work;
  // workers() is not known yet. If setup fails, Start fails with its error.
  static absl::StatusOr<std::shared_ptr<Agent>> Start(AgentOptions options, Setup setup = {});
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  const WorkerInfo& self() const;
  const std::vector<WorkerInfo>& workers() const;  // Start's group, by rank
  // The group now: Start's group and the workers that joined since, less those that left.
  std::vector<WorkerInfo> members() const;
  // Any member's record, also of one that joined later (NOT_FOUND: no such worker).
  absl::StatusOr<WorkerInfo> Worker(const std::string& name) const;
  // The name of a rank ("rank 7" when it has none).
  std::string NameOf(int rank) const;
  // UNAVAILABLE naming `rank` and why it is gone: it left the job, or was declared dead.
  absl::Status PeerGoneError(int rank) const;
  Store& store();
  Executor& executor();
  // Runs quick callbacks at given times (deadlines, retry backoff; retry.h).
  TimerQueue& timers();
  // A fresh id, unique in the job (global_id.h): every layer's ids come from here.
  GlobalId NewId();
  const AgentOptions& options() const;

  // REQUIRES: `name` is not registered yet (else ALREADY_EXISTS) and is not reserved
  // (else INVALID_ARGUMENT).
  absl::Status RegisterRaw(const std::string& name, RawHandler handler, RegisterOptions options = {});
  template <typename F>
  absl::Status Register(const std::string& name, F fn, RegisterOptions options = {}) {
    return RegisterRaw(name, internal::MakeHandler(std::move(fn), executor()), options);
  }

  // Serves protocol message M (message.h) with fn(const CallInfo&, M).
  template <ProtocolMessage M, typename F>
  absl::Status Handle(F fn, RegisterOptions options = {}) {
    static_assert(IsReservedName(M::kFunction), "protocol messages live in the reserved namespace");
    return RegisterProtocol(M::kFunction, internal::MakeProtocolHandler<M, void>(std::move(fn), executor()), options);
  }
  // Serves method message M on values of type T owned here: fn(const CallInfo&, T, M),
  // reached through RRef<T>::Send<M> (rref.h).
  template <typename T, ProtocolMessage M, typename F>
  absl::Status HandleMethod(F fn, RegisterOptions options = {}) {
    static_assert(IsReservedName(M::kFunction), "protocol messages live in the reserved namespace");
    return RegisterProtocol(M::kFunction, internal::MakeProtocolHandler<M, T>(std::move(fn), executor()), options);
  }
  // Sends protocol message M to worker `to`; the future (or `done`, called on the
  // completing thread: quick, non-blocking) gets M::Reply or the call's error.
  template <ProtocolMessage M>
  Future<typename M::Reply> Send(const std::string& to, M message, CallOptions options = {}) {
    Promise<typename M::Reply> promise(executor());
    Send(to, std::move(message), options,
         [promise](absl::StatusOr<typename M::Reply> r) { promise.Set(std::move(r)); });
    return promise.future();
  }
  template <ProtocolMessage M, typename Done>
  void Send(const std::string& to, M message, CallOptions options, Done done) {
    Value fields = ValueTraits<M>::To(std::move(message));
    CallRaw(to, M::kFunction, std::move(std::get<ValueList>(fields.storage())), options,
            [to, done = std::move(done)](absl::StatusOr<Value> v) mutable {
              done(internal::ConvertResult<typename M::Reply>(std::move(v), to, M::kFunction));
            });
  }

  // Completion runs on a transport thread: it must be quick and must not block.
  void CallRaw(const std::string& to, const std::string& function, ValueList args,
               CallOptions options, std::function<void(absl::StatusOr<Value>)> done);

  // Arguments are converted with ValueTraits; a CallOptions among them sets the options.
  template <typename R, typename... Args>
  Future<R> Async(const std::string& to, const std::string& function, Args&&... args) {
    CallOptions options;
    ValueList values;
    (internal::AddArg(&values, &options, std::forward<Args>(args)), ...);
    Promise<R> promise(executor());
    CallRaw(to, function, std::move(values), options,
            [promise, to, function](absl::StatusOr<Value> v) {
              promise.Set(internal::ConvertResult<R>(std::move(v), to, function));
            });
    return promise.future();
  }

  template <typename R, typename... Args>
  absl::StatusOr<R> Sync(const std::string& to, const std::string& function, Args&&... args) {
    // The call carries its own deadline; the wait only guards against a lost completion.
    Future<R> f = Async<R>(to, function, std::forward<Args>(args)...);
    (void)f.WaitSpinning(absl::Now() + absl::Hours(24 * 365), options().sync_spin);
    return f.Get(absl::ZeroDuration());
  }

  // Remote references (rref.h): runs `function` on worker `to` and returns at once an
  // RRef to its result, owned by `to`; Own makes an RRef owned by this worker.
  template <typename T, typename... Args>
  RRef<T> Remote(const std::string& to, const std::string& function, Args&&... args);
  template <typename T>
  RRef<T> Own(T value);
  RRefPtr RemoteRaw(const std::string& to, const std::string& function, ValueList args,
                    CallOptions options, std::string type);
  RRefPtr OwnRaw(Value value, std::string type);
  RRefStats rref_stats() const;
  // What this agent's transport sent through shared memory (transport.h).
  TransportStats transport_stats() const;
  // Waits until `until(rref_stats())` holds (re-checked whenever the RRef tables change)
  // or the deadline passes; returns whether it holds.
  bool AwaitRRefs(const std::function<bool(const RRefStats&)>& until, absl::Time deadline) const;
  Statistics& statistics();
  Future<std::vector<Sample>> StatisticsOf(const std::string& worker);
  // This worker's spans (trace.h): disabled unless options().trace_dir names a directory.
  Tracer& tracer();
  // What this worker waits for and runs now (waits.h), read by `gradwire debug`.
  Waits& waits();
  // Installs the hooks that follow every call (call_hooks.h). REQUIRES: called in
  // Start's setup, before any call is made or received.
  void SetCallHooks(std::shared_ptr<CallHooks> hooks);
  // Runs fn(rank) on a transport or timer thread whenever a worker is declared dead (it
  // closed or reset its connections, or fell silent past peer_timeout, while this agent
  // serves, also during its graceful shutdown: the event CallHooks::OnPeerGone sees, and
  // while it runs, the RRef protocol). fn must be quick and must not block; it may still run once while
  // the returned watch is being destroyed, so it should hold its state weakly. Dropping
  // the watch (the last copy) stops it.
  using PeerWatch = std::shared_ptr<void>;
  [[nodiscard]] PeerWatch WatchPeers(std::function<void(int rank)> fn);

  // Runs fn on a transport thread whenever a worker joins or leaves the group (elastic
  // groups above); quick and non-blocking, as WatchPeers' functions. Dropping the watch
  // stops it.
  [[nodiscard]] PeerWatch WatchMembers(std::function<void(const MemberChange&)> fn);

  // This worker leaves the running group (elastic groups above); the agent is closed
  // afterwards. FAILED_PRECONDITION when it hosts the store or is already shutting down.
  absl::Status Leave();
  absl::Status Shutdown(bool graceful = true);

  class Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  // Registers a protocol handler (reserved names only).
  absl::Status RegisterProtocol(const std::string& name, RawHandler handler, RegisterOptions options);

  std::unique_ptr<Impl> impl_;
};

template <typename T, typename... Args>
RRef<T> Agent::Remote(const std::string& to, const std::string& function, Args&&... args) {
  CallOptions options;
  ValueList values;
  (internal::AddArg(&values, &options, std::forward<Args>(args)), ...);
  return RRef<T>(RemoteRaw(to, function, std::move(values), options, internal::TypeName<T>()));
}

template <typename T>
RRef<T> Agent::Own(T value) {
  return RRef<T>(OwnRaw(ValueTraits<T>::To(std::move(value)), internal::TypeName<T>()));
}

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_AGENT_H_
