#include "calls/dispatcher.h"

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/message.h"

namespace gw::rpc::internal {

thread_local Dispatcher::ReadBatch* Dispatcher::t_read_batch = nullptr;
thread_local int Dispatcher::t_handler_depth = 0;

namespace {

// The agent's own queries of what this worker waits for (waits.h), left out of it.
constexpr absl::string_view kObserveQueries = "__observe.";

// The one exception boundary of handlers (errors.h).
Future<Value> Invoke(const RawHandler& fn, const CallInfo& info, ValueList args, Executor& ex) {
  absl::StatusOr<Future<Value>> f =
      CatchExceptions(info.function, [&]() -> absl::StatusOr<Future<Value>> { return fn(info, std::move(args)); });
  if (!f.ok()) return MakeReadyFuture<Value>(ex, f.status());
  return *std::move(f);
}

// The layers that serve gradwire's own protocols: for a protocol function missing on a
// worker, which layer it lacks and how that is installed (in `who`'s Agent::Start setup).
struct Layer {
  absl::string_view prefix;
  absl::string_view missing;  // "<what> is not installed on"
  absl::string_view install;
};
constexpr Layer kLayers[] = {
    {"__dist.", "distributed autograd is not installed on",
     "call dist_autograd::DistAutograd::Install(agent) in its Agent::Start setup (every worker that runs part of "
     "a distributed backward pass, or owns parameters a DistributedOptimizer updates, needs it)"},
    {"__module.", "remote modules are not set up on",
     "register its module factories with dist_nn::RegisterModuleFactory in its Agent::Start setup"},
    {"__ps.", "no parameter server is installed on",
     "call param_server::ParameterServer::Install(agent, options) in its Agent::Start setup, or use the "
     "workers that are parameter servers"},
    {"__serve.", "serving is not installed on", "call serve::Serving::Install(agent) in its Agent::Start setup"},
    {"__coll.", "collectives are not installed on",
     "call collectives::Collectives::Install(agent) in its Agent::Start setup (every member of the group needs it)"},
    {"__parallel.", "pipeline stage replicas are not served on",
     "call parallel::ServeStageReplicas(agent, collectives, engine) in its Agent::Start setup"},
};

}  // namespace

absl::Status Dispatcher::MissingFunctionError(const std::string& function) const {
  if (IsReservedName(function)) {
    for (const Layer& layer : kLayers) {
      if (absl::StartsWith(function, layer.prefix)) {
        return absl::NotFoundError(absl::StrCat(layer.missing, " ", self_name_, ": ", layer.install));
      }
    }
    // The agent's and the RRef protocol's functions are always there: the peer that
    // called is another gradwire.
    return absl::NotFoundError(absl::StrCat(
        self_name_, " does not serve a protocol message of gradwire ('", function,
        "'): its caller runs a different version of gradwire, or a layer of it that is not installed on ", self_name_));
  }
  std::vector<std::string> names;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [n, _] : handlers_) {
      if (!IsReservedName(n)) names.push_back(n);
    }
  }
  std::sort(names.begin(), names.end());
  return absl::NotFoundError(absl::StrCat(self_name_, " has no function '", function,
                                          "' (registered: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

Dispatcher::Dispatcher(std::string self_name, ThreadPool& pool, Peers peers, int max_calls_in_flight,
                       CallMetrics* metrics, Tracer* tracer)
    : self_name_(std::move(self_name)),
      pool_(pool),
      peers_(std::move(peers)),
      max_calls_in_flight_(max_calls_in_flight),
      metrics_(metrics),
      tracer_(tracer != nullptr && tracer->enabled() ? tracer : nullptr) {
  if (tracer_ != nullptr) {
    category_ = tracer_->Intern("rpc.handler");
    peer_arg_ = tracer_->Intern("peer");
    queued_arg_ = tracer_->Intern("queued_us");
  }
}

Dispatcher::~Dispatcher() = default;

void Dispatcher::AppendWaits(std::vector<Wait>& out) const {
  slots_.AppendWaits(out, [this](int rank) { return peers_.name_of(rank); });
}

void Dispatcher::TraceHandler(Tracer::Name name, int caller, uint64_t id, const Timing& timing, int64_t begin_us,
                              uint64_t in, bool replied, uint64_t context) {
  const int64_t end_us = tracer_->Now();
  // How long the request waited for a thread: from its arrival (the metrics' clock) to
  // the handler's start.
  const int64_t queued_us =
      timing.series != nullptr
          ? std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - timing.start)
                    .count() -
                (end_us - begin_us)
          : 0;
  tracer_->Record({.category = category_,
                   .name = name,
                   .begin_us = begin_us,
                   .end_us = end_us,
                   .flow_in = in,
                   .flow_out = replied ? Tracer::ReplyFlow(caller, id) : 0,
                   .arg_names = {peer_arg_, in != 0 ? queued_arg_ : Tracer::Name{0}},
                   .arg_values = {caller, std::max<int64_t>(0, queued_us)},
                   .context = context});
}

Dispatcher::Timing Dispatcher::Arrived(int from, const std::string& function, bool registered, uint64_t bytes) {
  if (metrics_ == nullptr) return {};
  CallMetrics::Series& series = metrics_->For(CallMetrics::Side::kServer, from,
                                              registered ? std::string_view(function) : CallMetrics::kUnknownFunction);
  series.Received(bytes);
  return {&series, std::chrono::steady_clock::now()};
}

absl::Status Dispatcher::Register(const std::string& name, RawHandler handler, RegisterOptions options) {
  absl::MutexLock lock(&mu_);
  const Tracer::Name traced_name = tracer_ != nullptr ? tracer_->Intern(name) : 0;
  if (!handlers_.emplace(name, std::make_shared<Handler>(Handler{std::move(handler), options.mode, traced_name}))
           .second) {
    return absl::AlreadyExistsError(absl::StrCat(self_name_, ": function '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

void Dispatcher::ClearHandlers() {
  absl::flat_hash_map<std::string, std::shared_ptr<Handler>> gone;
  {
    absl::WriterMutexLock lock(&mu_);
    gone.swap(handlers_);
  }
  gone.clear();  // outside the lock: a handler's state may call out
}

bool Dispatcher::Has(const std::string& name) const { return Find(name) != nullptr; }

std::shared_ptr<Dispatcher::Handler> Dispatcher::Find(const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = handlers_.find(name);
  return it == handlers_.end() ? nullptr : it->second;
}

int Dispatcher::Started(int from) {
  absl::MutexLock lock(&idle_mu_);
  ++inflight_;
  return ++inflight_by_peer_[from];
}

void Dispatcher::OnRequest(const std::shared_ptr<Connection>& conn, int from, Envelope env, uint64_t bytes) {
  Request request;
  request.id = env.id;
  request.info.function = env.function;
  request.info.caller_rank = from;
  request.info.caller = from >= 0 ? peers_.name_of(from) : "unknown";
  request.handler = Find(env.function);
  request.timing = Arrived(from, env.function, request.handler != nullptr, bytes);
  ReadBatch batch;
  // gradwire's own protocols (reserved names: RRef forks and deletes, context releases,
  // membership) are never refused: refusing them would leak what the limits protect.
  if (const int running = Started(from);
      max_calls_in_flight_ > 0 && running > max_calls_in_flight_ && !IsReservedName(env.function)) {
    Reply(conn, from, request.id,
          absl::ResourceExhaustedError(absl::StrCat(
              env.function, ": ", request.info.caller, " has ", running - 1, " calls in flight on ", self_name_,
              ", its limit (PeerLimits::max_calls_in_flight, GRADWIRE_MAX_CALLS_IN_FLIGHT): wait for replies "
              "before sending more")),
          &batch.replies, nullptr, request.timing);
    MergeBatch(conn, batch);
    return;
  }
  if (hooks_) {
    absl::StatusOr<CallHooks::Scope> scope = hooks_->OnReceiveRequest(request.info.caller_rank, env.payload, env.meta);
    if (!scope.ok()) {
      Reply(conn, from, request.id,
            absl::Status(scope.status().code(), absl::StrCat(env.function, ": ", scope.status().message())),
            &batch.replies, nullptr, request.timing);
      MergeBatch(conn, batch);
      return;
    }
    request.scope = std::move(*scope);
  }
  if (env.payload.is<ValueList>()) request.args = std::move(std::get<ValueList>(env.payload.storage()));
  if (!request.handler) {
    Reply(conn, from, request.id, MissingFunctionError(env.function), &batch.replies, nullptr, request.timing);
  } else if (request.handler->mode == HandlerMode::kInline) {
    t_read_batch = &batch;  // Defer() called by the handler lands in this read's batch
    Run(conn, std::move(request), &batch.replies);
    t_read_batch = nullptr;
  } else {
    batch.pool.push_back(std::move(request));
  }
  MergeBatch(conn, batch);
}

void Dispatcher::Refuse(const std::shared_ptr<Connection>& conn, int from, uint64_t id, const absl::Status& why,
                        const std::string& function, uint64_t bytes) {
  Started(from);
  Reply(conn, from, id, why, nullptr, nullptr, Arrived(from, function, Has(function), bytes));
}

void Dispatcher::MergeBatch(const std::shared_ptr<Connection>& conn, ReadBatch& batch) {
  absl::MutexLock lock(&batch_mu_);
  ReadBatch& pending = batches_[conn.get()];
  for (Message& m : batch.replies.messages) pending.replies.messages.push_back(std::move(m));
  for (int to : batch.replies.to) pending.replies.to.push_back(to);
  for (Request& r : batch.pool) pending.pool.push_back(std::move(r));
  for (auto& fn : batch.deferred) pending.deferred.push_back(std::move(fn));
}

void Dispatcher::Defer(std::function<void()> fn) {
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

void Dispatcher::OnFlush(const std::shared_ptr<Connection>& conn) {
  ReadBatch batch;
  {
    absl::MutexLock lock(&batch_mu_);
    auto it = batches_.find(conn.get());
    if (it == batches_.end()) return;
    batch = std::move(it->second);
    batches_.erase(it);
  }
  if (!batch.replies.to.empty()) SendBatch(conn, std::move(batch.replies));
  const size_t n = batch.pool.size(), d = batch.deferred.size();
  const size_t tasks = std::min(std::max(n, d), pool_.num_threads());
  for (size_t t = 0; t < tasks; ++t) {
    std::vector<Request> chunk;
    for (size_t i = t * n / tasks; i < (t + 1) * n / tasks; ++i) chunk.push_back(std::move(batch.pool[i]));
    std::vector<std::function<void()>> deferred;
    for (size_t i = t * d / tasks; i < (t + 1) * d / tasks; ++i) deferred.push_back(std::move(batch.deferred[i]));
    struct Id {
      int caller;
      uint64_t request;
      Timing timing;
    };
    std::vector<Id> ids;
    for (const Request& r : chunk) ids.push_back({r.info.caller_rank, r.id, r.timing});
    auto run = [this, conn, chunk = std::move(chunk), deferred = std::move(deferred)]() mutable {
      ++t_handler_depth;  // deferred work belongs to handlers
      for (auto& fn : deferred) fn();
      --t_handler_depth;
      ReplyBatch replies;
      for (Request& r : chunk) Run(conn, std::move(r), &replies);
      if (!replies.to.empty()) SendBatch(conn, std::move(replies));
    };
    if (!pool_.Post(std::move(run))) {
      // The pool has shut down: answer what it will not run.
      ReplyBatch replies;
      for (const Id& id : ids) {
        Reply(conn, id.caller, id.request, UnavailableError(self_name_, "it is shutting down"), &replies, nullptr,
              id.timing);
      }
      SendBatch(conn, std::move(replies));
    }
  }
}

void Dispatcher::Run(const std::shared_ptr<Connection>& conn, Request r, ReplyBatch* replies) {
  Future<Value> result;
  uint64_t context = 0;  // the trace context the handler runs in
  auto call = [&] {
    if (tracer_ != nullptr) context = tracer_->CurrentContext();
    result = Invoke(r.handler->fn, r.info, std::move(r.args), pool_);
  };
  const int64_t begin_us = tracer_ != nullptr ? tracer_->Now() : 0;
  // What the thread runs, for the waits; not the queries of the waits themselves.
  std::optional<HandlerSlots::Running> running;
  if (!absl::StartsWith(r.info.function, kObserveQueries)) running.emplace(slots_, r.info.function, r.info.caller_rank);
  ++t_handler_depth;
  if (hooks_) {
    hooks_->RunInScope(r.scope, call);
  } else {
    call();
  }
  --t_handler_depth;
  running.reset();
  const bool ready = result.IsReady();
  const Tracer::Name traced_name = r.handler->traced_name;
  if (tracer_ != nullptr) {
    TraceHandler(traced_name, r.info.caller_rank, r.id, r.timing, begin_us, Tracer::CallFlow(r.info.caller_rank, r.id),
                 ready, context);
  }
  if (ready) {
    // Answered synchronously: no hop.
    Reply(conn, r.info.caller_rank, r.id, result.Get(absl::ZeroDuration()), replies, r.scope, r.timing);
  } else {
    // Sent by the thread that completes the handler's future: no pool hop.
    result.Subscribe([this, conn, to = r.info.caller_rank, id = r.id, scope = r.scope, timing = r.timing, context,
                      traced_name](const absl::StatusOr<Value>& v) {
      const int64_t begin_us = tracer_ != nullptr ? tracer_->Now() : 0;
      Reply(conn, to, id, v, nullptr, scope, timing);
      if (tracer_ != nullptr) TraceHandler(traced_name, to, id, {}, begin_us, 0, /*replied=*/true, context);
    });
  }
}

void Dispatcher::Reply(const std::shared_ptr<Connection>& conn, int to, uint64_t id,
                       const absl::StatusOr<Value>& result, ReplyBatch* batch, const CallHooks::Scope& scope,
                       Timing timing) {
  absl::StatusOr<Message> m = peers_.encode_reply(to, id, result, scope);
  if (timing.series != nullptr) {
    timing.series->Received(timing.received_bytes);
    if (m.ok()) timing.series->Sent(MessageBytes(*m));
    timing.series->Record(std::chrono::duration<double>(std::chrono::steady_clock::now() - timing.start).count(),
                          result.ok());
  }
  if (batch) {
    // Counted as done when the batch is handed to the connection (SendBatch).
    if (m.ok()) batch->messages.push_back(std::move(*m));
    batch->to.push_back(to);
    return;
  }
  if (m.ok()) conn->Send(std::move(*m));
  Answered({to});
}

void Dispatcher::SendBatch(const std::shared_ptr<Connection>& conn, ReplyBatch batch) {
  if (!batch.messages.empty()) conn->SendMany(std::move(batch.messages));
  Answered(batch.to);
}

void Dispatcher::Answered(const std::vector<int>& to) {
  absl::MutexLock lock(&idle_mu_);
  for (int rank : to) {
    --inflight_;
    if (auto it = inflight_by_peer_.find(rank); it != inflight_by_peer_.end() && --it->second == 0) {
      inflight_by_peer_.erase(it);
    }
  }
}

Future<Value> Dispatcher::InvokeLocal(const CallInfo& info, ValueList args, bool here) {
  std::shared_ptr<Handler> handler = Find(info.function);
  if (!handler) {
    return MakeReadyFuture<Value>(pool_, MissingFunctionError(info.function));
  }
  if (here || handler->mode == HandlerMode::kInline) return Invoke(handler->fn, info, std::move(args), pool_);
  Promise<Value> promise(pool_);
  if (!pool_.Post([this, handler, info, promise, args = std::move(args)]() mutable {
        Invoke(handler->fn, info, std::move(args), pool_).Subscribe([promise](const absl::StatusOr<Value>& v) {
          promise.Set(v);
        });
      })) {
    promise.Set(UnavailableError(self_name_, "it is shutting down"));
  }
  return promise.future();
}

std::vector<std::pair<int, int>> Dispatcher::running_by_peer() const {
  absl::MutexLock lock(&idle_mu_);
  std::vector<std::pair<int, int>> out(inflight_by_peer_.begin(), inflight_by_peer_.end());
  std::sort(out.begin(), out.end());
  return out;
}

bool Dispatcher::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&idle_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(idle_mu_) { return inflight_ == 0; };
  return idle_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

}  // namespace gw::rpc::internal
