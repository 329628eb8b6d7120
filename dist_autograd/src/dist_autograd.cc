#include "gradwire/dist_autograd/dist_autograd.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "context_state.h"
#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/function.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/rpc/call_hooks.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/retry.h"
#include "gradwire/rpc/statistics.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/rpc/waits.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"
#include "messages.h"
#include "optimizer_host.h"

namespace gw::dist_autograd {
namespace {

constexpr absl::Duration kReleaseTimeout = absl::Seconds(10);

using internal::AutogradMeta;
using internal::DiscoverMessage;
using internal::GradMessage;
using internal::ReleaseMessage;
using rpc::Ack;
using rpc::Value;
using rpc::ValueList;
using rpc::ValueMap;

// The context current on this thread (Context, Context::Scope, or a handler's scope).
thread_local std::shared_ptr<ContextState> t_current;

// Every tensor of a value, in a fixed order (lists in order, maps by key): the same on
// both sides of the wire.
void ForEachTensor(Value& v, const std::function<void(Tensor&)>& fn) {
  auto& s = v.storage();
  if (auto* t = std::get_if<Tensor>(&s)) {
    fn(*t);
  } else if (auto* l = std::get_if<ValueList>(&s)) {
    for (Value& e : *l) ForEachTensor(e, fn);
  } else if (auto* m = std::get_if<ValueMap>(&s)) {
    for (auto& [_, e] : *m) ForEachTensor(e, fn);
  }
}

// The RecvFunctions reachable from `from` (through the local graph only), grouped by the
// worker that sent their messages.
void CollectRecvs(const std::vector<autograd::Edge>& from, absl::flat_hash_map<int, std::vector<GlobalId>>* out) {
  absl::flat_hash_set<autograd::Node*> seen;
  std::vector<autograd::Node*> stack;
  for (const autograd::Edge& e : from) {
    if (e.valid() && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (auto* recv = dynamic_cast<RecvFunction*>(n)) (*out)[recv->sender()].push_back(recv->key());
    for (const autograd::Edge& e : n->next_edges()) {
      if (e.valid() && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
}

// Completes when every future has; with the first error if any failed (no pool hop).
Future<Ack> AllOf(rpc::Executor& ex, std::vector<Future<Ack>> futures) {
  return Map<Ack>(WhenAll(ex, std::move(futures)), [](const absl::StatusOr<std::vector<Ack>>& r) -> absl::StatusOr<Ack> {
    if (!r.ok()) return r.status();
    return Ack{};
  });
}

int64_t BudgetMs(absl::Time deadline) {
  return absl::ToInt64Milliseconds(std::max(absl::Milliseconds(1), deadline - absl::Now()));
}

}  // namespace

// ------------------------------------------------------------------ nodes and store

std::vector<Tensor> RecvFunction::Apply(std::vector<Tensor>&& grads) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Runs inside GraphTask::Run, which the engine calls with the context's mutex held.
  auto ctx = ctx_.lock();
  if (!ctx) return {};
  const int64_t begin_us = trace_.on() ? trace_.tracer->Now() : 0;
  OutgoingGradients out{sender_, key_, {}};
  for (uint32_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) {
      out.grads.emplace_back(std::move(grads[i]));
    } else if (ctx->mode == Mode::kFast) {
      out.grads.emplace_back(Tensor::Zeros(input_meta(i).sizes, input_meta(i).dtype));  // as PyTorch does
    } else {
      out.grads.emplace_back(std::nullopt);
    }
  }
  const size_t count = out.grads.size();
  ctx->outbox.push_back(std::move(out));  // sent by the pass's Flush
  if (begin_us != 0) trace_.Record(trace_.recv, begin_us, ctx->id, sender_, count);
  return {};
}

Tensor GradientStore::Accumulate(const Tensor& leaf, Tensor grad) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = grads_.try_emplace(leaf.impl_ptr().get(), leaf, Tensor());
  if (inserted) {
    // Owned by the store (adopted or copied), so a hook may change it in place.
    autograd::AccumulateGrad::Accumulate(&it->second.second, std::move(grad));
  } else {
    it->second.second = kernels::Add(it->second.second, grad);  // earlier readers keep theirs
  }
  return it->second.second;
}

std::vector<std::pair<Tensor, Tensor>> GradientStore::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<Tensor, Tensor>> out;
  for (const auto& [_, lg] : grads_) out.push_back(lg);
  return out;
}

Tensor GradientStore::Of(const Tensor& leaf) const {
  absl::MutexLock lock(&mu_);
  auto it = grads_.find(leaf.impl_ptr().get());
  return it == grads_.end() ? Tensor() : it->second.second;
}

// ------------------------------------------------------------------ the engine

class DistAutograd::Impl final : public rpc::CallHooks, public std::enable_shared_from_this<DistAutograd::Impl> {
 public:
  explicit Impl(rpc::Agent& agent) : agent_(agent), self_(agent.self().rank) {
    rpc::Tracer& tracer = agent.tracer();
    if (tracer.enabled()) {
      trace_ = {.tracer = &tracer,
                .category = tracer.Intern("dist_autograd"),
                .send = tracer.Intern("SendFunction"),
                .recv = tracer.Intern("RecvFunction"),
                .peer = tracer.Intern("peer"),
                .tensors = tracer.Intern("tensors")};
    }
  }

