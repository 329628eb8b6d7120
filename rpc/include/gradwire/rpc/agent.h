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
// The failure model (every layer above follows it; errors.h words it):
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
//   Exceptions become a Status at one boundary (the dispatcher, errors.h). A failing call
//   never affects other calls; the agent keeps serving. Retries go through one policy
//   (retry.h) on the agent's TimerQueue, and only of UNAVAILABLE.
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
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/statistics.h"
#include "gradwire/rpc/store.h"
#include "gradwire/rpc/timer_queue.h"
#include "gradwire/rpc/security.h"
#include "gradwire/rpc/transport.h"
#include "gradwire/rpc/value.h"

namespace gw::rpc {

template <typename T>
class RRef;
struct RRefStats;

struct WorkerInfo {
  std::string name;
  int rank = 0;
  std::string address;  // transport address
  int64_t pid = 0;
};

struct AgentOptions {
  std::string name;  // empty: "worker<rank>"
  int rank = 0;      // ignored with `join`
  int world_size = 1;
  // The ranks the group may grow to as workers join (0: world_size, a fixed group). Every
  // worker of Start's group needs the same value.
  int max_world_size = 0;
  // Join a running group (agent.h, elastic groups) instead of forming one: rank,
  // world_size and max_world_size come from the group.
  bool join = false;
  // The store's address: host:port, or etcd://HOST:PORT/JOB for an etcd cluster (store.h).
  std::string rendezvous = "127.0.0.1:29500";
  bool host_store = true;  // rank 0 hosts the store at `rendezvous` (never for etcd)
  std::string run_id = "gradwire";  // namespace of this group's keys in the store
  // "shm" (default): tcp, plus cross-memory attach for large tensors between processes
  // on the same host, negotiated per connection; "tcp"; or "grpc".
  std::string transport = "shm";
  // The address the transport binds: one of this host's, or a wildcard (0.0.0.0, ::).
  std::string listen_host = "127.0.0.1";
  // The host peers dial, announced in the store. Empty: listen_host, or when that is a
  // wildcard, the address of the interface that reaches the rendezvous host.
  std::string advertise_host;
  absl::Duration start_timeout = absl::Seconds(60);
  absl::Duration default_timeout = absl::Seconds(60);
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // Failure detection (the failure model above): a peer this worker has a connection to
  // and has heard nothing from for heartbeat_interval is sent a heartbeat, which its I/O
  // thread answers at once (however long its handlers compute); a peer silent for
  // peer_timeout is declared dead (frozen, its host gone, or cut off), so it is reported
  // within peer_timeout + heartbeat_interval (3 s by default) of the last frame it sent.
  // Traffic counts as hearing: a busy connection is never pinged. A zero interval turns
  // heartbeats off (then only a closed connection declares a peer dead); otherwise Start
  // refuses a peer_timeout below twice the interval (INVALID_ARGUMENT). A single frame
  // that takes longer than peer_timeout to arrive (gigabytes over a slow link) looks like
  // silence: raise peer_timeout for such links.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration peer_timeout = absl::Milliseconds(2500);
  // How long Sync() polls for the reply before sleeping (0: never polls).
  absl::Duration sync_spin = absl::Microseconds(200);
  int worker_threads = 2;
  // Who may talk to this worker (security.h): the job's secret (on by default: a group of
  // more than one worker needs one), TLS, and limits per peer. Start takes what is not set
  // here from the environment (GRADWIRE_SECRET_FILE / GRADWIRE_SECRET, as `gradwire
  // launch` sets them; GRADWIRE_TLS_*; Security::FromEnv), and hands it to the transport
  // and the rendezvous store (transport_options.security is overwritten).
  Security security;
  TransportOptions transport_options;
  // At graceful shutdown, owned RRef values still referenced by other workers are
  // logged (kWarn) or also make Shutdown fail with FAILED_PRECONDITION (kError).
  enum class LeakCheck { kOff, kWarn, kError };
  LeakCheck rref_leak_check = LeakCheck::kWarn;

