// Agent::Impl: the coordinator of one worker's units (rendezvous, peers, the call table,
// the dispatcher, the RRef context, the shutdown barrier) and the state machine that
// decides which calls may still go out:
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
#include <map>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "call_table.h"
#include "codec.h"
#include "dispatcher.h"
#include "etcd_store.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/faults.h"
#include "gradwire/rpc/statistics.h"
#include "host_address.h"
#include "launch_env.h"
#include "liveness.h"
#include "members.h"
#include "peers.h"
#include "rendezvous.h"
#include "rref_context.h"
#include "rref_messages.h"
#include "shutdown_barrier.h"

namespace gw::rpc {
namespace {

// The prefix of the agent's own protocol messages.
constexpr std::string_view kAgentPrefix = "__agent.";

// `gradwire launch` relays its workers' output line by line, but their stdout is a pipe,
// which stdio buffers in blocks: a worker printing progress would show nothing until it
// exits. The launcher sets GRADWIRE_LINE_BUFFERED=1 and every program that uses an agent
// (this file is linked into it) makes stdout line-buffered before main() runs, before
// anything is written to it (std::cout writes through stdio: synced by default).
[[maybe_unused]] const bool kStdoutLineBuffered = [] {
  const char* v = std::getenv("GRADWIRE_LINE_BUFFERED");
  if (v != nullptr && std::string_view(v) == "1") std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return true;
}();

// A worker that joined the group introduces itself to a member (Agent::Start): its hello
// admitted it; the answer says so.
struct JoinNotice {
  static constexpr char kFunction[] = "__agent.join";
  using Reply = Ack;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// A member tells the others it leaves the group (Agent::Leave).
struct LeaveNotice {
  static constexpr char kFunction[] = "__agent.leave";
  using Reply = Ack;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// Another worker's statistics (Agent::StatisticsOf).
struct StatisticsQuery {
  static constexpr char kFunction[] = "__agent.statistics";
  using Reply = std::vector<Sample>;
  static constexpr auto Fields() { return std::tuple<>(); }
};

using internal::Envelope;
using internal::Kind;

// With at least this many calls of this agent awaiting replies, new requests are sent
// coalesced (Connection::SendCoalesced): throughput over the last microseconds of latency.
constexpr size_t kPipelinedCalls = 4;
// How long the shutdown leak check waits for late RRef deletes.
constexpr absl::Duration kLeakGrace = absl::Milliseconds(500);

std::string Env(const char* name) {  // "" when unset
  const char* v = std::getenv(name);
  return v ? v : "";
}

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
         function == internal::RRefDelete::kFunction || function == LeaveNotice::kFunction;
}

// FromEnv's addresses: GRADWIRE_LISTEN / GRADWIRE_ADVERTISE, else loopback for a local
// job, else the address of the interface that reaches the rendezvous host (MASTER_ADDR,
// or GRADWIRE_RDZV's etcd host), which `variable` names.
absl::Status ChooseAddresses(const char* variable, const std::string& rendezvous_host, AgentOptions* o) {
  const std::string listen = Env("GRADWIRE_LISTEN"), advertise = Env("GRADWIRE_ADVERTISE");
  if (!listen.empty() || !advertise.empty()) {
    o->advertise_host = advertise;
    o->listen_host = !listen.empty() ? listen : advertise.find(':') != std::string::npos ? "::" : "0.0.0.0";
    return absl::OkStatus();
  }
  if (internal::IsLoopbackHost(rendezvous_host)) return absl::OkStatus();  // 127.0.0.1, as local jobs always did
  absl::StatusOr<std::string> local = internal::LocalAddressToward(rendezvous_host);
  if (!local.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("AgentOptions::FromEnv: cannot tell which address of this host the other workers reach, from ",
                     variable, "=", Env(variable), ": ", local.status().message(), "; check ", variable,
                     ", or set GRADWIRE_LISTEN (the address to bind, e.g. 0.0.0.0) and "
                     "GRADWIRE_ADVERTISE (the address the other workers dial)"));
  }
  // A rendezvous host that names this host through loopback (e.g. its name in /etc/hosts).
  o->listen_host = internal::IsLoopbackHost(*local) ? "127.0.0.1" : *local;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AgentOptions> AgentOptions::FromEnv() {
  AgentOptions o;
  const std::string rdzv = Env("GRADWIRE_RDZV");
  o.join = Env("GRADWIRE_JOIN") == "1";
  // A worker that joins gets its rank from the group: RANK is not needed.
  auto env = [&o](const char* name) { return o.join && std::string(name) == "RANK" && Env(name).empty() ? "0" : Env(name); };
  absl::StatusOr<internal::LaunchEnv> launch = internal::ReadLaunchEnv(env, /*need_master=*/rdzv.empty());
  if (!launch.ok()) return launch.status();
  o.rank = launch->rank;
  o.world_size = launch->world_size;
  if (std::string m = Env("GRADWIRE_MAX_WORLD_SIZE"); !m.empty()) {
    if (!absl::SimpleAtoi(m, &o.max_world_size) || o.max_world_size < o.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: bad GRADWIRE_MAX_WORLD_SIZE=", m,
                                                     " (a number of workers, at least WORLD_SIZE=", o.world_size, ")"));
    }
  }
  if (!rdzv.empty()) {  // etcd: nobody hosts the store
    absl::StatusOr<internal::EtcdUrl> url = internal::ParseEtcdUrl(rdzv);
    if (!url.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: GRADWIRE_RDZV: ", url.status().message()));
    }
    o.rendezvous = rdzv;
    o.host_store = false;
    if (absl::Status s = ChooseAddresses("GRADWIRE_RDZV", url->host, &o); !s.ok()) return s;
  } else {
    o.rendezvous = internal::JoinHostPort(launch->master_addr, launch->master_port);
    if (absl::Status s = ChooseAddresses("MASTER_ADDR", launch->master_addr, &o); !s.ok()) return s;
  }
  o.name = Env("GRADWIRE_WORKER_NAME");
  if (std::string t = Env("GRADWIRE_TRANSPORT"); !t.empty()) o.transport = t;
  if (std::string r = Env("GRADWIRE_RUN_ID"); !r.empty()) o.run_id = r;
  for (auto [name, field] : {std::pair{"GRADWIRE_HEARTBEAT_INTERVAL", &o.heartbeat_interval},
                             std::pair{"GRADWIRE_PEER_TIMEOUT", &o.peer_timeout}}) {
    const std::string v = Env(name);
    if (v.empty()) continue;
    if (!absl::ParseDuration(v, field) || *field < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: bad ", name, "=", v,
                                                     " (a duration such as 500ms or 3s)"));
    }
  }
  absl::StatusOr<Security> security = Security::FromEnv();
  if (!security.ok()) return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: ", security.status().message()));
  o.security = *std::move(security);
  if (std::string f = Env("GRADWIRE_FAULTS"); !f.empty()) {
    absl::StatusOr<FaultSpec> faults = ParseFaults(f);
    if (!faults.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("AgentOptions::FromEnv: GRADWIRE_FAULTS=", f, ": ", faults.status().message()));
    }
    o.transport_options.faults = std::make_shared<FaultInjector>(*std::move(faults));
  }
  return o;
}