  absl::Status RegisterFunctions() {
    auto self = this;  // the agent keeps the hooks (and so this engine) alive
    for (absl::Status s : {
             agent_.Handle<GradMessage>([self](const rpc::CallInfo& i, GradMessage m) { return self->OnGrad(i, std::move(m)); }),
             agent_.Handle<DiscoverMessage>(
                 [self](const rpc::CallInfo&, const DiscoverMessage& m) { return self->OnDiscover(m); }),
             agent_.Handle<ReleaseMessage>(
                 [self](const rpc::CallInfo& i, const ReleaseMessage& m) {
                   return self->Release(m.context, i.caller_rank, m.gone);
                 }),
         }) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // ---------------------------------------------------------------- contexts

  std::shared_ptr<ContextState> NewContext() {
    auto ctx = std::make_shared<ContextState>(agent_.NewId());
    absl::MutexLock lock(&mu_);
    contexts_[ctx->id] = ctx;
    ++contexts_of_peer_[ctx->id.rank()];
    return ctx;
  }

  // The context `id`, joined on a message from `from`; refused when the sender or the
  // context's creator was declared dead (nobody would release it here).
  absl::StatusOr<std::shared_ptr<ContextState>> GetOrCreate(GlobalId id, int from) {
    absl::MutexLock lock(&mu_);
    for (int rank : {from, id.rank()}) {
      if (gone_.contains(rank)) {
        return agent_.PeerGoneError(rank);
      }
    }
    auto it = contexts_.find(id);
    if (it != contexts_.end()) return it->second;
    // Ids carry their creator's rank: one of ours that is not open here has ended (a late
    // message), and no worker outside the group creates contexts.
    if (id.rank() == agent_.self().rank || id.rank() < 0 || id.rank() >= agent_.options().max_world_size) {
      return absl::FailedPreconditionError(absl::StrCat("distributed autograd context ", id.ToString(),
                                                        " is not open on its creator"));
    }
    // A context is held here until its creator releases it: a peer may have so many open
    // here at once (PeerLimits::max_contexts).
    const int64_t limit = agent_.options().security.limits.max_contexts;
    int64_t& held = contexts_of_peer_[id.rank()];
    if (limit > 0 && held >= limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          agent_.self().name, " holds ", held, " distributed autograd contexts of ", agent_.NameOf(id.rank()),
          ", its limit (PeerLimits::max_contexts, GRADWIRE_MAX_CONTEXTS_PER_PEER): release contexts (end their "
          "ContextGuard) before starting more"));
    }
    ++held;
    return contexts_.emplace(id, std::make_shared<ContextState>(id)).first->second;
  }

