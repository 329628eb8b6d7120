// Agent::Impl: the coordinator of one worker's units (rendezvous, members, peers,
// membership, heartbeats, the call table, the dispatcher, the RRef context, the shutdown
// barrier: rpc/src/'s sub-layers, DESIGN.md) and the state machine that decides which
// calls may still go out:
//
//   kRunning -> kShuttingDown (Shutdown: the barrier runs; handlers still serve peers and
//   may call out; RRef control messages still flow) -> kClosed (every pending call fails
//   with the close reason, no new call is sent).
#include "gradwire/rpc/agent.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "agent_options.h"
#include "base/watchers.h"
#include "calls/call_table.h"
#include "calls/dispatcher.h"
#include "cluster/heartbeats.h"
#include "cluster/members.h"
#include "cluster/membership.h"
#include "cluster/peers.h"
#include "cluster/rendezvous.h"
#include "cluster/shutdown_barrier.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/metrics_endpoint.h"
#include "gradwire/rpc/statistics.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/rpc/waits.h"
#include "gradwire/tensor/cuda.h"
#include "observe/call_metrics.h"
#include "rref/rref_context.h"
#include "rref/rref_messages.h"
#include "transport/host_address.h"
#include "wire/codec.h"

namespace gw::rpc {
namespace {

// The prefix of the agent's own protocol messages.
constexpr std::string_view kAgentPrefix = "__agent.";

// Another worker's statistics (Agent::StatisticsOf).
struct StatisticsQuery {
  static constexpr char kFunction[] = "__agent.statistics";
  using Reply = std::vector<Sample>;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// Another worker's clock, for the trace's offsets (Tracer::SetClockOffset).
struct ClockQuery {
  static constexpr char kFunction[] = "__observe.clock";
  using Reply = int64_t;  // the tracer's clock (Tracer::Now) there
  static constexpr auto Fields() { return std::tuple<>(); }
};

using internal::Envelope;
using internal::Kind;

// With at least this many calls of this agent awaiting replies, new requests are sent
// coalesced (Connection::SendCoalesced): throughput over the last microseconds of latency.
constexpr size_t kPipelinedCalls = 4;
// A message this large that arrives is a span of the trace ("rpc.receive": decoding it,
// its tensors out of the frame); smaller ones are seen in their call's spans only, which
// keeps tracing a flood of small calls cheap.
constexpr uint64_t kTracedReceiveBytes = 64 << 10;
// How long the shutdown leak check waits for late RRef deletes.
constexpr absl::Duration kLeakGrace = absl::Milliseconds(500);

// The message of an error a peer answered: "<peer>.<function>: <its message>" for the
// user's functions; gradwire's own protocol functions ("__" names) stay out of it (a
// layer's caller says what it was doing), and only the peer is named, unless the message
// already names it as a whole word (NamesWorker: a reply of worker1 naming worker10 still
// says it came from worker1).
std::string ReplyErrorMessage(const std::string& peer, const std::string& function, absl::string_view message) {
  if (!IsReservedName(function)) return absl::StrCat(peer, ".", function, ": ", message);
  if (NamesWorker(message, peer)) return std::string(message);
  return absl::StrCat(peer, ": ", message);
}

// RRef control messages still go out while this worker shuts down: references released
// late must reach their owners.
bool IsShutdownControl(const std::string& function) {
  return function == internal::RRefFork::kFunction || function == internal::RRefAccept::kFunction ||
         function == internal::RRefDelete::kFunction || function == internal::LeaveNotice::kFunction;
}

}  // namespace

class Agent::Impl {
 public:
  explicit Impl(AgentOptions options)
      : options_(std::move(options)),
        pool_(static_cast<size_t>(std::max(1, options_.worker_threads)), "gw-worker"),
        timers_("gw-timer") {}

  ~Impl() {
    Close(ShuttingDownError(options_.name, "the agent was destroyed"));
    if (dispatcher_) dispatcher_->ClearHandlers();  // while the members their state may call are alive
  }