// The functions of Agent::WatchPeers (Event = int, a rank) and Agent::WatchMembers. A
// watch's deleter removes its function; it holds the list weakly, so a watch may outlive
// the agent.
template <typename Event>
class Watchers : public std::enable_shared_from_this<Watchers<Event>> {
 public:
  using Fn = std::function<void(const Event&)>;
  Agent::PeerWatch Add(Fn fn) {
    int64_t id;
    {
      absl::MutexLock lock(&mu_);
      id = next_++;
      fns_.emplace(id, std::make_shared<Fn>(std::move(fn)));
    }
    std::weak_ptr<Watchers> weak = this->weak_from_this();
    return Agent::PeerWatch(nullptr, [weak, id](void*) {
      if (auto self = weak.lock()) {
        absl::MutexLock lock(&self->mu_);
        self->fns_.erase(id);
      }
    });
  }
  void Notify(const Event& event) {
    std::vector<std::shared_ptr<Fn>> fns;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, fn] : fns_) fns.push_back(fn);
    }
    for (const auto& fn : fns) (*fn)(event);  // outside the lock: a function may drop its watch
  }

 private:
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::shared_ptr<Fn>> fns_ ABSL_GUARDED_BY(mu_);
};

class Agent::Impl {
 public:
  explicit Impl(AgentOptions options)
      : options_(std::move(options)),
        pool_(static_cast<size_t>(std::max(1, options_.worker_threads)), "gw-worker"),
        heartbeat_sender_(1, "gw-heartbeat"),
        timers_("gw-timer") {}