  // From the environment, as set by `gradwire launch` or torchrun: RANK, WORLD_SIZE,
  // MASTER_ADDR, MASTER_PORT (required unless GRADWIRE_RDZV is set); or by srun
  // (SLURM_PROCID, SLURM_NTASKS, rank 0's host from SLURM_NODELIST, MASTER_PORT 29500 +
  // SLURM_JOB_ID % 10000 unless set), by mpirun (OMPI_COMM_WORLD_RANK/SIZE, or
  // PMI_RANK/SIZE; MASTER_ADDR required, MASTER_PORT 29500 unless set), or a Kubernetes
  // Indexed Job (JOB_COMPLETION_INDEX; WORLD_SIZE and MASTER_ADDR from the manifest);
  //   GRADWIRE_RDZV       etcd://HOST:PORT/JOB: meet through that etcd (rendezvous; host_store
  //                       false; MASTER_ADDR and MASTER_PORT are then ignored, and the etcd
  //                       host takes MASTER_ADDR's part in choosing addresses below);
  // GRADWIRE_WORKER_NAME, GRADWIRE_TRANSPORT, GRADWIRE_RUN_ID (optional);
  // GRADWIRE_MAX_WORLD_SIZE (max_world_size), GRADWIRE_JOIN=1 (join; RANK is then not
  // needed, WORLD_SIZE still is, as the launcher sets it);
  // the security settings (security: Security::FromEnv, the secret, TLS files, limits);
  // GRADWIRE_HEARTBEAT_INTERVAL and GRADWIRE_PEER_TIMEOUT (optional durations such as
  // "500ms", "3s": heartbeat_interval, peer_timeout); GRADWIRE_FAULTS (optional: faults to inject, as
  // ParseFaults reads them, into transport_options.faults; every worker needs it; the
  // agent names itself to its transport, TransportOptions::self_name). Addresses (as
  // torchrun and NCCL let users pick an interface):
  //   GRADWIRE_LISTEN     listen_host (an address of this host, or 0.0.0.0 / ::);
  //   GRADWIRE_ADVERTISE  advertise_host (when only it is set, the agent listens on the
  //                       wildcard address of its family: the advertised address may be
  //                       one this host does not own, e.g. behind NAT).
  // Neither set: when MASTER_ADDR is loopback (127.x, localhost, ::1) the agent listens
  // on and advertises 127.0.0.1, as a local job always did; otherwise both are the
  // address of this host's interface that routes to MASTER_ADDR (found without sending
  // anything). INVALID_ARGUMENT when a variable is missing or malformed, or when
  // MASTER_ADDR (GRADWIRE_RDZV's host) cannot be resolved or reached (the message says
  // which variable to set).
  static absl::StatusOr<AgentOptions> FromEnv();
};

struct CallOptions {
  absl::Duration timeout = absl::ZeroDuration();  // zero: the agent's default_timeout
};

// A change of the group's members (Agent::WatchMembers).
struct MemberChange {
  enum class Kind { kJoined, kLeft };
  Kind kind = Kind::kJoined;
  WorkerInfo worker;
};

// Who is calling a handler.
struct CallInfo {
  std::string caller;  // worker name, or "unknown" before its hello arrived
  std::string function;
  int caller_rank = -1;
};

using RawHandler = std::function<Future<Value>(const CallInfo&, ValueList)>;

// Where a handler runs.
enum class HandlerMode {
  // On the agent's worker pool (default): handlers may block or take long.
  kPool,
  // On the transport I/O thread that received the request, with no thread hop: for
  // handlers that are quick and never block (lookups, small arithmetic, parameter pulls).
  // A blocking inline handler stalls every connection of this worker.
  kInline,
};

struct RegisterOptions {
  HandlerMode mode = HandlerMode::kPool;
};

namespace internal {

template <typename T>
struct FnTraits : FnTraits<decltype(&T::operator())> {};
template <typename C, typename R, typename... A>
struct FnTraits<R (C::*)(A...) const> {
  using Ret = R;
  using Args = std::tuple<std::decay_t<A>...>;
};
template <typename C, typename R, typename... A>
struct FnTraits<R (C::*)(A...)> : FnTraits<R (C::*)(A...) const> {};
template <typename R, typename... A>
struct FnTraits<R (*)(A...)> {
  using Ret = R;
  using Args = std::tuple<std::decay_t<A>...>;
};

template <typename Tuple, size_t... I>
absl::Status ArgsFromValues([[maybe_unused]] const ValueList& args, [[maybe_unused]] Tuple* out,
                            std::index_sequence<I...>) {
  absl::Status status;
  [[maybe_unused]] auto one = [&](auto index, auto& slot) {
    if (!status.ok()) return;
    constexpr size_t i = decltype(index)::value;
    using T = std::decay_t<decltype(slot)>;
    absl::StatusOr<T> v = ValueTraits<T>::From(args[i]);
    if (!v.ok()) {
      status = absl::InvalidArgumentError(absl::StrCat("argument ", i + 1, ": ", v.status().message()));
    } else {
      slot = std::move(*v);
    }
  };
  (one(std::integral_constant<size_t, I>{}, std::get<I>(*out)), ...);
  return status;
}

// Turns whatever a handler returned into a Future<Value>.
template <typename R>
struct ResultAdapter {
  static Future<Value> Adapt(Executor& ex, R r) {
    return MakeReadyFuture<Value>(ex, ValueTraits<R>::To(std::move(r)));
  }
};
template <>
struct ResultAdapter<absl::Status> {
  static Future<Value> Adapt(Executor& ex, absl::Status s) {
    return MakeReadyFuture<Value>(ex, s.ok() ? absl::StatusOr<Value>(Value()) : absl::StatusOr<Value>(s));
  }
};
template <typename T>
struct ResultAdapter<absl::StatusOr<T>> {
  static Future<Value> Adapt(Executor& ex, absl::StatusOr<T> r) {
    if (!r.ok()) return MakeReadyFuture<Value>(ex, r.status());
    return MakeReadyFuture<Value>(ex, ValueTraits<T>::To(std::move(*r)));
  }
};
template <typename T>
struct ResultAdapter<Future<T>> {
  // Converted on the thread that completes the handler's future: no thread hop.
  static Future<Value> Adapt(Executor&, Future<T> f) {
    if constexpr (std::is_same_v<T, Value>) {
      return f;
    } else {
      return Map<Value>(f, [](const absl::StatusOr<T>& r) -> absl::StatusOr<Value> {
        if (!r.ok()) return r.status();
        return ValueTraits<T>::To(*r);
      });
    }
  }
};

template <typename F>
RawHandler MakeHandler(F fn, Executor& ex) {
  using Traits = FnTraits<std::decay_t<F>>;
  using Args = typename Traits::Args;
  using Ret = typename Traits::Ret;
  return [fn = std::move(fn), &ex](const CallInfo& info, ValueList values) -> Future<Value> {
    constexpr size_t n = std::tuple_size_v<Args>;
    if (values.size() != n) {
      return MakeReadyFuture<Value>(
          ex, absl::InvalidArgumentError(absl::StrCat("'", info.function, "' takes ", n,
                                                      " argument(s), got ", values.size())));
    }
    Args args;
    if (absl::Status s = ArgsFromValues(values, &args, std::make_index_sequence<n>{}); !s.ok()) {
      return MakeReadyFuture<Value>(ex, absl::InvalidArgumentError(absl::StrCat(
                                            "'", info.function, "' ", s.message())));
    }
    if constexpr (std::is_void_v<Ret>) {
      std::apply(fn, std::move(args));
      return MakeReadyFuture<Value>(ex, Value());
    } else {
      return ResultAdapter<Ret>::Adapt(ex, std::apply(fn, std::move(args)));
    }
  };
}

// What a protocol handler returns (Reply, absl::StatusOr<Reply>, Future<Reply>, or
// absl::Status when Reply is Ack), as the Future<Value> of the answer.
template <typename M, typename R>
Future<Value> AdaptReply(Executor& ex, R r) {
  if constexpr (std::is_same_v<R, absl::Status>) {
    static_assert(std::is_same_v<typename M::Reply, Ack>, "only a message answered by Ack may have a handler returning Status");
    return MakeReadyFuture<Value>(ex, r.ok() ? absl::StatusOr<Value>(ValueTraits<Ack>::To(Ack{})) : absl::StatusOr<Value>(r));
  } else {
    return ResultAdapter<R>::Adapt(ex, std::move(r));
  }
}

// The handler of protocol message M: decodes M from the call's arguments (after the
// owned value of type Self, for a method message) and runs fn(info, M) or fn(info, self, M).
template <typename M, typename Self, typename F>
RawHandler MakeProtocolHandler(F fn, Executor& ex) {
  constexpr bool kMethod = !std::is_void_v<Self>;
  return [fn = std::move(fn), &ex](const CallInfo& info, ValueList values) -> Future<Value> {
    auto refuse = [&](absl::string_view why) {
      return MakeReadyFuture<Value>(ex, absl::InvalidArgumentError(absl::StrCat(info.function, " from ", info.caller, ": ", why)));
    };
    if constexpr (kMethod) {
      if (values.empty()) return refuse("no value to call the method on");
      absl::StatusOr<Self> self = ValueTraits<Self>::From(values[0]);
      if (!self.ok()) return refuse(self.status().message());
      absl::StatusOr<M> m = ValueTraits<M>::FromList(ValueList(std::make_move_iterator(values.begin() + 1),
                                                               std::make_move_iterator(values.end())));
      if (!m.ok()) return refuse(m.status().message());
      return AdaptReply<M>(ex, fn(info, *std::move(self), *std::move(m)));
    } else {
      absl::StatusOr<M> m = ValueTraits<M>::FromList(values);
      if (!m.ok()) return refuse(m.status().message());
      return AdaptReply<M>(ex, fn(info, *std::move(m)));
    }
  };
}

// Appends a call argument converted with ValueTraits; a CallOptions sets the options.
template <typename A>
void AddArg(ValueList* values, CallOptions* options, A&& a) {
  if constexpr (std::is_same_v<std::decay_t<A>, CallOptions>) {
    *options = a;
  } else {
    values->push_back(ValueTraits<std::decay_t<A>>::To(std::forward<A>(a)));
  }
}

template <typename R>
absl::StatusOr<R> ConvertResult(absl::StatusOr<Value> v, const std::string& to,
                                const std::string& function) {
  if (!v.ok()) return v.status();
  if constexpr (std::is_same_v<R, Value>) {
    return std::move(*v);
  } else {
    absl::StatusOr<R> r = ValueTraits<R>::From(*v);
    if (!r.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("result of ", to, ".", function, ": ",
                                                     r.status().message()));
    }
    return r;
  }
}

}  // namespace internal

class Agent;

namespace internal {
template <typename F>
struct IsStdFunction : std::false_type {};
template <typename R, typename... A>
struct IsStdFunction<std::function<R(A...)>> : std::true_type {};
}  // namespace internal

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

}  // namespace gw::rpc

#include "gradwire/rpc/rref.h"  // RRef<T>, Agent::Remote and Agent::Own

#endif  // GRADWIRE_RPC_AGENT_H_