  absl::Status Start(const Setup& setup, Agent& agent) {
    if (absl::Status s = internal::ResolveOptions(options_); !s.ok()) return s;
    const absl::Time deadline = absl::Now() + options_.start_timeout;
    auto rendezvous = internal::Rendezvous::Join(options_, deadline);
    if (!rendezvous.ok()) return rendezvous.status();
    rendezvous_ = std::move(*rendezvous);
    options_.rendezvous = rendezvous_->store_address();
    if (options_.join) {
      if (absl::Status s = internal::Membership::ClaimRank(*rendezvous_, options_, deadline); !s.ok()) return s;
    }
    if (options_.name.empty()) options_.name = absl::StrCat("worker", options_.rank);
    gpus_ = cuda::Available() ? cuda::DeviceCount() : 0;
    if (absl::Status s = CheckOwnDeviceMaps(); !s.ok()) return s;
    ids_.emplace(options_.rank);
    tracer_ = Tracer::Open(options_.trace_dir, options_.name, options_.rank);
    send_category_ = tracer_->Intern("rpc.send");
    receive_category_ = tracer_->Intern("rpc.receive");
    reply_name_ = tracer_->Intern("(reply)");
    peer_arg_ = tracer_->Intern("peer");
    bytes_arg_ = tracer_->Intern("bytes");
    members_ = std::make_unique<internal::Members>(options_.world_size, options_.max_world_size);

    if (options_.transport_options.self_name.empty()) options_.transport_options.self_name = options_.name;
    options_.transport_options.security = options_.security;
    auto transport = MakeTransport(options_.transport, options_.transport_options);
    if (!transport.ok()) return transport.status();
    transport_ = std::move(*transport);
    peers_ = std::make_unique<internal::Peers>(
        self_, *members_, *transport_, *rendezvous_,
        ConnectionCallbacks{[this](const std::shared_ptr<Connection>& c, Message m) { OnMessage(c, std::move(m)); },
                            [this](const std::shared_ptr<Connection>& c, const absl::Status& s) { OnClose(c, s); },
                            [this](const std::shared_ptr<Connection>& c) { dispatcher_->OnFlush(c); }},
        internal::Peers::Events{[this](const WorkerInfo& w) { membership_->OnJoined(w); },
                                [this](int rank) {
                                  heartbeats_->Heard(rank);
                                  absl::MutexLock lock(&gone_mu_);
                                  gone_.erase(rank);  // reached again
                                }});
    heartbeats_ =
        std::make_unique<internal::Heartbeats>(options_.name, options_.max_world_size, options_.heartbeat_interval,
                                               options_.peer_timeout, *peers_, timers_, [this] { return closed(); });
    membership_ = std::make_unique<internal::Membership>(
        options_, *rendezvous_, *members_, *peers_,
        internal::Membership::Hooks{
            [this](const std::string& to, const std::string& function, absl::Time deadline) {
              return Notify(to, function, deadline);
            },
            [this](std::vector<std::string> names) { rrefs_->SetWorkerNames(std::move(names)); },
            [this](int rank) { return OnLeft(rank); }});
    calls_ = std::make_unique<internal::CallTable>(
        timers_, [this](int rank) { return peers_->Describe(rank); }, tracer_.get(), options_.rank);
    dispatcher_ = std::make_unique<internal::Dispatcher>(
        options_.name, pool_,
        internal::Dispatcher::Peers{
            [this](int rank) { return peers_->Name(rank); },
            [this](int to, uint64_t id, const absl::StatusOr<Value>& result, const CallHooks::Scope& scope) {
              return EncodeReply(to, id, result, scope);
            }},
        options_.security.limits.max_calls_in_flight, &call_metrics_, tracer_.get());

    // The RRef context exists before any peer can reach us.
    internal::RRefContext::Hooks hooks;
    hooks.agent = &agent;
    hooks.ids = &*ids_;
    hooks.self_rank = options_.rank;
    hooks.world_size = options_.max_world_size;
    hooks.gone_error = [this](int rank) { return PeerGoneError(rank); };
    hooks.default_timeout = options_.default_timeout;
    hooks.max_rrefs_per_peer = options_.security.limits.max_rrefs;
    hooks.invoke = [this](const std::string& caller, const std::string& function, ValueList args) {
      return dispatcher_->InvokeLocal(Info(caller, function), std::move(args), /*here=*/false);
    };
    hooks.invoke_here = [this](const std::string& caller, const std::string& function, ValueList args) {
      return dispatcher_->InvokeLocal(Info(caller, function), std::move(args), /*here=*/true);
    };
    hooks.defer = [this](std::function<void()> fn) { dispatcher_->Defer(std::move(fn)); };
    hooks.has_function = [this](const std::string& function) { return dispatcher_->Has(function); };
    hooks.missing_function = [this](const std::string& function) { return dispatcher_->MissingFunctionError(function); };
    rrefs_ = std::make_shared<internal::RRefContext>(std::move(hooks));
    if (absl::Status s = rrefs_->RegisterFunctions(); !s.ok()) return s;
    if (absl::Status s = agent.Handle<StatisticsQuery>(
            [this](const CallInfo&, StatisticsQuery) { return statistics_.Collect(); }, RegisterOptions{HandlerMode::kInline});
        !s.ok()) {
      return s;
    }
    own_statistics_ = statistics_.Add("agent", [this](std::vector<Sample>& out) { AppendOwnStatistics(out); });
    if (absl::Status s = agent.Handle<WaitsQuery>([this](const CallInfo&, WaitsQuery) { return waits_.Collect(); },
                                                  RegisterOptions{HandlerMode::kInline});
        !s.ok()) {
      return s;
    }
    if (absl::Status s = agent.Handle<ClockQuery>([this](const CallInfo&, ClockQuery) { return tracer_->Now(); },
                                                  RegisterOptions{HandlerMode::kInline});
        !s.ok()) {
      return s;
    }
    own_waits_ = waits_.Add("agent", [this](std::vector<Wait>& out) {
      calls_->AppendWaits(out);
      dispatcher_->AppendWaits(out);
    });
    if (absl::Status s = agent.Handle<internal::JoinNotice>([](const CallInfo&, internal::JoinNotice) { return Ack{}; },
                                                            RegisterOptions{HandlerMode::kInline});
        !s.ok()) {
      return s;
    }
    if (absl::Status s = agent.Handle<internal::LeaveNotice>(
            [this](const CallInfo& info, internal::LeaveNotice) {
              membership_->OnLeaveNotice(info.caller_rank);
              return Ack{};
            },
            RegisterOptions{HandlerMode::kInline});
        !s.ok()) {
      return s;
    }

    if (absl::Status s = ServeMetrics(); !s.ok()) return s;
    absl::StatusOr<std::string> advertise = AdvertiseHost();
    if (!advertise.ok()) return advertise.status();
    auto address = transport_->Listen(options_.listen_host, *advertise, peers_->callbacks());
    if (!address.ok()) {
      return absl::Status(address.status().code(),
                          absl::StrCat(options_.name, ": ", address.status().message(),
                                       " (AgentOptions::listen_host, from GRADWIRE_LISTEN: use an address of this host, "
                                       "or 0.0.0.0 for all of them)"));
    }
    self_ = {options_.name, options_.rank, *address, static_cast<int64_t>(::getpid()), gpus_};
    // Functions are registered before this worker is announced: no peer can call it
    // before its handlers exist.
    if (absl::Status s = setup(agent); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(options_.name, ": setup failed: ", s.message()));
    }
    if (absl::Status s = rendezvous_->Announce(self_); !s.ok()) return s;
    if (absl::Status s = membership_->Form(self_, deadline); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(options_.name, ": ", s.message()));
    }
    if (absl::Status s = CheckPeerDeviceMaps(); !s.ok()) return s;
    heartbeats_->Start();
    if (options_.join) membership_->Introduce(deadline);
    MeasureClockOffset();
    if (options_.stall_report_after > absl::ZeroDuration()) WatchStalls();
    return absl::OkStatus();
  }

  // ---------------------------------------------------------------- observability