  ~Impl() {
    Close(ShuttingDownError(options_.name, "the agent was destroyed"));
    if (dispatcher_) dispatcher_->ClearHandlers();  // while the members their state may call are alive
  }

  // The secret and TLS files not given in options_ come from the environment; a group that
  // may have more than one worker needs a secret unless authentication is turned off.
  absl::Status ResolveSecurity() {
    Security& sec = options_.security;
    if (sec.secret.empty() || !sec.tls.enabled()) {
      absl::StatusOr<Security> env = Security::FromEnv();
      if (!env.ok()) return env.status();
      if (sec.secret.empty()) sec.secret = env->secret;
      if (!sec.tls.enabled()) sec.tls = env->tls;
      if (!env->authenticate) sec.authenticate = false;
    }
    if (absl::Status s = sec.Validate(); !s.ok()) return s;
    const bool alone = options_.max_world_size <= 1 && !options_.join;
    if (sec.authenticate && sec.secret.empty() && !alone) {
      return absl::FailedPreconditionError(absl::StrCat(
          options_.name.empty() ? absl::StrCat("rank ", options_.rank) : options_.name,
          ": this job has no secret, and its workers authenticate each other by one: start it with `gradwire "
          "launch` (which makes one), or give every worker the same secret (GRADWIRE_SECRET_FILE=PATH, "
          "GRADWIRE_SECRET=..., or AgentOptions::security.secret); only on a network where every process is "
          "trusted, turn authentication off with GRADWIRE_AUTH=off (Security::authenticate = false)"));
    }
    return absl::OkStatus();
  }

