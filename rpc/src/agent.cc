#include "gradwire/rpc/agent.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "codec.h"
#include "rref_context.h"

namespace gw::rpc {
namespace {

using internal::Envelope;
using internal::Kind;

// With at least this many calls of this agent awaiting replies, new requests are sent
// coalesced (Connection::SendCoalesced): throughput over the last microseconds of latency.
constexpr size_t kPipelinedCalls = 4;
// How long the shutdown leak check waits for late RRef deletes.
constexpr absl::Duration kLeakGrace = absl::Milliseconds(500);

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

absl::StatusOr<AgentOptions> AgentOptions::FromEnv() {
  AgentOptions o;
  const std::string rank = Env("RANK"), world = Env("WORLD_SIZE"), addr = Env("MASTER_ADDR"),
                    port = Env("MASTER_PORT");
  if (rank.empty() || world.empty() || addr.empty() || port.empty()) {
    return absl::InvalidArgumentError(
        "AgentOptions::FromEnv: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must be set "
        "(run the program under `gradwire launch -n N ...` or torchrun)");
  }
  if (!absl::SimpleAtoi(rank, &o.rank) || !absl::SimpleAtoi(world, &o.world_size) ||
      o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("AgentOptions::FromEnv: bad RANK=", rank,
                                                   " / WORLD_SIZE=", world));
  }
  o.rendezvous = absl::StrCat(addr, ":", port);
  o.name = Env("GRADWIRE_WORKER_NAME");
  if (std::string t = Env("GRADWIRE_TRANSPORT"); !t.empty()) o.transport = t;
  if (std::string r = Env("GRADWIRE_RUN_ID"); !r.empty()) o.run_id = r;
  return o;
}

class Agent::Impl {
 public:
  explicit Impl(AgentOptions options)
      : options_(std::move(options)), pool_(static_cast<size_t>(std::max(1, options_.worker_threads)),
                                            "gw-worker") {}

  ~Impl() { Close(absl::CancelledError("agent destroyed")); }