  // A traced worker measures its clock against rank 0's (the trace's reference) over the
  // job's own connection: the round trip with the shortest time bounds the error.
  void MeasureClockOffset() {
    if (!tracer_->enabled() || options_.rank == 0) return;
    const std::string zero = NameOf(0);
    for (int i = 0; i < 8; ++i) {
      Promise<int64_t> promise(pool_);
      const int64_t sent = tracer_->Now();
      Call(zero, ClockQuery::kFunction, ValueList{}, CallOptions{.timeout = absl::Seconds(1)},
           [promise](absl::StatusOr<Value> v) {
             promise.Set(internal::ConvertResult<int64_t>(std::move(v), "rank 0", ClockQuery::kFunction));
           });
      absl::StatusOr<int64_t> theirs = promise.future().Get(absl::Seconds(2));
      const int64_t received = tracer_->Now();
      if (!theirs.ok()) return;  // no offset: merge says so
      tracer_->SetClockOffset(0, *theirs - (sent + received) / 2, received - sent);
    }
  }

  // Every second, this worker looks for waits older than stall_report_after it has not
  // reported; for each, it asks every member for its waits and logs who waits on whom.
  void WatchStalls() {
    const absl::Duration every = std::min(absl::Seconds(1), options_.stall_report_after);
    stall_timer_ = timers_.At(absl::Now() + every, [this] {
      if (closed()) return;
      CheckStalls();
      WatchStalls();
    });
  }

  void CheckStalls() {
    const double threshold = absl::ToDoubleSeconds(options_.stall_report_after);
    std::vector<Wait> mine = waits_.Collect();
    absl::flat_hash_set<std::string> now_waiting;
    std::vector<const Wait*> fresh;
    for (const Wait& w : mine) {
      if (w.state != "waits" || w.seconds < threshold) continue;
      std::string key = absl::StrCat(w.layer, "|", w.what, "|", absl::StrJoin(w.on, ","));
      if (!reported_stalls_.contains(key)) fresh.push_back(&w);
      now_waiting.insert(std::move(key));
    }
    reported_stalls_ = std::move(now_waiting);  // a wait that ended may be reported again
    if (fresh.empty()) return;
    std::string headline =
        absl::StrCat(options_.name, ": ", fresh.front()->what, " has waited ",
                     absl::FormatDuration(absl::Seconds(static_cast<int64_t>(fresh.front()->seconds))),
                     fresh.size() > 1 ? absl::StrCat(" (and ", fresh.size() - 1, " more)") : "");
    GatherWaits(absl::Seconds(1), [this, headline](std::vector<WorkerWaits> all) {
      std::fprintf(stderr, "gradwire: %s; who waits on whom in the job:\n%s", headline.c_str(),
                   WhoWaitsOnWhom(all).c_str());
      stall_reports_.fetch_add(1, std::memory_order_relaxed);
    });
  }

  // Asks every present member (this one too) for its waits; `done` gets them all, by rank,
  // each answered or not (a member that does not answer within `timeout` is named so).
  void GatherWaits(absl::Duration timeout, std::function<void(std::vector<WorkerWaits>)> done) {
    struct Gather {
      absl::Mutex mu;
      std::vector<WorkerWaits> all ABSL_GUARDED_BY(mu);
      int left ABSL_GUARDED_BY(mu) = 0;
      std::function<void(std::vector<WorkerWaits>)> done;
    };
    auto gather = std::make_shared<Gather>();
    gather->done = std::move(done);
    const std::vector<WorkerInfo> present = members_->Present();
    {
      absl::MutexLock lock(&gather->mu);
      gather->left = static_cast<int>(present.size());
      for (const WorkerInfo& w : present) gather->all.push_back({.worker = w.name, .rank = w.rank});
    }
    auto finish = [gather](size_t i, absl::StatusOr<Value> v) {
      std::function<void(std::vector<WorkerWaits>)> report;
      std::vector<WorkerWaits> all;
      {
        absl::MutexLock lock(&gather->mu);
        WorkerWaits& w = gather->all[i];
        absl::StatusOr<std::vector<Wait>> waits =
            internal::ConvertResult<std::vector<Wait>>(std::move(v), w.worker, WaitsQuery::kFunction);
        w.answered = waits.ok();
        if (waits.ok()) {
          w.waits = std::move(*waits);
        } else {
          w.error = std::string(waits.status().message());
        }
        if (--gather->left > 0) return;
        all = std::move(gather->all);
        report = std::move(gather->done);
      }
      report(std::move(all));
    };
    for (size_t i = 0; i < present.size(); ++i) {
      if (present[i].rank == options_.rank) {
        finish(i, ValueTraits<std::vector<Wait>>::To(waits_.Collect()));
      } else {
        Call(present[i].name, WaitsQuery::kFunction, ValueList{}, CallOptions{.timeout = timeout},
             [finish, i](absl::StatusOr<Value> v) { finish(i, std::move(v)); });
      }
    }
  }

  // The metrics endpoint the environment asks for (metrics_endpoint.h), before the worker
  // is announced: a port it cannot take stops Start.
  absl::Status ServeMetrics() {
    absl::StatusOr<std::optional<MetricsEndpointOptions>> wanted = internal::MetricsFromEnv(options_);
    if (!wanted.ok()) return wanted.status();
    if (!wanted->has_value()) return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(statistics_, **wanted, &waits_);
    if (!endpoint.ok()) return endpoint.status();
    metrics_endpoint_ = std::move(*endpoint);
    std::fprintf(stderr, "gradwire: %s serves its metrics at %s\n", options_.name.c_str(),
                 metrics_endpoint_->url().c_str());
    // Where `gradwire debug` and `gradwire top` find it: a wildcard address is reached at
    // the address this worker advertises to its peers.
    std::string host = (*wanted)->host;
    if (host == "0.0.0.0" || host == "::") {
      absl::StatusOr<std::string> advertised = AdvertiseHost();
      host = advertised.ok() ? *advertised : "127.0.0.1";
    }
    return rendezvous_->store().Set(rendezvous_->Key("metrics/", options_.rank),
                                    absl::StrCat(host, ":", metrics_endpoint_->port()));
  }

  // ---------------------------------------------------------------- device maps