  bool AwaitContexts(const std::function<bool(size_t)>& until, absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return until(contexts_.size()); };
    return mu_.AwaitWithDeadline(absl::Condition(&holds), deadline);
  }

  size_t live() const {
    absl::MutexLock lock(&mu_);
    return contexts_.size();
  }

  std::shared_ptr<ContextState> Find(GlobalId id) const {
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(id);
    return it == contexts_.end() ? nullptr : it->second;
  }

  // Forgets the context here and tells every peer it touched (but `except`); the future
  // completes when they all answered (or failed). `gone`: the context ends because a
  // worker it reached is gone (why, for the errors of whoever still uses it).
  Future<Ack> Release(GlobalId id, int except, const std::string& gone = "") {
    std::shared_ptr<ContextState> ctx;
    {
      absl::MutexLock lock(&mu_);
      auto it = contexts_.find(id);
      if (it == contexts_.end()) return MakeReadyFuture<Ack>(agent_.executor(), Ack{});
      ctx = it->second;
      contexts_.erase(it);
      if (auto n = contexts_of_peer_.find(id.rank()); n != contexts_of_peer_.end() && --n->second == 0) {
        contexts_of_peer_.erase(n);
      }
      if (!gone.empty()) {
        ended_[id] = gone;
        ended_order_.push_back(id);
        if (ended_order_.size() > kEndedKept) {
          ended_.erase(ended_order_.front());
          ended_order_.pop_front();
        }
      }
    }
    std::set<int> peers;
    {
      absl::MutexLock lock(&ctx->mu);
      peers = ctx->peers;
      if (!gone.empty() && ctx->ended.ok()) ctx->ended = absl::UnavailableError(gone);
    }
    std::vector<Future<Ack>> acks;
    for (int p : peers) {
      if (p == except || p == self_) continue;
      // A release lost with a closed connection is sent again on the next one, unless
      // the peer was declared dead (then it reclaimed the context itself).
      rpc::RetryPolicy policy;
      policy.deadline = kReleaseTimeout;
      policy.retryable = [this, p](const absl::Status& s) {
        if (!rpc::IsRetryable(s)) return false;
        absl::MutexLock lock(&mu_);
        return !gone_.contains(p);
      };
      acks.push_back(rpc::Retry<Ack>(agent_.executor(), agent_.timers(), std::move(policy), [this, p, id, gone](int) {
        return agent_.Send(Name(p), ReleaseMessage{id, gone}, rpc::CallOptions{kReleaseTimeout});
      }));
    }
    return AllOf(agent_.executor(), std::move(acks));
  }

  // ---------------------------------------------------------------- recording (CallHooks)

  absl::Status OnSendRequest(int to, Value& payload, Value& meta) override { return Annotate(t_current, to, payload, meta); }

  absl::StatusOr<Scope> OnReceiveRequest(int from, Value& payload, const Value& meta) override {
    absl::StatusOr<std::shared_ptr<ContextState>> ctx = Attach(from, payload, meta);
    if (!ctx.ok()) return ctx.status();
    return Scope(*ctx);
  }

  void RunInScope(const Scope& scope, const std::function<void()>& fn) override {
    std::shared_ptr<ContextState> previous = std::move(t_current);
    t_current = std::static_pointer_cast<ContextState>(scope);
    fn();
    t_current = std::move(previous);
  }

  Scope CurrentScope() override { return t_current; }

  absl::Status OnSendReply(int to, const Scope& scope, Value& payload, Value& meta) override {
    return Annotate(std::static_pointer_cast<ContextState>(scope), to, payload, meta);
  }

  absl::Status OnReceiveReply(int from, Value& payload, const Value& meta) override {
    return Attach(from, payload, meta).status();
  }

  void OnPeerGone(int rank) override {
    // Contexts whose creator died, and those joined here that exchanged messages with the
    // dead worker (their release may have had to come through it), are reclaimed and
    // released to the other workers they reached. The worker stays dead for contexts:
    // GetOrCreate refuses it.
    std::vector<std::shared_ptr<ContextState>> joined;
    {
      absl::MutexLock lock(&mu_);
      gone_.insert(rank);
      for (const auto& [_, ctx] : contexts_) {
        if (ctx->creator != self_) joined.push_back(ctx);
      }
    }
    std::vector<GlobalId> reclaimed;
    for (const auto& ctx : joined) {
      absl::MutexLock lock(&ctx->mu);
      if (ctx->creator == rank || ctx->peers.contains(rank)) reclaimed.push_back(ctx->id);
    }
    // Released onwards too: workers that joined through this one hear of it.
    const std::string why(agent_.PeerGoneError(rank).message());
    for (GlobalId id : reclaimed) {
      (void)Release(id, /*except=*/rank, absl::StrCat("distributed autograd context ", id.ToString(), " ended: ", why));
    }
  }

  // ---------------------------------------------------------------- backward

  // The agent's statistics (a metrics endpoint exports them): contexts and passes.
  void AddStatistics() {
    statistics_ = agent_.statistics().Add("dist_autograd", [this](std::vector<rpc::Sample>& out) {
      auto add = [&](const char* name, double value) {
        out.push_back({absl::StrCat("gradwire_dist_autograd_", name), {}, value});
      };
      add("contexts", static_cast<double>(live()));
      add("backward_passes_total", static_cast<double>(passes_.load(std::memory_order_relaxed)));
      add("backward_passes_failed_total", static_cast<double>(passes_failed_.load(std::memory_order_relaxed)));
      add("backward_passes_running", static_cast<double>(passes_running_.load(std::memory_order_relaxed)));
      add("gradients_received_total", static_cast<double>(gradients_received_.load(std::memory_order_relaxed)));
    });
    waits_ = agent_.waits().Add("dist_autograd", [this](std::vector<rpc::Wait>& out) { AppendWaits(out); });
  }

  void AppendPassLocked(ContextState& ctx, double seconds, std::vector<rpc::Wait>& waits) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    if (ctx.waiters.empty()) return;
    rpc::Wait w{.layer = "dist_autograd",
                .state = "waits",
                .what = absl::StrCat("backward pass ", ctx.pass, " of context ", ctx.id.ToString()),
                .seconds = seconds};
    int messages = 0;
    for (const auto& [rank, n] : ctx.unanswered) {
      w.on.push_back(rank);
      messages += n;
    }
    const int64_t holding = ctx.task ? static_cast<int64_t>(ctx.task->waiting()) : 0;
    w.note = messages > 0  ? absl::StrCat(messages, " gradient message(s) unanswered")
             : holding > 0 ? absl::StrCat(holding, " node(s) here wait for gradients that have not arrived")
                           : "finishing";
    waits.push_back(std::move(w));
  }

  // Each context whose pass is not done here (a run awaits its answers): the workers its
  // gradient messages wait on, or the local nodes that wait for input. The 16 oldest.
  void AppendWaits(std::vector<rpc::Wait>& out) const {
    constexpr size_t kMostListed = 16;
    std::vector<std::shared_ptr<ContextState>> all;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, ctx] : contexts_) all.push_back(ctx);
    }
    const absl::Time now = absl::Now();
    std::vector<rpc::Wait> waits;
    for (const auto& ctx : all) {
      const int64_t started = ctx->pass_started_ns.load(std::memory_order_relaxed);
      if (started == 0) continue;  // no pass yet
      const double seconds = absl::ToDoubleSeconds(now - absl::FromUnixNanos(started));
      // A pass holds the lock while it runs nodes here (a user's backward function may
      // take long): this source must not wait for it, and says so instead.
      if (ctx->mu.TryLock()) {
        AppendPassLocked(*ctx, seconds, waits);
        ctx->mu.Unlock();
      } else {
        waits.push_back({.layer = "dist_autograd",
                         .state = "runs",
                         .what = absl::StrCat("backward functions of context ", ctx->id.ToString()),
                         .seconds = seconds,
                         .note = "a backward pass runs them here"});
      }
    }
    std::sort(waits.begin(), waits.end(), [](const rpc::Wait& a, const rpc::Wait& b) { return a.seconds > b.seconds; });
    if (waits.size() > kMostListed) waits.resize(kMostListed);
    for (rpc::Wait& w : waits) out.push_back(std::move(w));
  }

  absl::Status Backward(const std::shared_ptr<ContextState>& ctx, const std::vector<Tensor>& roots,
                        const BackwardOptions& options) {
    rpc::Tracer& tracer = agent_.tracer();
    rpc::Tracer::Scope span(tracer, tracer.Intern("dist_autograd"), tracer.Intern("backward pass"));
    span.span().context = ctx->id.bits();
    passes_running_.fetch_add(1, std::memory_order_relaxed);
    absl::Status s = RunBackward(ctx, roots, options);
    passes_running_.fetch_sub(1, std::memory_order_relaxed);
    (s.ok() ? passes_ : passes_failed_).fetch_add(1, std::memory_order_relaxed);
    return s;
  }

  absl::Status RunBackward(const std::shared_ptr<ContextState>& ctx, const std::vector<Tensor>& roots,
                           const BackwardOptions& options) {
    if (ctx->creator != self_) {
      return absl::FailedPreconditionError("Backward runs on the worker that created the context");
    }
    {
      absl::MutexLock lock(&ctx->mu);
      if (!ctx->ended.ok()) return ctx->ended;
    }
    std::vector<autograd::Edge> edges;
    std::vector<Tensor> seeds;
    for (size_t i = 0; i < roots.size(); ++i) {
      autograd::Edge e = roots[i].defined() ? autograd::GradientEdge(roots[i]) : autograd::Edge{};
      if (!e.valid()) {
        return absl::InvalidArgumentError(absl::StrCat("Backward: root ", i, " does not require grad"));
      }
      if (roots[i].numel() != 1) {
        return absl::InvalidArgumentError(absl::StrCat("Backward: root ", i, " has shape ",
                                                       ShapeToString(roots[i].sizes()), "; roots must be scalars"));
      }
      edges.push_back(e);
      seeds.push_back(Tensor::Ones(roots[i].sizes(), roots[i].dtype()));
    }
    const absl::Time deadline = absl::Now() + options.timeout;
    uint64_t pass;
    {
      absl::MutexLock lock(&ctx->mu);
      pass = ctx->pass + 1;
      StartPass(*ctx, pass, options.mode, options.retain_graph);
      ctx->local_roots = edges;
    }
    if (options.mode == Mode::kSmart) {
      // 1. Which sends, on which workers, will receive gradients.
      absl::flat_hash_map<int, std::vector<GlobalId>> recvs;
      CollectRecvs(edges, &recvs);
      absl::StatusOr<Ack> d =
          Discover(*ctx, pass, options.retain_graph, deadline, std::move(recvs)).Get(deadline - absl::Now() + absl::Seconds(1));
      if (!d.ok()) return Explain(*ctx, options.mode, d.status(), "discovery");
    }
    // 2. The gradient pass.
    auto waiter = std::make_shared<ContextState::Waiter>(agent_.executor());
    {
      absl::MutexLock lock(&ctx->mu);
      PrepareDependencies(*ctx);
      for (size_t i = 0; i < edges.size(); ++i) ctx->task->AddInput(edges[i], seeds[i]);
      RunLocked(*ctx);
      ctx->waiters.push_back(waiter);
    }
    Await(ctx, waiter, Flush(ctx, deadline));
    absl::StatusOr<Ack> r = waiter->done.future().Get(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!r.ok()) return Explain(*ctx, options.mode, r.status(), "gradient pass");
    return absl::OkStatus();
  }

  std::string Name(int rank) const { return agent_.NameOf(rank); }

 private:
  // An outgoing message of a context: one SendFunction for its tensors that require grad.
  // With gradient recording off nothing is annotated (as PyTorch sends such messages
  // without autograd metadata): this is how messages sent by code that runs inside a
  // backward pass (gradient hooks, backward functions), under this context's lock, stay
  // out of it.
  absl::Status Annotate(const std::shared_ptr<ContextState>& ctx, int to, Value& payload, Value& meta) {
    if (!ctx || !autograd::GradMode::IsEnabled()) return absl::OkStatus();
    AutogradMeta m{ctx->id, {}, {}};
    std::vector<Tensor> with_grad;
    int64_t position = 0;
    ForEachTensor(payload, [&](Tensor& t) {
      if (t.requires_grad()) {
        m.with_grad.push_back(position);
        with_grad.push_back(t);
      }
      ++position;
    });
    std::shared_ptr<SendFunction> send;
    if (!with_grad.empty()) {
      m.send = agent_.NewId();
      send = std::make_shared<SendFunction>(with_grad, ctx->id, to, trace_);
    }
    {
      absl::MutexLock lock(&ctx->mu);
      if (send) ctx->sends[m.send] = std::move(send);
      ctx->peers.insert(to);
    }
    meta = rpc::ValueTraits<AutogradMeta>::To(std::move(m));
    return absl::OkStatus();
  }

  // An incoming message of a context: the context joins here, and the message's tensors
  // that had a SendFunction become the outputs of one RecvFunction.
  absl::StatusOr<std::shared_ptr<ContextState>> Attach(int from, Value& payload, const Value& meta) {
    if (meta.is<std::monostate>()) return std::shared_ptr<ContextState>();
    absl::StatusOr<AutogradMeta> m = rpc::ValueTraits<AutogradMeta>::From(meta);
    if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat("malformed distributed-autograd annotation: ", m.status().message()));
    if (!m->context.valid() || m->send.valid() == m->with_grad.empty()) {
      return absl::InvalidArgumentError("malformed distributed-autograd annotation (null context, or a send without tensors)");
    }
    std::vector<Tensor*> tensors;
    ForEachTensor(payload, [&](Tensor& t) { tensors.push_back(&t); });
    for (size_t i = 0; i < m->with_grad.size(); ++i) {
      const int64_t p = m->with_grad[i];
      if (p < 0 || p >= static_cast<int64_t>(tensors.size()) || (i > 0 && p <= m->with_grad[i - 1])) {
        return absl::InvalidArgumentError("distributed-autograd annotation does not match the message's tensors");
      }
      if (!IsFloating(tensors[static_cast<size_t>(p)]->dtype())) {
        return absl::InvalidArgumentError("distributed-autograd annotation marks a non-floating tensor");
      }
    }
    absl::StatusOr<std::shared_ptr<ContextState>> joined = GetOrCreate(m->context, from);
    if (!joined.ok()) return joined.status();
    std::shared_ptr<ContextState> ctx = *std::move(joined);
    {
      absl::MutexLock lock(&ctx->mu);
      ctx->peers.insert(from);
    }
    if (m->send.valid()) {
      auto recv = std::make_shared<RecvFunction>(ctx, from, m->send, trace_);
      for (int64_t p : m->with_grad) autograd::SetHistory(*tensors[static_cast<size_t>(p)], recv);
    }
    return ctx;
  }

  void StartPass(ContextState& ctx, uint64_t pass, Mode mode, bool retain) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    ctx.pass = pass;
    ctx.pass_started_ns.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
    ctx.mode = mode;
    ctx.retain_graph = retain;
    ctx.task = std::make_unique<autograd::GraphTask>(autograd::BackwardOptions{retain, &ctx.gradients});
    ctx.dependencies_ready = false;
    ctx.reachable_sends.clear();
    ctx.error = absl::OkStatus();
    ctx.outbox.clear();
  }

  // Messages of pass `pass` arrive here: a newer pass replaces the state of an older one.
  absl::Status EnsurePass(ContextState& ctx, uint64_t pass, Mode mode, bool retain) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    if (pass < ctx.pass) return absl::FailedPreconditionError("a message of an earlier backward pass");
    if (pass > ctx.pass) {
      StartPass(ctx, pass, mode, retain);
      ctx.local_roots.clear();
    }
    return absl::OkStatus();
  }

  // Counts from the roots plus the sends that will receive gradients: every one of them
  // (FAST), or those the discovery reached (SMART). A send counts once per input: its
  // GradMessage delivers every input.
  void PrepareDependencies(ContextState& ctx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    if (ctx.dependencies_ready) return;
    std::vector<autograd::Edge> roots = ctx.local_roots;
    for (const auto& [key, send] : ctx.sends) {
      if (ctx.mode == Mode::kFast || ctx.reachable_sends.contains(key)) {
        for (uint32_t i = 0; i < send->num_inputs(); ++i) roots.push_back({send, i});
      }
    }
    ctx.task->ComputeDependencies(roots);
    ctx.dependencies_ready = true;
  }

  void RunLocked(ContextState& ctx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    try {
      ctx.task->Run();
    } catch (...) {
      RecordError(ctx, rpc::StatusFromException(Name(self_)));
    }
  }

  // The pass failed here: the first error sticks and fails every waiter.
  static void RecordError(ContextState& ctx, const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    if (ctx.error.ok()) ctx.error = s;
  }

  // Sends the gradients that RecvFunctions queued; returns the futures of their answers.
  std::vector<Future<Ack>> Flush(const std::shared_ptr<ContextState>& ctx, absl::Time deadline) {
    std::vector<OutgoingGradients> out;
    GradMessage m;
    {
      absl::MutexLock lock(&ctx->mu);
      out.swap(ctx->outbox);
      m.context = ctx->id;
      m.pass = static_cast<int64_t>(ctx->pass);
      m.mode = ctx->mode;
      m.retain_graph = ctx->retain_graph;
    }
    std::vector<Future<Ack>> answers;
    for (OutgoingGradients& g : out) {
      m.send = g.key;
      m.grads = std::move(g.grads);
      m.budget_ms = BudgetMs(deadline);
      {
        absl::MutexLock lock(&ctx->mu);
        ++ctx->unanswered[g.to];
      }
      Promise<Ack> answered(agent_.executor());
      answers.push_back(answered.future());
      agent_.Send(Name(g.to), m, rpc::CallOptions{absl::Milliseconds(m.budget_ms)},
                  [ctx, to = g.to, answered](absl::StatusOr<Ack> r) mutable {
                    {
                      absl::MutexLock lock(&ctx->mu);
                      if (auto it = ctx->unanswered.find(to); it != ctx->unanswered.end() && --it->second == 0) {
                        ctx->unanswered.erase(it);
                      }
                    }
                    answered.Set(std::move(r));
                  });
    }
    return answers;
  }

  // The waiter is answered once `sent` are all answered and the worker is quiet.
  void Await(const std::shared_ptr<ContextState>& ctx, const std::shared_ptr<ContextState::Waiter>& waiter,
             std::vector<Future<Ack>> sent) {
    auto self = shared_from_this();
    AllOf(agent_.executor(), std::move(sent)).Subscribe([self, ctx, waiter](const absl::StatusOr<Ack>& r) {
      {
        absl::MutexLock lock(&ctx->mu);
        waiter->sent_answered = true;
        if (!r.ok() && ctx->error.ok()) ctx->error = r.status();
      }
      self->CompleteIfQuiescent(*ctx);
    });
  }

  // A waiter is answered when the gradients its run sent were answered and no node here
  // holds input while waiting for more (FAST mode's hang); every waiter fails at once when
  // the pass failed.
  void CompleteIfQuiescent(ContextState& ctx) {
    std::vector<std::shared_ptr<ContextState::Waiter>> ready;
    absl::Status result;
    {
      absl::MutexLock lock(&ctx.mu);
      result = ctx.error;
      const bool quiet = ctx.task && ctx.task->waiting() == 0;
      auto split = std::partition(ctx.waiters.begin(), ctx.waiters.end(), [&](const auto& w) {
        return !(w->sent_answered && (quiet || !result.ok())) && result.ok();
      });
      ready.assign(split, ctx.waiters.end());
      ctx.waiters.erase(split, ctx.waiters.end());
    }
    for (auto& w : ready) w->done.Set(result.ok() ? absl::StatusOr<Ack>(Ack{}) : absl::StatusOr<Ack>(result));
  }

  // SMART discovery: mark the sends named by `recvs` on their workers, recursively.
  Future<Ack> Discover(ContextState& ctx, uint64_t pass, bool retain, absl::Time deadline,
                       absl::flat_hash_map<int, std::vector<GlobalId>> recvs) {
    std::vector<Future<Ack>> calls;
    for (auto& [worker, sends] : recvs) {
      DiscoverMessage m{ctx.id, static_cast<int64_t>(pass), retain, std::move(sends), BudgetMs(deadline)};
      calls.push_back(agent_.Send(Name(worker), std::move(m), rpc::CallOptions{absl::Milliseconds(BudgetMs(deadline))}));
    }
    return AllOf(agent_.executor(), std::move(calls));
  }

  Future<Ack> Failed(absl::Status s) { return MakeReadyFuture<Ack>(agent_.executor(), std::move(s)); }

  // Backward messages reach only workers that joined the context by a call of it.
  absl::Status UnknownContext(GlobalId id) const {
    {
      absl::MutexLock lock(&mu_);
      if (auto it = ended_.find(id); it != ended_.end()) return absl::UnavailableError(absl::StrCat(Name(self_), ": ", it->second));
    }
    return absl::NotFoundError(absl::StrCat(Name(self_), " does not know context ", id.ToString(),
                                            " (it was released, or reclaimed when a worker it used was declared dead)"));
  }

  // ---------------------------------------------------------------- handlers

  Future<Ack> OnDiscover(const DiscoverMessage& m) {
    if (!m.context.valid() || m.pass < 1) return Failed(absl::InvalidArgumentError("DiscoverMessage: null context or pass"));
    auto ctx = Find(m.context);
    if (!ctx) return Failed(UnknownContext(m.context));
    const absl::Time deadline = absl::Now() + absl::Milliseconds(m.budget_ms);
    absl::flat_hash_map<int, std::vector<GlobalId>> recvs;
    {
      absl::MutexLock lock(&ctx->mu);
      if (absl::Status s = EnsurePass(*ctx, static_cast<uint64_t>(m.pass), Mode::kSmart, m.retain_graph); !s.ok()) {
        return Failed(s);
      }
      std::vector<autograd::Edge> from;
      for (GlobalId key : m.sends) {
        auto it = ctx->sends.find(key);
        if (it == ctx->sends.end()) {
          return Failed(absl::NotFoundError(
              absl::StrCat(Name(self_), ": no send ", key.ToString(), " in context ", ctx->id.ToString())));
        }
        if (!ctx->reachable_sends.insert(key).second) continue;  // each once per pass
        for (const autograd::Edge& e : it->second->next_edges()) from.push_back(e);
      }
      CollectRecvs(from, &recvs);
    }
    return Discover(*ctx, static_cast<uint64_t>(m.pass), m.retain_graph, deadline, std::move(recvs));
  }

  Future<Ack> OnGrad(const rpc::CallInfo& info, GradMessage m) {
    gradients_received_.fetch_add(1, std::memory_order_relaxed);
    if (!m.context.valid() || m.pass < 1 || (m.mode != Mode::kSmart && m.mode != Mode::kFast)) {
      return Failed(absl::InvalidArgumentError("GradMessage: null context, bad pass or unknown mode"));
    }
    auto ctx = Find(m.context);
    if (!ctx) return Failed(UnknownContext(m.context));
    const absl::Time deadline = absl::Now() + absl::Milliseconds(m.budget_ms);
    auto waiter = std::make_shared<ContextState::Waiter>(agent_.executor());
    {
      absl::MutexLock lock(&ctx->mu);
      if (absl::Status s = EnsurePass(*ctx, static_cast<uint64_t>(m.pass), m.mode, m.retain_graph); !s.ok()) {
        return Failed(s);
      }
      auto it = ctx->sends.find(m.send);
      if (it == ctx->sends.end()) {
        return Failed(absl::NotFoundError(absl::StrCat(Name(self_), ": no send ", m.send.ToString(), " in context ",
                                                       ctx->id.ToString(), " (gradients from ", info.caller, ")")));
      }
      const std::shared_ptr<SendFunction>& send = it->second;
      if (m.grads.size() != send->num_inputs()) {
        return Failed(absl::InvalidArgumentError(absl::StrCat("GradMessage from ", info.caller, ": ", m.grads.size(),
                                                              " gradients for a send of ", send->num_inputs(), " tensors")));
      }
      PrepareDependencies(*ctx);
      try {
        for (uint32_t i = 0; i < send->num_inputs(); ++i) {
          ctx->task->AddInput({send, i}, m.grads[i] ? std::move(*m.grads[i]) : Tensor());
        }
      } catch (...) {  // a gradient of the wrong shape
        RecordError(*ctx, rpc::StatusFromException(Name(self_)));
      }
      rpc::Tracer& tracer = agent_.tracer();
      rpc::Tracer::Scope span(tracer, tracer.Intern("dist_autograd"), tracer.Intern("backward"));
      span.span().note = tracer.Intern(absl::StrCat("gradients from ", info.caller));
      span.span().context = ctx->id.bits();
      RunLocked(*ctx);
      ctx->waiters.push_back(waiter);
    }
    Await(ctx, waiter, Flush(ctx, deadline));
    return waiter->done.future();
  }

  rpc::Agent& agent_;
  const int self_;
  FunctionTrace trace_;  // set at construction
  mutable absl::Mutex mu_;
  absl::flat_hash_map<GlobalId, std::shared_ptr<ContextState>> contexts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, int64_t> contexts_of_peer_ ABSL_GUARDED_BY(mu_);  // contexts_ by creator rank
  absl::flat_hash_set<int> gone_ ABSL_GUARDED_BY(mu_);  // declared dead (OnPeerGone): for good
  // Contexts ended because a worker they reached is gone, and why (the latest ones).
  static constexpr size_t kEndedKept = 4096;
  absl::flat_hash_map<GlobalId, std::string> ended_ ABSL_GUARDED_BY(mu_);
  std::deque<GlobalId> ended_order_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> passes_{0};
  std::atomic<uint64_t> passes_failed_{0};
  std::atomic<int64_t> passes_running_{0};
  std::atomic<uint64_t> gradients_received_{0};
  rpc::Statistics::Source statistics_;  // reads the members above: the last, dropped first
  rpc::Waits::Source waits_;            // as statistics_

  friend class Context;
  absl::Status Explain(ContextState& ctx, Mode mode, const absl::Status& s, const char* phase) {
    size_t waiting = 0;
    {
      absl::MutexLock lock(&ctx.mu);
      if (ctx.task) waiting = ctx.task->waiting();
    }
    if (s.code() != absl::StatusCode::kDeadlineExceeded) return s;
    std::string why = absl::StrCat("distributed backward (", mode == Mode::kFast ? "FAST" : "SMART", " mode, ", phase,
                                   ") did not finish in time: ", s.message());
    if (mode == Mode::kFast) {
      absl::StrAppend(&why, "; ", waiting, " node(s) on ", Name(self_),
                      " still wait. In FAST mode every recorded send must receive gradients: a message none of whose "
                      "tensors reaches the loss never gets any. SMART mode (the default) handles this.");
    }
    return absl::DeadlineExceededError(why);
  }
};