  absl::Status Start(const std::function<void(Agent&)>& setup, Agent& agent) {
    if (options_.name.empty()) options_.name = absl::StrCat("worker", options_.rank);
    if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, " is not in [0, ",
                                                     options_.world_size, ")"));
    }
    const absl::Time deadline = absl::Now() + options_.start_timeout;
    if (options_.rank == 0 && options_.host_store) {
      const size_t colon = options_.rendezvous.rfind(':');
      int port = 0;
      if (colon == std::string::npos || !absl::SimpleAtoi(options_.rendezvous.substr(colon + 1), &port)) {
        return absl::InvalidArgumentError(absl::StrCat("bad rendezvous address '", options_.rendezvous, "'"));
      }
      auto server = StoreServer::Start(options_.rendezvous.substr(0, colon), port);
      if (!server.ok()) return server.status();
      store_server_ = std::move(*server);
      if (port == 0) options_.rendezvous = store_server_->address();
    }
    auto store = ConnectStore(options_.rendezvous, deadline);
    if (!store.ok()) return store.status();
    store_ = std::move(*store);

    // The RRef context exists before any peer can reach us.
    internal::RRefContext::Hooks hooks;
    hooks.agent = &agent;
    hooks.self_rank = options_.rank;
    hooks.world_size = options_.world_size;
    hooks.default_timeout = options_.default_timeout;
    hooks.invoke = [this](const std::string& caller, const std::string& function, ValueList args) {
      return InvokeLocal(caller, function, std::move(args));
    };
    hooks.invoke_here = [this](const std::string& caller, const std::string& function, ValueList args) {
      return InvokeLocal(caller, function, std::move(args), /*here=*/true);
    };
    hooks.defer = [this](std::function<void()> fn) { Defer(std::move(fn)); };
    hooks.has_function = [this](const std::string& function) {
      absl::MutexLock lock(&mu_);
      return handlers_.contains(function);
    };
    rrefs_ = std::make_shared<internal::RRefContext>(std::move(hooks));
    if (absl::Status s = rrefs_->RegisterFunctions(); !s.ok()) return s;
    auto transport = MakeTransport(options_.transport, options_.transport_options);
    if (!transport.ok()) return transport.status();
    transport_ = std::move(*transport);
    auto address = transport_->Listen(options_.listen_host, Callbacks());
    if (!address.ok()) return address.status();

    self_ = {options_.name, options_.rank, *address, static_cast<int64_t>(::getpid())};
    // Functions are registered before this worker is announced: no peer can call it
    // before its handlers exist.
    if (setup) setup(agent);
    if (absl::Status s = store_->Set(Key("worker/", options_.rank),
                                     absl::StrCat(self_.name, "\n", self_.address, "\n", self_.pid));
        !s.ok()) {
      return s;
    }
    std::vector<std::string> keys;
    for (int r = 0; r < options_.world_size; ++r) keys.push_back(Key("worker/", r));
    if (absl::Status s = store_->Wait(keys, deadline - absl::Now()); !s.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(
          options_.name, ": not every worker joined within ", absl::FormatDuration(options_.start_timeout),
          " (", s.message(), "); check WORLD_SIZE and that every rank was started"));
    }
    workers_.resize(static_cast<size_t>(options_.world_size));
    for (int r = 0; r < options_.world_size; ++r) {
      auto v = store_->Get(Key("worker/", r), deadline - absl::Now());
      if (!v.ok()) return v.status();
      std::vector<std::string> parts = absl::StrSplit(*v, '\n');
      if (parts.size() != 3) return absl::DataLossError(absl::StrCat("bad worker record for rank ", r));
      WorkerInfo& w = workers_[static_cast<size_t>(r)];
      w.name = parts[0];
      w.rank = r;
      w.address = parts[1];
      if (!absl::SimpleAtoi(parts[2], &w.pid)) w.pid = 0;
      if (by_name_.contains(w.name)) {
        return absl::InvalidArgumentError(absl::StrCat("worker name '", w.name, "' is used by ranks ",
                                                       by_name_[w.name], " and ", r));
      }
      by_name_[w.name] = r;
    }
    std::vector<std::string> names;
    for (const WorkerInfo& w : workers_) names.push_back(w.name);
    rrefs_->SetWorkerNames(std::move(names));
    outgoing_.resize(workers_.size());
    {
      absl::MutexLock lock(&mu_);
      for (const WorkerInfo& w : workers_) dial_address_.push_back(w.address);
    }
    dial_mu_ = std::vector<absl::Mutex>(workers_.size());
    timer_ = std::thread([this] { TimerLoop(); });
    return absl::OkStatus();
  }

  // ---------------------------------------------------------------- registry

  absl::Status Register(const std::string& name, RawHandler handler, RegisterOptions options) {
    absl::MutexLock lock(&mu_);
    if (!handlers_.emplace(name, std::make_shared<Handler>(Handler{std::move(handler), options.mode})).second) {
      return absl::AlreadyExistsError(absl::StrCat(options_.name, ": function '", name,
                                                   "' is already registered"));
    }
    return absl::OkStatus();
  }

  // ---------------------------------------------------------------- calls

  void Call(const std::string& to, const std::string& function, ValueList args,
            CallOptions call_options, std::function<void(absl::StatusOr<Value>)> done) {
    auto it = by_name_.find(to);
    if (it == by_name_.end()) {
      done(absl::NotFoundError(absl::StrCat("no worker named '", to, "' (workers: ", WorkerNames(), ")")));
      return;
    }
    const int rank = it->second;
    const absl::Duration timeout =
        call_options.timeout > absl::ZeroDuration() ? call_options.timeout : options_.default_timeout;
    Envelope env;
    env.kind = Kind::kRequest;
    env.function = function;
    env.payload = Value(std::move(args));
    env.timeout_ms = absl::ToInt64Milliseconds(timeout);
    bool running;
    bool pipelined = false;
    {
      absl::MutexLock lock(&mu_);
      // While shutting down, handlers still serve peers and may call out; RRef control
      // messages still flow (references released late must reach their owner).
      running = state_ == State::kRunning ||
                (state_ == State::kShuttingDown &&
                 (t_handler_depth > 0 || function == "__rref.fork" || function == "__rref.accept" ||
                  function == "__rref.delete"));
      pipelined = pending_.size() >= kPipelinedCalls;
      if (running) {
        env.id = next_id_++;
        const absl::Time deadline = absl::Now() + timeout;
        pending_.emplace(env.id, Pending{std::move(done), rank, function, deadline, timeout});
        deadlines_.emplace(deadline, env.id);
      }
    }
    if (!running) {
      done(absl::FailedPreconditionError(absl::StrCat(options_.name, " is shutting down; call to ",
                                                      to, ".", function, " not sent")));
      return;
    }
    if (absl::Status s = rrefs_->PrepareOutgoing(&env.payload, rank); !s.ok()) {
      Complete(env.id, absl::Status(s.code(), absl::StrCat("call to ", to, ".", function, ": ", s.message())));
      return;
    }
    if (hooks_) {
      if (absl::Status s = hooks_->OnSendRequest(rank, env.payload, env.meta); !s.ok()) {
        rrefs_->AbandonOutgoing(&env.payload);
        Complete(env.id, absl::Status(s.code(), absl::StrCat("call to ", to, ".", function, ": ", s.message())));
        return;
      }
    }
    absl::StatusOr<Message> message = internal::EncodeEnvelope(env);
    if (!message.ok()) {
      rrefs_->AbandonOutgoing(&env.payload);
      Complete(env.id, absl::InvalidArgumentError(absl::StrCat("call to ", to, ".", function, ": ",
                                                               message.status().message())));
      return;
    }
    absl::StatusOr<std::shared_ptr<Connection>> conn = Outgoing(rank);
    if (!conn.ok()) {
      rrefs_->AbandonOutgoing(&env.payload);
      Complete(env.id, conn.status());
      return;
    }
    const uint64_t id = env.id;
    auto on_sent = [this, id](absl::Status s) {
      if (!s.ok()) Complete(id, s);
    };
    // Many calls in flight: let requests issued close together share one write.
    if (pipelined) {
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
    if (graceful) result = GracefulBarrier();
    Close(absl::CancelledError(absl::StrCat(options_.name, " shut down")));
    return result;
  }

  void Close(const absl::Status& reason) {
    {
      absl::MutexLock lock(&mu_);
      if (state_ == State::kClosed) return;
      state_ = State::kClosed;
    }
    if (transport_) transport_->Shutdown();
    FailAll(reason);
    if (rrefs_) rrefs_->Close();
    if (timer_.joinable()) timer_.join();
    pool_.Shutdown();
    {
      absl::MutexLock lock(&mu_);
      outgoing_.clear();
    }
    store_.reset();
    if (store_server_) store_server_->Shutdown();
  }

  const AgentOptions& options() const { return options_; }
  const WorkerInfo& self() const { return self_; }
  const std::vector<WorkerInfo>& workers() const { return workers_; }
  absl::StatusOr<WorkerInfo> Worker(const std::string& name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return absl::NotFoundError(absl::StrCat("no worker named '", name, "'"));
    return workers_[static_cast<size_t>(it->second)];
  }
  Store& store() { return *store_; }
  Executor& executor() { return pool_; }

 private:
  enum class State { kRunning, kShuttingDown, kClosed };

  struct Handler {
    RawHandler fn;
    HandlerMode mode;
  };

  struct Pending {
    std::function<void(absl::StatusOr<Value>)> done;
    int rank;
    std::string function;
    absl::Time deadline;
    absl::Duration timeout;
  };

  std::string Key(const char* what, int rank) const {
    return absl::StrCat(options_.run_id, "/", what, rank);
  }

  std::string WorkerNames() const {
    std::vector<std::string> names;
    for (const auto& w : workers_) names.push_back(w.name);
    return absl::StrJoin(names, ", ");
  }

  std::string Describe(int rank) const {
    return absl::StrCat(workers_[static_cast<size_t>(rank)].name, " (rank ", rank, ")");
  }

  ConnectionCallbacks Callbacks() {
    return {[this](const std::shared_ptr<Connection>& c, Message m) { OnMessage(c, std::move(m)); },
            [this](const std::shared_ptr<Connection>& c, const absl::Status& s) { OnClose(c, s); },
            [this](const std::shared_ptr<Connection>& c) { OnFlush(c); }};
  }

  absl::StatusOr<std::shared_ptr<Connection>> Outgoing(int rank) {
    {
      absl::MutexLock lock(&mu_);
      if (outgoing_[rank] && !outgoing_[rank]->closed()) return outgoing_[rank];
    }
    absl::MutexLock dial(&dial_mu_[rank]);
    {
      absl::MutexLock lock(&mu_);
      if (outgoing_[rank] && !outgoing_[rank]->closed()) return outgoing_[rank];
    }
    // Every worker was listening before Start returned, so a refused connection means the
    // peer is gone: retry only briefly.
    std::string address;
    {
      absl::MutexLock lock(&mu_);
      address = dial_address_[rank];
    }
    auto conn = transport_->Connect(address, Callbacks(), absl::Now() + absl::Seconds(2));
    if (!conn.ok()) {
      // A restarted worker announces its rank again with a new address: look it up.
      if (absl::StatusOr<std::string> record = store_->Get(Key("worker/", rank), absl::Seconds(1)); record.ok()) {
        std::vector<std::string> parts = absl::StrSplit(*record, '\n');
        if (parts.size() == 3 && parts[1] != address) {
          {
            absl::MutexLock lock(&mu_);
            dial_address_[rank] = parts[1];
          }
          conn = transport_->Connect(parts[1], Callbacks(), absl::Now() + absl::Seconds(2));
        }
      }
    }
    if (!conn.ok()) {
      return absl::UnavailableError(absl::StrCat(Describe(rank), " is unavailable: ", conn.status().message()));
    }
    Envelope hello;
    hello.kind = Kind::kHello;
    hello.payload = Value(static_cast<int64_t>(options_.rank));
    if (auto m = internal::EncodeEnvelope(hello); m.ok()) (*conn)->Send(std::move(*m));
    absl::MutexLock lock(&mu_);
    outgoing_[rank] = *conn;
    conn_rank_[conn->get()] = rank;
    return *conn;
  }

  void OnMessage(const std::shared_ptr<Connection>& conn, Message m) {
    absl::StatusOr<Envelope> env = internal::DecodeEnvelope(std::move(m));
    if (!env.ok()) {
      conn->Close(absl::DataLossError(absl::StrCat("bad envelope from ", conn->peer(), ": ",
                                                   env.status().message())));
      return;
    }
    if (env->has_rrefs) {
      // RRefs in the payload become references held here (rref.h protocol).
      int from = -1;
      {
        absl::MutexLock lock(&mu_);
        // Also for a reply to a call that already timed out: its RRefs must still be
        // adopted (and then dropped), or their owner would keep them.
        auto it = conn_rank_.find(conn.get());
        if (it != conn_rank_.end()) from = it->second;
      }
      absl::Status s = from < 0 ? absl::InvalidArgumentError("RRefs from an unidentified peer")
                                : rrefs_->AdoptIncoming(&env->payload, from);
      if (!s.ok()) {
        if (env->kind == Kind::kResponse) {
          Complete(env->id, s);
        } else if (env->kind == Kind::kRequest) {
          {
            absl::MutexLock lock(&mu_);
            ++inflight_handlers_;
          }
          Reply(conn, env->id, absl::InvalidArgumentError(absl::StrCat(env->function, ": ", s.message())), nullptr);
        }
        return;
      }
    }
    if (env->kind == Kind::kResponse && hooks_ && env->status.ok()) {
      int from = -1;
      {
        absl::MutexLock lock(&mu_);
        auto it = pending_.find(env->id);
        if (it != pending_.end()) from = it->second.rank;
      }
      if (absl::Status s = hooks_->OnReceiveReply(from, env->payload, env->meta); !s.ok()) {
        Complete(env->id, s);
        return;
      }
    }
    switch (env->kind) {
      case Kind::kResponse:
        Complete(env->id, env->status.ok() ? absl::StatusOr<Value>(std::move(env->payload))
                                           : absl::StatusOr<Value>(RemoteError(conn, *env)));
        return;
      case Kind::kHello: {
        absl::MutexLock lock(&mu_);
        if (env->payload.is<int64_t>()) {
          const int64_t r = env->payload.get<int64_t>();
          if (r >= 0 && r < static_cast<int64_t>(workers_.size())) conn_rank_[conn.get()] = static_cast<int>(r);
        }
        return;
      }
      case Kind::kRequest:
        HandleRequest(conn, std::move(*env));
        return;
    }
  }

  absl::Status RemoteError(const std::shared_ptr<Connection>& conn, const Envelope& env) {
    std::string function;
    int rank = -1;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(env.id);
      if (it != pending_.end()) {
        function = it->second.function;
        rank = it->second.rank;
      }
    }
    const std::string who = rank >= 0 ? workers_[rank].name : conn->peer();
    return absl::Status(env.status.code(), absl::StrCat(who, ".", function, ": ", env.status.message()));
  }

  // Requests decoded from one read of a connection are handled as a batch: inline
  // handlers run at once, pool handlers are handed to the pool in at most one task per
  // pool thread (one wake-up instead of one per request), and the replies that are ready
  // when a task ends leave in one gather-write.
  struct Request {
    std::shared_ptr<Handler> handler;
    CallInfo info;
    uint64_t id;
    ValueList args;
    CallHooks::Scope scope;  // from CallHooks::OnReceiveRequest
  };
  struct ReadBatch {
    std::vector<Request> pool;
    std::vector<Message> replies;
    std::vector<std::function<void()>> deferred;  // pool work started by inline handlers
  };
  // The read batch of the inline handler running on this I/O thread (see Defer).
  static thread_local ReadBatch* t_read_batch;
  // > 0 while this thread runs a handler (which may call out during graceful shutdown).
  static thread_local int t_handler_depth;

  void HandleRequest(const std::shared_ptr<Connection>& conn, Envelope env) {
    std::shared_ptr<Handler> handler;
    Request request;
    request.id = env.id;
    request.info.function = env.function;
    {
      absl::MutexLock lock(&mu_);
      auto h = handlers_.find(env.function);
      if (h != handlers_.end()) request.handler = h->second;
      auto r = conn_rank_.find(conn.get());
      request.info.caller = r != conn_rank_.end() ? workers_[r->second].name : "unknown";
      request.info.caller_rank = r != conn_rank_.end() ? r->second : -1;
      ++inflight_handlers_;
    }
    ReadBatch batch;
    if (hooks_) {
      absl::StatusOr<CallHooks::Scope> scope = hooks_->OnReceiveRequest(RankOf(conn), env.payload, env.meta);
      if (!scope.ok()) {
        Reply(conn, request.id, absl::Status(scope.status().code(), absl::StrCat(env.function, ": ", scope.status().message())),
              &batch.replies);
        request.handler = nullptr;
        MergeBatch(conn, batch);
        return;
      }
      request.scope = std::move(*scope);
    }
    if (env.payload.is<ValueList>()) request.args = std::move(std::get<ValueList>(env.payload.storage()));
    if (!request.handler) {
      std::vector<std::string> names;
      {
        absl::MutexLock lock(&mu_);
        for (const auto& [n, _] : handlers_) names.push_back(n);
      }
      std::sort(names.begin(), names.end());
      Reply(conn, request.id,
            absl::NotFoundError(absl::StrCat(options_.name, " has no function '", env.function,
                                             "' (registered: ", absl::StrJoin(names, ", "), ")")),
            &batch.replies);
    } else if (request.handler->mode == HandlerMode::kInline) {
      t_read_batch = &batch;  // Defer() called by the handler lands in this read's batch
      Run(conn, std::move(request), &batch.replies);
      t_read_batch = nullptr;
    } else {
      batch.pool.push_back(std::move(request));
    }
    MergeBatch(conn, batch);
  }

  void MergeBatch(const std::shared_ptr<Connection>& conn, ReadBatch& batch) {
    absl::MutexLock lock(&batch_mu_);
    ReadBatch& pending = batches_[conn.get()];
    for (Message& m : batch.replies) pending.replies.push_back(std::move(m));
    for (Request& r : batch.pool) pending.pool.push_back(std::move(r));
    for (auto& fn : batch.deferred) pending.deferred.push_back(std::move(fn));
  }

  int RankOf(const std::shared_ptr<Connection>& conn) {
    absl::MutexLock lock(&mu_);
    auto it = conn_rank_.find(conn.get());
    return it == conn_rank_.end() ? -1 : it->second;
  }

  // Runs fn on the worker pool; from an inline handler, with the rest of its read's pool
  // work (one hand-off for the whole read).
  void Defer(std::function<void()> fn) {
    if (hooks_) {
      if (CallHooks::Scope scope = hooks_->CurrentScope()) {
        fn = [hooks = hooks_, scope, fn = std::move(fn)] { hooks->RunInScope(scope, fn); };
      }
    }
    if (t_read_batch != nullptr) {
      t_read_batch->deferred.push_back(std::move(fn));
    } else {
      (void)pool_.Post(std::move(fn));  // dropped after shutdown, as queued work is
    }
  }

  // on_flush: the read's requests are all in; hand them off.
  void OnFlush(const std::shared_ptr<Connection>& conn) {
    ReadBatch batch;
    {
      absl::MutexLock lock(&batch_mu_);
      auto it = batches_.find(conn.get());
      if (it == batches_.end()) return;
      batch = std::move(it->second);
      batches_.erase(it);
    }
    if (!batch.replies.empty()) conn->SendMany(std::move(batch.replies));
    const size_t n = batch.pool.size(), d = batch.deferred.size();
    const size_t tasks = std::min(std::max(n, d), pool_.num_threads());
    for (size_t t = 0; t < tasks; ++t) {
      std::vector<Request> chunk;
      for (size_t i = t * n / tasks; i < (t + 1) * n / tasks; ++i) chunk.push_back(std::move(batch.pool[i]));
      std::vector<std::function<void()>> deferred;
      for (size_t i = t * d / tasks; i < (t + 1) * d / tasks; ++i) deferred.push_back(std::move(batch.deferred[i]));
      auto run = [this, conn, chunk = std::move(chunk), deferred = std::move(deferred)]() mutable {
        ++t_handler_depth;  // deferred work belongs to handlers
        for (auto& fn : deferred) fn();
        --t_handler_depth;
        std::vector<Message> replies;
        for (Request& r : chunk) Run(conn, std::move(r), &replies);
        if (!replies.empty()) conn->SendMany(std::move(replies));
      };
      if (!pool_.Post(std::move(run))) {
        // The pool has shut down: answer what it will not run.
        std::vector<Message> replies;
        for (size_t i = t * n / tasks; i < (t + 1) * n / tasks; ++i) {
          Reply(conn, batch.pool[i].id, absl::UnavailableError(absl::StrCat(options_.name, " is shutting down")),
                &replies);
        }
        conn->SendMany(std::move(replies));
      }
    }
  }

  // Runs one request's handler; a result that is ready goes into `replies`, a later one
  // is sent on its own when it arrives.
  void Run(const std::shared_ptr<Connection>& conn, Request r, std::vector<Message>* replies) {
    Future<Value> result;
    absl::Status thrown;
    auto call = [&] {
      try {
        result = r.handler->fn(r.info, std::move(r.args));
      } catch (const std::exception& e) {
        thrown = absl::InternalError(absl::StrCat(r.info.function, " threw: ", e.what()));
      }
    };
    ++t_handler_depth;
    if (hooks_) {
      hooks_->RunInScope(r.scope, call);
    } else {
      call();
    }
    --t_handler_depth;
    if (!thrown.ok()) {
      Reply(conn, r.id, thrown, replies, r.scope);
    } else if (result.IsReady()) {
      Reply(conn, r.id, result.Get(absl::ZeroDuration()), replies, r.scope);  // answered synchronously: no hop
    } else {
      // Sent by the thread that completes the handler's future: no pool hop.
      result.Subscribe([this, conn, id = r.id, scope = r.scope](const absl::StatusOr<Value>& v) {
        Reply(conn, id, v, nullptr, scope);
      });
    }
  }

  // Encodes the response to call `id`; appends it to `batch`, or sends it now if null.
  void Reply(const std::shared_ptr<Connection>& conn, uint64_t id, const absl::StatusOr<Value>& result,
             std::vector<Message>* batch, const CallHooks::Scope& scope = nullptr) {
    Envelope env;
    env.kind = Kind::kResponse;
    env.id = id;
    if (result.ok()) {
      env.payload = *result;
    } else {
      env.status = result.status();
    }
    int to = -1;
    {
      absl::MutexLock lock(&mu_);
      auto it = conn_rank_.find(conn.get());
      if (it != conn_rank_.end()) to = it->second;
    }
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
      env.status = absl::InternalError(absl::StrCat("cannot encode the result: ", m.status().message()));
      m = internal::EncodeEnvelope(env);
    }
    if (m.ok()) {
      if (batch) {
        batch->push_back(std::move(*m));
      } else {
        conn->Send(std::move(*m));
      }
    }
    absl::MutexLock lock(&mu_);
    --inflight_handlers_;
  }

  void OnClose(const std::shared_ptr<Connection>& conn, const absl::Status& reason) {
    OnFlush(conn);  // requests read before the close still run (their replies are dropped)
    int rank = -1;
    bool outgoing = false;
    bool running = false;
    {
      absl::MutexLock lock(&mu_);
      running = state_ == State::kRunning;
      auto it = conn_rank_.find(conn.get());
      if (it != conn_rank_.end()) {
        rank = it->second;
        conn_rank_.erase(it);
      }
      if (rank >= 0 && rank < static_cast<int>(outgoing_.size()) && outgoing_[rank] == conn) {
        outgoing_[rank].reset();
        outgoing = true;
      }
    }
    // Connections close when the peer is dead or shut down: its references go (rref.h).
    // Not while we shut down ourselves: peers closing then is expected, and dropping their
    // forks would hide the leaks the shutdown check reports.
    // Only a peer that closed or reset the connection counts as gone (not a malformed
    // frame or a stalled send, after which the peer may well be alive).
    if (rank >= 0 && rrefs_ && running && reason.code() == absl::StatusCode::kUnavailable) {
      rrefs_->OnPeerGone(rank);
      if (hooks_) hooks_->OnPeerGone(rank);
    }
    if (!outgoing) return;
    // Our outgoing connection to `rank` died: its calls cannot be answered.
    std::vector<std::function<void(absl::StatusOr<Value>)>> failed;
    std::vector<std::string> functions;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.rank == rank) {
          failed.push_back(std::move(it->second.done));
          functions.push_back(it->second.function);
          deadlines_.erase({it->second.deadline, it->first});
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (size_t i = 0; i < failed.size(); ++i) {
      failed[i](absl::UnavailableError(absl::StrCat("call to ", Describe(rank), ".", functions[i],
                                                    " failed: ", reason.message())));
    }
  }

  void Complete(uint64_t id, absl::StatusOr<Value> result) {
    std::function<void(absl::StatusOr<Value>)> done;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;  // timed out or failed already
      done = std::move(it->second.done);
      deadlines_.erase({it->second.deadline, id});
      pending_.erase(it);
    }
    done(std::move(result));
  }

  void FailAll(const absl::Status& reason) {
    std::vector<std::function<void(absl::StatusOr<Value>)>> failed;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [id, p] : pending_) failed.push_back(std::move(p.done));
      pending_.clear();
      deadlines_.clear();
    }
    for (auto& f : failed) f(reason);
  }

  void TimerLoop() {
    absl::MutexLock lock(&mu_);
    while (state_ != State::kClosed) {
      const absl::Time next = deadlines_.empty() ? absl::Now() + absl::Milliseconds(200)
                                                 : std::min(deadlines_.begin()->first,
                                                            absl::Now() + absl::Milliseconds(200));
      auto wake = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return state_ == State::kClosed || (!deadlines_.empty() && deadlines_.begin()->first < next);
      };
      mu_.AwaitWithDeadline(absl::Condition(&wake), next);
      const absl::Time now = absl::Now();
      std::vector<std::pair<std::function<void(absl::StatusOr<Value>)>, std::string>> expired;
      while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
        const uint64_t id = deadlines_.begin()->second;
        deadlines_.erase(deadlines_.begin());
        auto it = pending_.find(id);
        if (it == pending_.end()) continue;
        expired.emplace_back(std::move(it->second.done),
                             absl::StrCat("call to ", Describe(it->second.rank), ".", it->second.function,
                                          " timed out after ", absl::FormatDuration(it->second.timeout)));
        pending_.erase(it);
      }
      if (expired.empty()) continue;
      mu_.Unlock();
      for (auto& [done, msg] : expired) done(absl::DeadlineExceededError(msg));
      mu_.Lock();
    }
  }

  absl::Status GracefulBarrier() {
    const absl::Time deadline = absl::Now() + options_.shutdown_timeout;
    // 1. Our own calls, and the RRef control messages they caused, finish (or time out).
    DrainCalls(deadline);
    // 2. Everyone reaches shutdown while still serving; 3. everyone saw that.
    absl::Status s = store_->Set(Key("shutdown/", options_.rank), "1");
    std::vector<std::string> all, drained, exited;
    for (int r = 0; r < options_.world_size; ++r) {
      all.push_back(Key("shutdown/", r));
      drained.push_back(Key("rrefs_drained/", r));
      exited.push_back(Key("exited/", r));
    }
    if (s.ok()) s = store_->Wait(all, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    // Messages that peers sent us before they stopped may have started more RRef
    // control traffic: a second drain round, then every owner's table is final.
    absl::Status leaks;
    if (s.ok()) {
      DrainCalls(deadline);
      s = store_->Set(Key("rrefs_drained/", options_.rank), "1");
      if (s.ok()) s = store_->Wait(drained, std::max(absl::ZeroDuration(), deadline - absl::Now()));
      if (s.ok()) leaks = CheckLeaks();
    }
    if (s.ok()) s = store_->Set(Key("exited/", options_.rank), "1");
    // Handlers still running for peers finish before we close.
    {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inflight_handlers_ == 0; };
      mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
    }
    // The store host stays up until everyone has read the barrier.
    if (s.ok() && store_server_) s = store_->Wait(exited, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!s.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(options_.name, ": graceful shutdown did not complete: ",
                                                      s.message()));
    }
    return leaks;
  }

  void DrainCalls(absl::Time deadline) {
    while (absl::Now() < deadline) {
      bool calls_done;
      {
        absl::MutexLock lock(&mu_);
        calls_done = pending_.empty();
      }
      if (calls_done && rrefs_->Idle()) return;  // not under mu_: the context's lock comes first
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  absl::Status CheckLeaks() {
    if (options_.rref_leak_check == AgentOptions::LeakCheck::kOff) return absl::OkStatus();
    // A peer's last reference may be released a moment after its drain (by the thread
    // that completed the call which carried it): give such deletes a short grace period.
    std::vector<std::string> leaks = rrefs_->Leaks();
    for (const absl::Time grace = absl::Now() + kLeakGrace; !leaks.empty() && absl::Now() < grace;) {
      absl::SleepFor(absl::Milliseconds(2));
      leaks = rrefs_->Leaks();
    }
    if (leaks.empty()) return absl::OkStatus();
    std::string report = absl::StrCat(options_.name, ": ", leaks.size(),
                                      " owned RRef value(s) still referenced by other workers at shutdown "
                                      "(they kept RRefs past Shutdown):\n  ",
                                      absl::StrJoin(leaks, "\n  "));
    std::fprintf(stderr, "gradwire: %s\n", report.c_str());
    if (options_.rref_leak_check == AgentOptions::LeakCheck::kError) return absl::FailedPreconditionError(report);
    return absl::OkStatus();
  }

  // Runs a registered function here, as a call from `caller` would.
  // With `here`, on this thread whatever the function's mode (the caller is a pool thread).
  Future<Value> InvokeLocal(const std::string& caller, const std::string& function, ValueList args,
                            bool here = false) {
    std::shared_ptr<Handler> handler;
    {
      absl::MutexLock lock(&mu_);
      auto it = handlers_.find(function);
      if (it != handlers_.end()) handler = it->second;
    }
    if (!handler) {
      return MakeReadyFuture<Value>(pool_, absl::NotFoundError(absl::StrCat(options_.name, " has no function '",
                                                                             function, "'")));
    }
    auto caller_it = by_name_.find(caller);
    CallInfo info{caller, function, caller_it == by_name_.end() ? -1 : caller_it->second};
    auto run = [handler, info](ValueList args) -> Future<Value> { return handler->fn(info, std::move(args)); };
    if (here || handler->mode == HandlerMode::kInline) {
      try {
        return run(std::move(args));
      } catch (const std::exception& e) {
        return MakeReadyFuture<Value>(pool_, absl::InternalError(absl::StrCat(function, " threw: ", e.what())));
      }
    }
    Promise<Value> promise(pool_);
    if (!pool_.Post([run, promise, function, args = std::move(args)]() mutable {
          try {
            run(std::move(args)).Subscribe([promise](const absl::StatusOr<Value>& v) { promise.Set(v); });
          } catch (const std::exception& e) {
            promise.Set(absl::InternalError(absl::StrCat(function, " threw: ", e.what())));
          }
        })) {
      promise.Set(absl::UnavailableError(absl::StrCat(options_.name, " is shutting down")));
    }
    return promise.future();
  }

 public:
  RRefPtr RemoteRaw(const std::string& to, const std::string& function, ValueList args, CallOptions options,
                    std::string type) {
    auto it = by_name_.find(to);
    return rrefs_->Remote(it == by_name_.end() ? -1 : it->second, function, std::move(args), options,
                          std::move(type));
  }
  RRefPtr OwnRaw(Value value, std::string type) { return rrefs_->Own(std::move(value), std::move(type)); }
  RRefStats rref_stats() const { return rrefs_->Stats(); }
  void SetCallHooks(std::shared_ptr<CallHooks> hooks) { hooks_ = std::move(hooks); }

 private:

  AgentOptions options_;
  ThreadPool pool_;
  std::unique_ptr<StoreServer> store_server_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Transport> transport_;
  std::shared_ptr<internal::RRefContext> rrefs_;
  std::shared_ptr<CallHooks> hooks_;  // set in setup (SetCallHooks), then read-only
  WorkerInfo self_;
  std::vector<WorkerInfo> workers_;                     // immutable after Start
  absl::flat_hash_map<std::string, int> by_name_;       // immutable after Start
  std::vector<absl::Mutex> dial_mu_;                    // one per rank
  std::thread timer_;

  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kRunning;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Handler>> handlers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Connection>> outgoing_ ABSL_GUARDED_BY(mu_);
  // Where each rank is dialled: workers_' address, or a restarted worker's new one.
  std::vector<std::string> dial_address_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Connection*, int> conn_rank_ ABSL_GUARDED_BY(mu_);
  int inflight_handlers_ ABSL_GUARDED_BY(mu_) = 0;
  // Requests of the current read of each connection, until its on_flush.
  absl::Mutex batch_mu_;
  absl::flat_hash_map<Connection*, ReadBatch> batches_ ABSL_GUARDED_BY(batch_mu_);
};

thread_local Agent::Impl::ReadBatch* Agent::Impl::t_read_batch = nullptr;
thread_local int Agent::Impl::t_handler_depth = 0;

absl::StatusOr<std::shared_ptr<Agent>> Agent::Start(AgentOptions options,
                                                   const std::function<void(Agent&)>& setup) {
  std::shared_ptr<Agent> agent(new Agent(std::make_unique<Impl>(std::move(options))));
  if (absl::Status s = agent->impl_->Start(setup, *agent); !s.ok()) {
    agent->impl_->Close(s);
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
const AgentOptions& Agent::options() const { return impl_->options(); }
absl::Status Agent::RegisterRaw(const std::string& name, RawHandler handler, RegisterOptions options) {
  return impl_->Register(name, std::move(handler), options);
}
void Agent::CallRaw(const std::string& to, const std::string& function, ValueList args,
                    CallOptions options, std::function<void(absl::StatusOr<Value>)> done) {
  impl_->Call(to, function, std::move(args), options, std::move(done));
}
absl::Status Agent::Shutdown(bool graceful) { return impl_->Shutdown(graceful); }
RRefPtr Agent::RemoteRaw(const std::string& to, const std::string& function, ValueList args, CallOptions options,
                         std::string type) {
  return impl_->RemoteRaw(to, function, std::move(args), options, std::move(type));
}
RRefPtr Agent::OwnRaw(Value value, std::string type) { return impl_->OwnRaw(std::move(value), std::move(type)); }
RRefStats Agent::rref_stats() const { return impl_->rref_stats(); }
void Agent::SetCallHooks(std::shared_ptr<CallHooks> hooks) { impl_->SetCallHooks(std::move(hooks)); }

}  // namespace gw::rpc