  // Before this worker is announced: every map is this worker's and names GPUs it has.
  absl::Status CheckOwnDeviceMaps() const {
    for (const auto& [peer, map] : options_.device_maps.all()) {
      if (map.from() != options_.name) {
        return absl::InvalidArgumentError(absl::StrCat("device map ", map.from(), " -> ", peer, ": AgentOptions of ",
                                                       options_.name, " hold maps from ", options_.name, " only"));
      }
      if (absl::Status s = map.CheckDevices(gpus_, std::numeric_limits<int>::max()); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Once the group has formed: every map's peer is in it and has the GPUs it names. (A
  // worker of an elastic group that joins later is not checked.)
  absl::Status CheckPeerDeviceMaps() const {
    const std::vector<WorkerInfo> present = members_->Present();
    for (const auto& entry : options_.device_maps.all()) {
      const std::string& peer = entry.first;
      const DeviceMap& map = entry.second;
      auto it = std::find_if(present.begin(), present.end(), [&](const WorkerInfo& w) { return w.name == peer; });
      if (it != present.end()) {
        if (absl::Status s = map.CheckDevices(gpus_, it->gpus); !s.ok()) return s;
      } else if (options_.max_world_size == options_.world_size) {
        return absl::InvalidArgumentError(absl::StrCat("device map ", options_.name, " -> ", peer, ": no worker of ",
                                                       "this group is named ", peer,
                                                       " (its workers: ", members_->PresentNames(), ")"));
      }
    }
    return absl::OkStatus();
  }

  // This worker's map toward `peer`, or none.
  const DeviceMap* MapToward(std::string_view peer) const {
    return options_.device_maps.empty() ? nullptr : &options_.device_maps.Toward(peer);
  }

  // ---------------------------------------------------------------- membership

  // A member left (Membership::OnLeaveNotice, on the I/O thread, once): the layers let go
  // of it as of a dead peer. False once closed.
  bool OnLeft(int rank) {
    State state;
    {
      absl::MutexLock lock(&mu_);
      state = state_;
    }
    if (state == State::kClosed) return false;
    if (state == State::kRunning) rrefs_->OnPeerGone(rank);
    if (hooks_) hooks_->OnPeerGone(rank);
    watchers_->Notify(rank);
    return true;
  }

  absl::Status Leave() {
    if (rendezvous_->hosts_store()) {
      return absl::FailedPreconditionError(absl::StrCat(
          options_.name, " hosts the rendezvous store of this job and cannot leave it (the others would lose it); "
          "run jobs whose every worker may leave with an etcd rendezvous (GRADWIRE_RDZV, gradwire launch --rdzv)"));
    }
    {
      absl::MutexLock lock(&mu_);
      if (state_ != State::kRunning) {
        return absl::FailedPreconditionError(absl::StrCat(options_.name, " cannot leave: it is shutting down already"));
      }
      state_ = State::kShuttingDown;
    }
    const absl::Time deadline = absl::Now() + options_.shutdown_timeout;
    Drain(deadline);
    membership_->TellLeaving(deadline);
    internal::ShutdownBarrier barrier(*rendezvous_, options_.name, options_.rank, options_.world_size,
                                     options_.max_world_size);
    absl::Status departed = barrier.Depart();
    dispatcher_->AwaitIdle(deadline);  // the requests it took still get their answers
    Close(ShuttingDownError(options_.name, "it left the job"));
    if (!departed.ok()) {
      return absl::Status(departed.code(), absl::StrCat(options_.name, " left, but could not record it in the store (",
                                                        departed.message(), "): a graceful shutdown of the others "
                                                        "will wait for it until their shutdown_timeout"));
    }
    return absl::OkStatus();
  }

  // Sends a membership notice (a message without fields) to a member by `deadline`.
  Future<Ack> Notify(const std::string& to, const std::string& function, absl::Time deadline) {
    Promise<Ack> promise(pool_);
    CallOptions call;
    call.timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
    Call(to, function, ValueList{}, call, [promise](absl::StatusOr<Value> v) {
      promise.Set(v.ok() ? absl::StatusOr<Ack>(Ack{}) : absl::StatusOr<Ack>(v.status()));
    });
    return promise.future();
  }

  std::vector<WorkerInfo> members() const { return members_->Present(); }
  std::string NameOf(int rank) const { return members_ ? members_->Name(rank) : absl::StrCat("rank ", rank); }
  absl::Status PeerGoneError(int rank) const {
    return membership_ ? membership_->GoneError(rank) : DeclaredDeadError(NameOf(rank));
  }
  Agent::PeerWatch WatchMembers(std::function<void(const MemberChange&)> fn) {
    return membership_->Watch(std::move(fn));
  }

  // ---------------------------------------------------------------- registry

  absl::Status Register(const std::string& name, RawHandler handler, RegisterOptions options, bool reserved) {
    if (IsReservedName(name) != reserved) {
      return absl::InvalidArgumentError(
          reserved ? absl::StrCat("'", name, "' is not a protocol name: protocol messages start with '",
                                  kReservedPrefix, "'")
                   : absl::StrCat(options_.name, ": function names starting with '", kReservedPrefix,
                                  "' are reserved for gradwire's own protocols; cannot register '", name,
                                  "', choose another name"));
    }
    return dispatcher_->Register(name, std::move(handler), options);
  }

  // ---------------------------------------------------------------- calls

  void Call(const std::string& to, const std::string& function, ValueList args, CallOptions call_options,
            std::function<void(absl::StatusOr<Value>)> done) {
    const int rank = members_->RankOf(to);
    if (rank < 0) {
      done(absl::NotFoundError(absl::StrCat("no worker named '", to, "' (workers: ", members_->PresentNames(), ")")));
      return;
    }
    if (members_->state(rank) == internal::Members::State::kLeft) {
      done(absl::Status(absl::StatusCode::kUnavailable,
                        absl::StrCat("call to ", to, ".", function, " failed: ", PeerGoneError(rank).message())));
      return;
    }
    bool running;
    {
      absl::MutexLock lock(&mu_);
      // While shutting down, handlers still serve peers and may call out.
      running = state_ == State::kRunning ||
                (state_ == State::kShuttingDown && (internal::Dispatcher::InHandler() || IsShutdownControl(function)));
    }
    if (!running) {
      done(ShuttingDownError(options_.name, absl::StrCat("call to ", to, ".", function, " not sent")));
      return;
    }
    const absl::Duration timeout =
        call_options.timeout > absl::ZeroDuration() ? call_options.timeout : options_.default_timeout;
    // A traced call's send span and its call-table entry share one start.
    internal::CallTable::TracedStart traced;
    if (tracer_->enabled()) {
      traced = {.begin_us = tracer_->Now(), .name = tracer_->Intern(function), .context = tracer_->CurrentContext()};
    }
    Envelope env;
    env.kind = Kind::kRequest;
    env.function = function;
    env.payload = Value(std::move(args));
    env.timeout_ms = absl::ToInt64Milliseconds(timeout);
    size_t in_flight = 0;
    internal::CallMetrics::Series& series = call_metrics_.For(internal::CallMetrics::Side::kClient, rank, function);
    env.id = calls_->Add(rank, function, timeout, std::move(done), &in_flight, &series, traced);
    if (env.id == 0) return;  // the agent closed meanwhile: failed with its reason
    auto fail = [&](const absl::Status& s) {
      calls_->Complete(env.id, absl::Status(s.code(), absl::StrCat("call to ", to, ".", function, ": ", s.message())));
    };
    if (absl::Status s = rrefs_->PrepareOutgoing(&env.payload, rank); !s.ok()) return fail(s);
    // The agent's own messages (membership, statistics) belong to no layer's call: the
    // hooks do not see them (a distributed-autograd context current on the sending thread
    // must not travel with a LeaveNotice).
    if (hooks_ && !function.starts_with(kAgentPrefix)) {
      if (absl::Status s = hooks_->OnSendRequest(rank, env.payload, env.meta); !s.ok()) {
        rrefs_->AbandonOutgoing(&env.payload);
        return fail(s);
      }
    }
    absl::StatusOr<Message> message = internal::EncodeEnvelope(env, MapToward(to));
    if (!message.ok()) {
      rrefs_->AbandonOutgoing(&env.payload);
      return fail(absl::InvalidArgumentError(message.status().message()));
    }
    absl::StatusOr<std::shared_ptr<Connection>> conn = peers_->Outgoing(rank);
    if (!conn.ok()) {
      rrefs_->AbandonOutgoing(&env.payload);
      calls_->Complete(env.id, conn.status());
      return;
    }
    const uint64_t bytes = internal::MessageBytes(*message);
    series.Sent(bytes);
    auto on_sent = [this, id = env.id](absl::Status s) {
      if (s.ok()) return;
      if (std::optional<internal::CallTable::Call> call = calls_->Find(id)) {  // name the peer
        s = absl::Status(s.code(), absl::StrCat("call to ", peers_->Describe(call->rank), ".", call->function,
                                                " failed: ", s.message()));
      }
      calls_->Complete(id, s);
    };
    // Many calls in flight: let requests issued close together share one write.
    if (in_flight >= kPipelinedCalls) {
      (*conn)->SendCoalesced(std::move(*message), std::move(on_sent));
    } else {
      (*conn)->Send(std::move(*message), std::move(on_sent));
    }
    if (traced.begin_us != 0) {
      // The request's slice on the calling thread (encoding and handing it to the
      // transport), where its flow arrow to the handler starts.
      tracer_->Record({.category = send_category_,
                       .name = traced.name,
                       .begin_us = traced.begin_us,
                       .end_us = tracer_->Now(),
                       .flow_out = Tracer::CallFlow(options_.rank, env.id),
                       .arg_names = {peer_arg_, bytes_arg_},
                       .arg_values = {rank, static_cast<int64_t>(bytes)},
                       .context = traced.context});
    }
  }

  // ---------------------------------------------------------------- shutdown

  absl::Status Shutdown(bool graceful) {
    {
      absl::MutexLock lock(&mu_);
      if (state_ != State::kRunning) return absl::OkStatus();
      state_ = State::kShuttingDown;
    }
    absl::Status result;
    if (graceful) {
      internal::ShutdownBarrier barrier(*rendezvous_, options_.name, options_.rank, options_.world_size,
                                     options_.max_world_size);
      result = barrier.Run(absl::Now() + options_.shutdown_timeout,
                           {.drain = [this](absl::Time deadline) { Drain(deadline); },
                            .check_leaks = [this] { return CheckLeaks(); },
                            .await_handlers = [this](absl::Time deadline) { dispatcher_->AwaitIdle(deadline); },
                            .gone = [this](int rank) {
                              absl::MutexLock lock(&gone_mu_);
                              return gone_.contains(rank);
                            }});
    }
    Close(ShuttingDownError(options_.name));
    return result;
  }

  // Start failed: closes, and a worker that had claimed a rank to join gives it up, so
  // that the group's graceful shutdown does not wait for it.
  void Abandon(const absl::Status& reason) {
    if (options_.join && options_.rank >= 0 && rendezvous_) {
      (void)internal::ShutdownBarrier(*rendezvous_, options_.name, options_.rank, options_.world_size,
                                      options_.max_world_size)
          .Depart();
    }
    Close(reason);
  }

  void Close(const absl::Status& reason) {
    {
      absl::MutexLock lock(&mu_);
      if (state_ == State::kClosed) return;
      state_ = State::kClosed;
    }
    if (transport_) transport_->Shutdown();  // no more messages arrive
    if (calls_) calls_->Close(reason);
    if (rrefs_) rrefs_->Close();
    timers_.Shutdown();
    pool_.Shutdown();
    if (heartbeats_) heartbeats_->Stop();
    if (peers_) peers_->CloseAll();
    if (rendezvous_) rendezvous_->Close();
    if (tracer_->enabled()) {
      const std::string path = tracer_->path();
      if (absl::Status s = tracer_->Close(); !s.ok()) {
        std::fprintf(stderr, "gradwire: %s: %s\n", options_.name.c_str(), std::string(s.message()).c_str());
      } else {
        std::fprintf(stderr, "gradwire: %s wrote its trace to %s\n", options_.name.c_str(), path.c_str());
      }
    }
  }

  const AgentOptions& options() const { return options_; }
  const WorkerInfo& self() const { return self_; }
  const std::vector<WorkerInfo>& workers() const { return peers_->workers(); }
  absl::StatusOr<WorkerInfo> Worker(const std::string& name) const {
    std::optional<WorkerInfo> w = members_->Get(members_->RankOf(name));
    if (!w) return absl::NotFoundError(absl::StrCat("no worker named '", name, "'"));
    return *w;
  }
  Store& store() { return rendezvous_->store(); }
  Executor& executor() { return pool_; }
  TimerQueue& timers() { return timers_; }
  GlobalId NewId() { return ids_->Next(); }

  RRefPtr RemoteRaw(const std::string& to, const std::string& function, ValueList args, CallOptions options,
                    std::string type) {
    return rrefs_->Remote(members_->RankOf(to), function, std::move(args), options, std::move(type));
  }
  RRefPtr OwnRaw(Value value, std::string type) { return rrefs_->Own(std::move(value), std::move(type)); }
  RRefStats rref_stats() const { return rrefs_->Stats(); }
  TransportStats transport_stats() const { return transport_ ? transport_->stats() : TransportStats{}; }
  bool AwaitRRefs(const std::function<bool(const RRefStats&)>& until, absl::Time deadline) const {
    return rrefs_->AwaitStats(until, deadline);
  }
  Statistics& statistics() { return statistics_; }
  Tracer& tracer() { return *tracer_; }
  Waits& waits() { return waits_; }
  void AppendOwnStatistics(std::vector<Sample>& out) const {
    const RRefStats r = rrefs_->Stats();
    const TransportStats t = transport_stats();
    auto add = [&](const char* name, int64_t value) { out.push_back({name, {}, static_cast<double>(value)}); };
    add("gradwire_rpc_workers", static_cast<int64_t>(members_->Present().size()));
    add("gradwire_rpc_calls_in_flight", static_cast<int64_t>(calls_->size()));
    add("gradwire_rref_owned", r.owned);
    add("gradwire_rref_users", r.users);
    add("gradwire_rref_pending_control", r.pending_control);
    add("gradwire_shm_connections", t.shared_memory_connections);
    add("gradwire_shm_tensors_total", t.shared_memory_tensors);
    add("gradwire_shm_arena_bytes", t.shared_memory_arena_bytes);
    add("gradwire_shm_arena_high_water_bytes", t.shared_memory_arena_high_water_bytes);
    add("gradwire_shm_arena_blocks_in_use", t.shared_memory_arena_blocks_in_use);
    add("gradwire_rpc_worker_pool_threads", static_cast<int64_t>(pool_.num_threads()));
    add("gradwire_rpc_worker_pool_queued", static_cast<int64_t>(pool_.queued()));
    add("gradwire_stall_reports_total", stall_reports_.load(std::memory_order_relaxed));
    add("gradwire_rpc_heartbeats_sent_total", heartbeats_->pings_sent());
    add("gradwire_rpc_peers_declared_silent_total", heartbeats_->declared_dead());
    for (const auto& [rank, running] : dispatcher_->running_by_peer()) {
      out.push_back({"gradwire_rpc_server_requests_running", {{"peer", NameOf(rank)}}, static_cast<double>(running)});
    }
    call_metrics_.Collect(out, [this](int rank) { return NameOf(rank); });
  }
  void SetCallHooks(std::shared_ptr<CallHooks> hooks) {
    hooks_ = hooks;
    dispatcher_->SetHooks(std::move(hooks));
  }
  Agent::PeerWatch WatchPeers(std::function<void(int)> fn) {
    return watchers_->Add([fn = std::move(fn)](const int& rank) { fn(rank); });
  }

 private:
  enum class State { kRunning, kShuttingDown, kClosed };

  bool closed() {
    absl::MutexLock lock(&mu_);
    return state_ == State::kClosed;
  }

  CallInfo Info(const std::string& caller, const std::string& function) const {
    return CallInfo{caller, function, members_->RankOf(caller)};
  }

  // The host this worker announces (AgentOptions::advertise_host).
  absl::StatusOr<std::string> AdvertiseHost() const {
    if (!options_.advertise_host.empty()) return options_.advertise_host;
    if (!internal::IsWildcardHost(options_.listen_host)) return options_.listen_host;
    absl::StatusOr<std::string> store_host = internal::RendezvousHost(options_.rendezvous);
    if (!store_host.ok()) return store_host.status();
    absl::StatusOr<std::string> local = internal::LocalAddressToward(*store_host);
    if (!local.ok()) {
      return absl::Status(local.status().code(),
                          absl::StrCat(options_.name, ": listening on ", options_.listen_host,
                                       ", but which address should the other workers dial? ", local.status().message(),
                                       "; set AgentOptions::advertise_host (GRADWIRE_ADVERTISE)"));
    }
    return *local;
  }

  // ---------------------------------------------------------------- inbound

  void OnMessage(const std::shared_ptr<Connection>& conn, Message m) {
    const int from = peers_->RankOf(conn.get());  // -1 before its hello
    const uint64_t bytes = internal::MessageBytes(m);
    const internal::Placement placement{from >= 0 ? MapToward(peers_->Name(from)) : nullptr, gpus_};
    const int64_t traced_since = bytes >= kTracedReceiveBytes && tracer_->enabled() ? tracer_->Now() : 0;
    absl::StatusOr<Envelope> env = internal::DecodeEnvelope(std::move(m), placement);
    if (!env.ok()) {
      conn->Close(absl::DataLossError(absl::StrCat("bad envelope from ", conn->peer(), ": ", env.status().message())));
      return;
    }
    if (traced_since != 0) {
      tracer_->Record({.category = receive_category_,
                       .name = env->kind == Kind::kRequest ? tracer_->Intern(env->function) : reply_name_,
                       .begin_us = traced_since,
                       .end_us = tracer_->Now(),
                       .arg_names = {peer_arg_, bytes_arg_},
                       .arg_values = {from, static_cast<int64_t>(bytes)}});
    }
    if (from >= 0) heartbeats_->Heard(from);
    switch (env->kind) {
      case Kind::kHello:
        (void)peers_->OnHello(conn, *env);
        return;
      case Kind::kRequest:
        OnRequest(conn, from, *std::move(env), bytes);
        return;
      case Kind::kResponse:
        OnResponse(from, *std::move(env), bytes);
        return;
      case Kind::kPing:
        if (from >= 0) internal::Heartbeats::Answer(*conn);
        return;
      case Kind::kPong:
        return;  // hearing it was the point
    }
  }

  void OnRequest(const std::shared_ptr<Connection>& conn, int from, Envelope env, uint64_t bytes) {
    if (from < 0) {
      if (!conn->closed()) {
        conn->Close(absl::DataLossError(absl::StrCat(conn->peer(), " sent a request before its hello")));
      }
      return;
    }
    if (env.has_rrefs) {
      // RRefs in the payload become references held here (rref.h protocol).
      if (absl::Status s = rrefs_->AdoptIncoming(&env.payload, from); !s.ok()) {
        // Its own code: malformed (INVALID_ARGUMENT), freed (NOT_FOUND), a dead worker's
        // (UNAVAILABLE), or we are shutting down.
        dispatcher_->Refuse(conn, from, env.id, absl::Status(s.code(), absl::StrCat(env.function, ": ", s.message())),
                            env.function, bytes);
        return;
      }
    }
    dispatcher_->OnRequest(conn, from, std::move(env), bytes);
  }

  void OnResponse(int from, Envelope env, uint64_t bytes) {
    if (env.has_rrefs) {
      // Also for a reply to a call that already timed out: its RRefs must still be
      // adopted (and then dropped), or their owner would keep them.
      absl::Status s = from < 0 ? absl::InvalidArgumentError("RRefs from an unidentified peer")
                                : rrefs_->AdoptIncoming(&env.payload, from);
      if (!s.ok()) {
        calls_->Complete(env.id, s, bytes);
        return;
      }
    }
    if (hooks_ && env.status.ok()) {
      if (absl::Status s = hooks_->OnReceiveReply(from, env.payload, env.meta); !s.ok()) {
        calls_->Complete(env.id, s, bytes);
        return;
      }
    }
    if (env.status.ok()) {
      calls_->Complete(env.id, std::move(env.payload), bytes);
      return;
    }
    std::optional<internal::CallTable::Call> call = calls_->Find(env.id);
    if (!call) return;  // timed out or failed already
    calls_->Complete(env.id,
                     absl::Status(env.status.code(),
                                  ReplyErrorMessage(peers_->Name(call->rank), call->function, env.status.message())),
                     bytes);
  }

  absl::StatusOr<Message> EncodeReply(int to, uint64_t id, const absl::StatusOr<Value>& result,
                                      const CallHooks::Scope& scope) {
    Envelope env = internal::ReplyEnvelope(id, result);
    if (absl::Status s = rrefs_->PrepareOutgoing(&env.payload, to); !s.ok()) {
      env.payload = Value();
      env.status = s;
    } else if (hooks_ && env.status.ok()) {
      if (absl::Status h = hooks_->OnSendReply(to, scope, env.payload, env.meta); !h.ok()) {
        rrefs_->AbandonOutgoing(&env.payload);
        env.payload = Value();
        env.status = h;
      }
    }
    absl::StatusOr<Message> m = internal::EncodeEnvelope(env);
    if (!m.ok()) {
      rrefs_->AbandonOutgoing(&env.payload);
      env.payload = Value();
      env.meta = Value();
      env.status = absl::InternalError(absl::StrCat("cannot encode the result: ", m.status().message()));
      m = internal::EncodeEnvelope(env);
    }
    return m;
  }

  void OnClose(const std::shared_ptr<Connection>& conn, const absl::Status& reason) {
    dispatcher_->OnFlush(conn);  // requests read before the close still run (their replies are dropped)
    auto [rank, outgoing] = peers_->Forget(conn);
    State state;
    {
      absl::MutexLock lock(&mu_);
      state = state_;
    }
    // Connections close when the peer is dead or shut down (or was declared dead: the
    // heartbeats close them). Only a peer that closed or reset the connection counts as
    // gone (not a malformed frame or a refused hello, after which the peer may well be
    // alive). Its references go (rref.h), but not while we shut down ourselves: peers
    // closing then is expected, and dropping their forks would hide the leaks the shutdown
    // check reports. The other layers are told while this worker still serves, also during
    // its graceful shutdown (a parameter server serves its trainers from there).
    // Our outgoing connection to `rank` died: its calls cannot be answered. Failed before
    // the layers are told: a call one of them makes in answer (on a new connection) is
    // not among them.
    if (outgoing) calls_->FailPeer(rank, reason);
    if (rank >= 0 && reason.code() == absl::StatusCode::kUnavailable) {
      absl::MutexLock lock(&gone_mu_);
      gone_.insert(rank);
    }
    if (rank >= 0 && state != State::kClosed && reason.code() == absl::StatusCode::kUnavailable) {
      if (state == State::kRunning) rrefs_->OnPeerGone(rank);
      if (hooks_) hooks_->OnPeerGone(rank);
      watchers_->Notify(rank);
    }
  }

  // ---------------------------------------------------------------- graceful shutdown

  // Our calls, and the RRef control messages they caused, finish (or time out).
  void Drain(absl::Time deadline) {
    while (absl::Now() < deadline) {
      calls_->AwaitEmpty(deadline);
      rrefs_->AwaitIdle(deadline);
      // Not under one lock: a control message may have started a call meanwhile.
      if (calls_->size() == 0 && rrefs_->Idle()) return;
    }
  }

  absl::Status CheckLeaks() {
    if (options_.rref_leak_check == AgentOptions::LeakCheck::kOff) return absl::OkStatus();
    // A peer's last reference may be released a moment after its drain (by the thread
    // that completed the call which carried it): give such deletes a short grace period.
    rrefs_->AwaitStats([](const RRefStats& s) { return s.owner_forks == 0; }, absl::Now() + kLeakGrace);
    std::vector<std::string> leaks = rrefs_->Leaks();
    if (leaks.empty()) return absl::OkStatus();
    std::string report = absl::StrCat(options_.name, ": ", leaks.size(),
                                      " owned RRef value(s) still referenced by other workers at shutdown "
                                      "(they kept RRefs past Shutdown):\n  ",
                                      absl::StrJoin(leaks, "\n  "));
    std::fprintf(stderr, "gradwire: %s\n", report.c_str());
    if (options_.rref_leak_check == AgentOptions::LeakCheck::kError) return absl::FailedPreconditionError(report);
    return absl::OkStatus();
  }

  // Declared in destruction order's reverse: units that others refer to come first.
  AgentOptions options_;
  Statistics statistics_;
  Waits waits_;
  std::unique_ptr<Tracer> tracer_ = std::make_unique<Tracer>();  // opened in Start, once the rank is known
  Tracer::Name send_category_ = 0, receive_category_ = 0, reply_name_ = 0, peer_arg_ = 0, bytes_arg_ = 0;
  internal::CallMetrics call_metrics_;  // the calls and requests of the units below
  ThreadPool pool_;
  TimerQueue timers_;
  std::optional<GlobalIdGenerator> ids_;  // set in Start, once the rank is known
  WorkerInfo self_;
  int gpus_ = 0;  // the GPUs this process sees (set in Start)
  std::unique_ptr<internal::Rendezvous> rendezvous_;
  std::unique_ptr<internal::Members> members_;  // set in Start
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<internal::Peers> peers_;
  std::unique_ptr<internal::Heartbeats> heartbeats_;
  std::unique_ptr<internal::Membership> membership_;
  std::unique_ptr<internal::CallTable> calls_;
  std::unique_ptr<internal::Dispatcher> dispatcher_;
  std::shared_ptr<internal::RRefContext> rrefs_;
  std::shared_ptr<CallHooks> hooks_;                // set in setup (SetCallHooks), then read-only
  std::shared_ptr<internal::Watchers<int>> watchers_ = std::make_shared<internal::Watchers<int>>();
  absl::Mutex gone_mu_;
  absl::flat_hash_set<int> gone_ ABSL_GUARDED_BY(gone_mu_);  // connection closed, not reached since
  Statistics::Source own_statistics_;               // reads the units above: dropped first
  Waits::Source own_waits_;                         // as own_statistics_
  TimerQueue::Handle stall_timer_;
  absl::flat_hash_set<std::string> reported_stalls_;  // on the timer thread only
  std::atomic<int64_t> stall_reports_{0};
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;  // reads statistics_: stops before anything goes

  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kRunning;
};

absl::StatusOr<std::shared_ptr<Agent>> Agent::Start(AgentOptions options, Setup setup) {
  // agent.h: the detector is for debug builds; Debian's libabsl runs it on every lock.
  const char* keep = std::getenv("GRADWIRE_MUTEX_DEADLOCK_DETECTION");
  if (keep == nullptr || std::string(keep) != "1") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  std::shared_ptr<Agent> agent(new Agent(std::make_unique<Impl>(std::move(options))));
  if (absl::Status s = agent->impl_->Start(setup, *agent); !s.ok()) {
    agent->impl_->Abandon(s);
    return s;
  }
  return agent;
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() { (void)impl_->Shutdown(/*graceful=*/false); }

const WorkerInfo& Agent::self() const { return impl_->self(); }
const std::vector<WorkerInfo>& Agent::workers() const { return impl_->workers(); }
absl::StatusOr<WorkerInfo> Agent::Worker(const std::string& name) const { return impl_->Worker(name); }
Store& Agent::store() { return impl_->store(); }
Executor& Agent::executor() { return impl_->executor(); }
TimerQueue& Agent::timers() { return impl_->timers(); }
GlobalId Agent::NewId() { return impl_->NewId(); }
const AgentOptions& Agent::options() const { return impl_->options(); }
absl::Status Agent::RegisterRaw(const std::string& name, RawHandler handler, RegisterOptions options) {
  return impl_->Register(name, std::move(handler), options, /*reserved=*/false);
}
absl::Status Agent::RegisterProtocol(const std::string& name, RawHandler handler, RegisterOptions options) {
  return impl_->Register(name, std::move(handler), options, /*reserved=*/true);
}
void Agent::CallRaw(const std::string& to, const std::string& function, ValueList args, CallOptions options,
                    std::function<void(absl::StatusOr<Value>)> done) {
  impl_->Call(to, function, std::move(args), options, std::move(done));
}
absl::Status Agent::Shutdown(bool graceful) { return impl_->Shutdown(graceful); }
absl::Status Agent::Leave() { return impl_->Leave(); }
std::vector<WorkerInfo> Agent::members() const { return impl_->members(); }
std::string Agent::NameOf(int rank) const { return impl_->NameOf(rank); }
absl::Status Agent::PeerGoneError(int rank) const { return impl_->PeerGoneError(rank); }
Agent::PeerWatch Agent::WatchMembers(std::function<void(const MemberChange&)> fn) {
  return impl_->WatchMembers(std::move(fn));
}
RRefPtr Agent::RemoteRaw(const std::string& to, const std::string& function, ValueList args, CallOptions options,
                         std::string type) {
  return impl_->RemoteRaw(to, function, std::move(args), options, std::move(type));
}
RRefPtr Agent::OwnRaw(Value value, std::string type) { return impl_->OwnRaw(std::move(value), std::move(type)); }
RRefStats Agent::rref_stats() const { return impl_->rref_stats(); }
TransportStats Agent::transport_stats() const { return impl_->transport_stats(); }
bool Agent::AwaitRRefs(const std::function<bool(const RRefStats&)>& until, absl::Time deadline) const {
  return impl_->AwaitRRefs(until, deadline);
}
Statistics& Agent::statistics() { return impl_->statistics(); }
Tracer& Agent::tracer() { return impl_->tracer(); }
Waits& Agent::waits() { return impl_->waits(); }
Future<std::vector<Sample>> Agent::StatisticsOf(const std::string& worker) {
  if (worker == self().name) return MakeReadyFuture<std::vector<Sample>>(executor(), statistics().Collect());
  return Send(worker, StatisticsQuery{});
}
void Agent::SetCallHooks(std::shared_ptr<CallHooks> hooks) { impl_->SetCallHooks(std::move(hooks)); }
Agent::PeerWatch Agent::WatchPeers(std::function<void(int)> fn) { return impl_->WatchPeers(std::move(fn)); }

}  // namespace gw::rpc