  absl::Status Start(const Setup& setup, Agent& agent) {
    if (options_.join) options_.rank = -1;  // the group gives it one
    if (options_.max_world_size == 0) options_.max_world_size = options_.world_size;
    if (options_.world_size < 1 || options_.max_world_size < options_.world_size ||
        options_.max_world_size > GlobalId::kMaxRanks || (!options_.join && (options_.rank < 0 || options_.rank >= options_.world_size))) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, " is not in [0, ", options_.world_size,
                                                     "), or max_world_size ", options_.max_world_size,
                                                     " is below world_size or above ", GlobalId::kMaxRanks));
    }
    if (options_.heartbeat_interval > absl::ZeroDuration() && options_.peer_timeout < 2 * options_.heartbeat_interval) {
      return absl::InvalidArgumentError(absl::StrCat(
          options_.name, ": AgentOptions::peer_timeout (", absl::FormatDuration(options_.peer_timeout),
          ") must be at least twice heartbeat_interval (", absl::FormatDuration(options_.heartbeat_interval),
          "), or a silent peer is declared dead before it could answer a ping; to turn heartbeats off set "
          "heartbeat_interval (GRADWIRE_HEARTBEAT_INTERVAL) to 0"));
    }
    if (absl::Status s = ResolveSecurity(); !s.ok()) return s;
    const absl::Time deadline = absl::Now() + options_.start_timeout;
    auto rendezvous = internal::Rendezvous::Join(options_, deadline);
    if (!rendezvous.ok()) return rendezvous.status();
    rendezvous_ = std::move(*rendezvous);
    options_.rendezvous = rendezvous_->store_address();
    if (options_.join) {
      if (absl::Status s = ClaimRank(deadline); !s.ok()) return s;
    }
    if (options_.name.empty()) options_.name = absl::StrCat("worker", options_.rank);
    ids_.emplace(options_.rank);
    members_ = std::make_unique<internal::Members>(options_.world_size, options_.max_world_size);
    liveness_ = std::make_unique<internal::Liveness>(
        options_.max_world_size,
        options_.heartbeat_interval > absl::ZeroDuration() ? options_.heartbeat_interval : absl::Seconds(1),
        options_.peer_timeout);

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
        internal::Peers::Events{[this](const WorkerInfo& w) { OnJoined(w); },
                                [this](int rank) {
                                  liveness_->Heard(rank);
                                  absl::MutexLock lock(&gone_mu_);
                                  gone_.erase(rank);  // reached again
                                }});
    calls_ = std::make_unique<internal::CallTable>(timers_, [this](int rank) { return peers_->Describe(rank); });
    dispatcher_ = std::make_unique<internal::Dispatcher>(
        options_.name, pool_,
        internal::Dispatcher::Peers{
            [this](int rank) { return peers_->Name(rank); },
            [this](int to, uint64_t id, const absl::StatusOr<Value>& result, const CallHooks::Scope& scope) {
              return EncodeReply(to, id, result, scope);
            }},
        options_.security.limits.max_calls_in_flight);

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
    if (absl::Status s = agent.Handle<JoinNotice>([](const CallInfo&, JoinNotice) { return Ack{}; },
                                                  RegisterOptions{HandlerMode::kInline});
        !s.ok()) {
      return s;
    }
    if (absl::Status s = agent.Handle<LeaveNotice>(
            [this](const CallInfo& info, LeaveNotice) {
              OnLeft(info.caller_rank);
              return Ack{};
            },
            RegisterOptions{HandlerMode::kInline});
        !s.ok()) {
      return s;
    }

    absl::StatusOr<std::string> advertise = AdvertiseHost();
    if (!advertise.ok()) return advertise.status();
    auto address = transport_->Listen(options_.listen_host, *advertise, peers_->callbacks());
    if (!address.ok()) {
      return absl::Status(address.status().code(),
                          absl::StrCat(options_.name, ": ", address.status().message(),
                                       " (AgentOptions::listen_host, from GRADWIRE_LISTEN: use an address of this host, "
                                       "or 0.0.0.0 for all of them)"));
    }
    self_ = {options_.name, options_.rank, *address, static_cast<int64_t>(::getpid())};
    // Functions are registered before this worker is announced: no peer can call it
    // before its handlers exist.
    if (absl::Status s = setup(agent); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(options_.name, ": setup failed: ", s.message()));
    }
    if (absl::Status s = rendezvous_->Announce(self_); !s.ok()) return s;
    if (absl::Status s = options_.join ? FindMembers(deadline) : AwaitGroup(deadline); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(options_.name, ": ", s.message()));
    }
    if (options_.heartbeat_interval > absl::ZeroDuration()) timers_.After(liveness_->interval(), [this] { Heartbeat(); });
    if (options_.join) IntroduceSelf(deadline);
    return absl::OkStatus();
  }

  // Start's group: every rank announces itself; rank 0 then says the group is formed (a
  // worker that joins later waits for that).
  absl::Status AwaitGroup(absl::Time deadline) {
    absl::StatusOr<std::vector<WorkerInfo>> workers = rendezvous_->AwaitAll(deadline);
    if (!workers.ok()) return workers.status();
    peers_->SetWorkers(*std::move(workers));
    UpdateNames();
    if (options_.rank == 0) return rendezvous_->PublishGroup(options_.world_size, options_.max_world_size);
    return absl::OkStatus();
  }

  // A worker that joins: the group's size and the next free rank.
  absl::Status ClaimRank(absl::Time deadline) {
    absl::StatusOr<std::pair<int, int>> group = rendezvous_->ReadGroup(deadline);
    if (!group.ok()) return group.status();
    options_.world_size = group->first;
    options_.max_world_size = group->second;
    absl::StatusOr<int> rank = rendezvous_->ClaimRank(group->first, group->second);
    if (!rank.ok()) return rank.status();
    options_.rank = *rank;
    return absl::OkStatus();
  }

  // A worker that joins: every member the store knows of.
  absl::Status FindMembers(absl::Time deadline) {
    absl::StatusOr<internal::Rendezvous::Found> found = rendezvous_->FindMembers(options_.world_size, options_.max_world_size, options_.rank, deadline);
    if (!found.ok()) return found.status();
    std::vector<WorkerInfo> group(static_cast<size_t>(options_.world_size));
    std::vector<WorkerInfo> joined{self_};
    for (WorkerInfo& w : found->workers) {
      if (w.rank < options_.world_size) {
        group[static_cast<size_t>(w.rank)] = w;
      } else {
        joined.push_back(w);
      }
    }
    members_->SetKnown(joined);
    peers_->SetWorkers(std::move(group));
    for (int rank : found->left) members_->MarkLeft(rank);
    UpdateNames();
    return absl::OkStatus();
  }

  // A worker that joined says hello to every member, which admits it (Peers) and tells
  // its layers (WatchMembers), and waits for the answers: once Start returns, every
  // member knows it. A member that does not answer is dead or gone: skipped.
  void IntroduceSelf(absl::Time deadline) {
    std::vector<std::pair<std::string, Future<Ack>>> told;
    for (const WorkerInfo& w : members_->Present()) {
      if (w.rank != options_.rank) told.emplace_back(w.name, Notify<JoinNotice>(w.name, deadline));
    }
    for (auto& [name, f] : told) {
      if (absl::StatusOr<Ack> r = f.Get(std::max(absl::ZeroDuration(), deadline - absl::Now())); !r.ok()) {
        std::fprintf(stderr, "gradwire: %s joined without %s: %s\n", options_.name.c_str(), name.c_str(),
                     std::string(r.status().message()).c_str());
      }
    }
  }

  void UpdateNames() {
    absl::MutexLock lock(&names_mu_);  // two joining at once: the later list is the fuller
    std::vector<std::string> names;
    for (int r = 0; r < members_->capacity(); ++r) names.push_back(members_->Name(r));
    rrefs_->SetWorkerNames(std::move(names));
  }

  // ---------------------------------------------------------------- membership

  // On the I/O thread that admitted the hello of a worker that joined.
  void OnJoined(const WorkerInfo& w) {
    UpdateNames();
    member_watchers_->Notify(MemberChange{MemberChange::Kind::kJoined, w});
  }

  // A member said it leaves (LeaveNotice, on the I/O thread): calls to it fail from now
  // on, and the layers let go of it as of a dead peer.
  void OnLeft(int rank) {
    if (!members_->MarkLeft(rank)) return;
    State state;
    {
      absl::MutexLock lock(&mu_);
      state = state_;
    }
    if (state == State::kClosed) return;
    if (state == State::kRunning) rrefs_->OnPeerGone(rank);
    if (hooks_) hooks_->OnPeerGone(rank);
    watchers_->Notify(rank);
    member_watchers_->Notify(MemberChange{MemberChange::Kind::kLeft, *members_->Get(rank)});
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
    std::vector<Future<Ack>> told;
    for (const WorkerInfo& w : members_->Present()) {
      if (w.rank != options_.rank) told.push_back(Notify<LeaveNotice>(w.name, deadline));
    }
    for (Future<Ack>& f : told) (void)f.Get(std::max(absl::ZeroDuration(), deadline - absl::Now()));  // the dead do not answer
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
  template <typename Notice>
  Future<Ack> Notify(const std::string& to, absl::Time deadline) {
    Promise<Ack> promise(pool_);
    Value fields = ValueTraits<Notice>::To(Notice{});
    CallOptions call;
    call.timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
    Call(to, Notice::kFunction, std::move(std::get<ValueList>(fields.storage())), call,
         [promise](absl::StatusOr<Value> v) {
           promise.Set(v.ok() ? absl::StatusOr<Ack>(Ack{}) : absl::StatusOr<Ack>(v.status()));
         });
    return promise.future();
  }

  std::vector<WorkerInfo> members() const { return members_->Present(); }
  std::string NameOf(int rank) const { return members_ ? members_->Name(rank) : absl::StrCat("rank ", rank); }
  absl::Status PeerGoneError(int rank) const {
    if (members_ && members_->state(rank) == internal::Members::State::kLeft) {
      return UnavailableError(NameOf(rank), "it left the job");
    }
    return DeclaredDeadError(NameOf(rank));
  }
  Agent::PeerWatch WatchMembers(std::function<void(const MemberChange&)> fn) {
    return member_watchers_->Add(std::move(fn));
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
    Envelope env;
    env.kind = Kind::kRequest;
    env.function = function;
    env.payload = Value(std::move(args));
    env.timeout_ms = absl::ToInt64Milliseconds(timeout);
    size_t in_flight = 0;
    env.id = calls_->Add(rank, function, timeout, std::move(done), &in_flight);
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
    absl::StatusOr<Message> message = internal::EncodeEnvelope(env);
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
    heartbeat_sender_.Shutdown();
    if (peers_) peers_->CloseAll();
    if (rendezvous_) rendezvous_->Close();
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
    add("gradwire_rpc_heartbeats_sent_total", heartbeats_sent_.load(std::memory_order_relaxed));
    add("gradwire_rpc_peers_declared_silent_total", peers_declared_dead_.load(std::memory_order_relaxed));
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
    absl::StatusOr<Envelope> env = internal::DecodeEnvelope(std::move(m));
    if (!env.ok()) {
      conn->Close(absl::DataLossError(absl::StrCat("bad envelope from ", conn->peer(), ": ", env.status().message())));
      return;
    }
    const int from = peers_->RankOf(conn.get());  // -1 before its hello
    if (from >= 0) liveness_->Heard(from);
    switch (env->kind) {
      case Kind::kHello:
        (void)peers_->OnHello(conn, *env);
        return;
      case Kind::kRequest:
        OnRequest(conn, from, *std::move(env));
        return;
      case Kind::kResponse:
        OnResponse(from, *std::move(env));
        return;
      case Kind::kPing:
        if (from >= 0) SendHeartbeat(*conn, Kind::kPong);  // here, on the I/O thread: never behind a handler
        return;
      case Kind::kPong:
        return;  // hearing it was the point
    }
  }

  // ---------------------------------------------------------------- failure detection

  static void SendHeartbeat(Connection& conn, Kind kind) {
    Envelope beat;
    beat.kind = kind;
    if (absl::StatusOr<Message> m = internal::EncodeEnvelope(beat); m.ok()) conn.Send(*std::move(m));
  }

  // Every heartbeat_interval on the timer thread (liveness.h): pings the peers it has not
  // heard from, declares dead those silent for peer_timeout.
  void Heartbeat() {
    {
      absl::MutexLock lock(&mu_);
      if (state_ == State::kClosed) return;
    }
    std::vector<std::pair<int, std::shared_ptr<Connection>>> connected = peers_->Connected();
    std::vector<int> ranks;
    ranks.reserve(connected.size());
    for (const auto& [rank, conn] : connected) ranks.push_back(rank);
    internal::Liveness::Actions actions = liveness_->Tick(absl::Now(), ranks);
    heartbeats_sent_.fetch_add(static_cast<int64_t>(actions.ping.size()), std::memory_order_relaxed);
    peers_declared_dead_.fetch_add(static_cast<int64_t>(actions.dead.size()), std::memory_order_relaxed);
    // The dead first: closing a connection also frees a sender blocked on its full socket.
    for (int rank : actions.dead) {
      absl::Status why = UnavailableError(
          peers_->Describe(rank),
          absl::StrCat("declared dead by ", options_.name, ": nothing heard from it, not even a heartbeat answer, for ",
                       absl::FormatDuration(liveness_->timeout()),
                       " (frozen, its host down, or the network between them cut; AgentOptions::peer_timeout)"));
      std::fprintf(stderr, "gradwire: %s\n", std::string(why.message()).c_str());
      peers_->CloseRank(rank, why);  // OnClose fails its calls and tells every layer
    }
    // Pings go out from a thread of their own, never from this one (a send may wait for
    // the connection's writer: a large frame to a slow or frozen peer; and this thread runs
    // every call's deadline and the next tick), nor from the worker pool (whose threads may
    // all be busy in handlers on both ends of an idle connection).
    std::vector<std::shared_ptr<Connection>> ping;
    for (int rank : actions.ping) {
      for (const auto& [r, conn] : connected) {
        if (r == rank) ping.push_back(conn);
      }
    }
    if (!ping.empty()) {
      (void)heartbeat_sender_.Post([ping = std::move(ping)] {
        for (const auto& conn : ping) SendHeartbeat(*conn, Kind::kPing);
      });
    }
    timers_.After(liveness_->interval(), [this] { Heartbeat(); });
  }

  void OnRequest(const std::shared_ptr<Connection>& conn, int from, Envelope env) {
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
        dispatcher_->Refuse(conn, from, env.id, absl::Status(s.code(), absl::StrCat(env.function, ": ", s.message())));
        return;
      }
    }
    dispatcher_->OnRequest(conn, from, std::move(env));
  }

  void OnResponse(int from, Envelope env) {
    if (env.has_rrefs) {
      // Also for a reply to a call that already timed out: its RRefs must still be
      // adopted (and then dropped), or their owner would keep them.
      absl::Status s = from < 0 ? absl::InvalidArgumentError("RRefs from an unidentified peer")
                                : rrefs_->AdoptIncoming(&env.payload, from);
      if (!s.ok()) {
        calls_->Complete(env.id, s);
        return;
      }
    }
    if (hooks_ && env.status.ok()) {
      if (absl::Status s = hooks_->OnReceiveReply(from, env.payload, env.meta); !s.ok()) {
        calls_->Complete(env.id, s);
        return;
      }
    }
    if (env.status.ok()) {
      calls_->Complete(env.id, std::move(env.payload));
      return;
    }
    std::optional<internal::CallTable::Call> call = calls_->Find(env.id);
    if (!call) return;  // timed out or failed already
    calls_->Complete(env.id, absl::Status(env.status.code(), ReplyErrorMessage(peers_->Name(call->rank), call->function,
                                                                               env.status.message())));
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
  ThreadPool pool_;
  ThreadPool heartbeat_sender_;  // sends the pings (Heartbeat)
  TimerQueue timers_;
  std::optional<GlobalIdGenerator> ids_;       // set in Start, once the rank is known
  std::unique_ptr<internal::Liveness> liveness_;  // Heard on I/O threads; ticked on the timer thread
  std::atomic<int64_t> heartbeats_sent_{0};
  std::atomic<int64_t> peers_declared_dead_{0};  // for silence (heartbeats), not closed connections
  WorkerInfo self_;
  std::unique_ptr<internal::Rendezvous> rendezvous_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<internal::Peers> peers_;
  std::unique_ptr<internal::CallTable> calls_;
  std::unique_ptr<internal::Dispatcher> dispatcher_;
  std::shared_ptr<internal::RRefContext> rrefs_;
  std::shared_ptr<CallHooks> hooks_;                // set in setup (SetCallHooks), then read-only
  std::shared_ptr<Watchers<int>> watchers_ = std::make_shared<Watchers<int>>();
  std::shared_ptr<Watchers<MemberChange>> member_watchers_ = std::make_shared<Watchers<MemberChange>>();
  std::unique_ptr<internal::Members> members_;  // set in Start
  absl::Mutex names_mu_;                        // UpdateNames, one at a time
  absl::Mutex gone_mu_;
  absl::flat_hash_set<int> gone_ ABSL_GUARDED_BY(gone_mu_);  // connection closed, not reached since
  Statistics::Source own_statistics_;               // reads the units above: dropped first

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
Future<std::vector<Sample>> Agent::StatisticsOf(const std::string& worker) {
  if (worker == self().name) return MakeReadyFuture<std::vector<Sample>>(executor(), statistics().Collect());
  return Send(worker, StatisticsQuery{});
}
void Agent::SetCallHooks(std::shared_ptr<CallHooks> hooks) { impl_->SetCallHooks(std::move(hooks)); }
Agent::PeerWatch Agent::WatchPeers(std::function<void(int)> fn) { return impl_->WatchPeers(std::move(fn)); }

}  // namespace gw::rpc