// ------------------------------------------------------------------ public API

absl::StatusOr<std::shared_ptr<DistAutograd>> DistAutograd::Install(rpc::Agent& agent) {
  auto impl = std::make_shared<Impl>(agent);
  if (absl::Status s = impl->RegisterFunctions(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("DistAutograd::Install on ", agent.self().name, ": ", s.message()));
  }
  std::weak_ptr<Impl> weak = impl;
  if (absl::Status s = InstallOptimizerHost(agent,
                                            [weak](GlobalId context_id, const Tensor& param) {
                                              auto engine = weak.lock();
                                              if (!engine) return Tensor();
                                              auto ctx = engine->Find(context_id);
                                              return ctx ? ctx->gradients.Of(param) : Tensor();
                                            });
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("DistAutograd::Install on ", agent.self().name, ": ", s.message()));
  }
  agent.SetCallHooks(impl);
  // Spans recorded where a context is current belong to it (rpc/trace.h).
  agent.tracer().SetContextSource([]() -> uint64_t { return t_current ? t_current->id.bits() : 0; });
  impl->AddStatistics();
  return std::shared_ptr<DistAutograd>(new DistAutograd(impl));
}

DistAutograd::DistAutograd(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
DistAutograd::~DistAutograd() = default;
size_t DistAutograd::live_contexts() const { return impl_->live(); }
bool DistAutograd::AwaitContexts(const std::function<bool(size_t live)>& until, absl::Time deadline) const {
  return impl_->AwaitContexts(until, deadline);
}

std::vector<std::pair<Tensor, Tensor>> DistAutograd::GradientsOf(GlobalId context_id) const {
  std::shared_ptr<ContextState> ctx = impl_->Find(context_id);
  return ctx ? ctx->gradients.All() : std::vector<std::pair<Tensor, Tensor>>{};
}

Tensor DistAutograd::GradOf(GlobalId context_id, const Tensor& leaf) const {
  std::shared_ptr<ContextState> ctx = impl_->Find(context_id);
  return ctx ? ctx->gradients.Of(leaf) : Tensor();
}

Context::Context(DistAutograd& engine)
    : engine_(engine), state_(engine.impl_->NewContext()), previous_(std::move(t_current)) {
  t_current = state_;
}

Context::~Context() {
  t_current = std::move(previous_);
  (void)engine_.impl_->Release(state_->id, -1).Get(kReleaseTimeout + absl::Seconds(1));
}

GlobalId Context::id() const { return state_->id; }

absl::Status Context::Backward(const std::vector<Tensor>& roots, BackwardOptions options) {
  return engine_.impl_->Backward(state_, roots, options);
}

std::vector<std::pair<Tensor, Tensor>> Context::GetGradients() const { return state_->gradients.All(); }
Tensor Context::GradOf(const Tensor& leaf) const { return state_->gradients.Of(leaf); }

Context::Scope::Scope(const Context& ctx) : previous_(std::move(t_current)) { t_current = ctx.state_; }
Context::Scope::~Scope() { t_current = std::move(previous_); }

}  // namespace gw::dist_autograd
