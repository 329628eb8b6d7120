#include "gradwire/dist_autograd/dist_autograd.h"

#include <atomic>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "context_state.h"
#include "optimizer_host.h"
#include "gradwire/autograd/function.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/rpc/call_hooks.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"

namespace gw::dist_autograd {
namespace {

constexpr char kGradFn[] = "__dist.grad";
constexpr char kDiscoverFn[] = "__dist.discover";
constexpr char kReleaseFn[] = "__dist.release";
constexpr absl::Duration kReleaseTimeout = absl::Seconds(10);

using rpc::Value;
using rpc::ValueList;
using rpc::ValueMap;

// The context current on this thread (Context, Context::Scope, or a handler's scope).
thread_local std::shared_ptr<ContextState> t_current;

int64_t I(uint64_t x) { return static_cast<int64_t>(x); }
uint64_t U(const Value& v) { return static_cast<uint64_t>(v.get<int64_t>()); }

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
// worker that sent their tensors.
void CollectRecvs(const std::vector<autograd::Edge>& from, absl::flat_hash_map<int, std::vector<uint64_t>>* out) {
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

// Completes when every future has; with the first error if any failed.
Future<Value> AllOf(rpc::Executor& ex, std::vector<Future<Value>> futures) {
  Promise<Value> done(ex);  // completed on the completing thread: no pool hop
  WhenAll(ex, std::move(futures)).Subscribe([done](const absl::StatusOr<std::vector<Value>>& r) {
    done.Set(r.ok() ? absl::StatusOr<Value>(Value()) : absl::StatusOr<Value>(r.status()));
  });
  return done.future();
}

}  // namespace

// ------------------------------------------------------------------ nodes and store

std::vector<Tensor> RecvFunction::Apply(std::vector<Tensor>&& grads) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Runs inside GraphTask::Run, which the engine calls with the context's mutex held.
  if (auto ctx = ctx_.lock()) ctx->outbox.push_back({sender_, key_, std::move(grads[0])});
  return {};
}

void GradientStore::Accumulate(const Tensor& leaf, Tensor grad) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = grads_.try_emplace(leaf.impl_ptr().get(), leaf, grad);
  if (!inserted) it->second.second = kernels::Add(it->second.second, grad);
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
  explicit Impl(rpc::Agent& agent) : agent_(agent), self_(agent.self().rank) {}

  absl::Status RegisterFunctions() {
    auto self = this;  // the agent keeps the hooks (and so this engine) alive
    for (absl::Status s : {
             agent_.RegisterRaw(kGradFn, [self](const rpc::CallInfo& i, ValueList a) { return self->OnGrad(i, std::move(a)); }),
             agent_.RegisterRaw(kDiscoverFn,
                                [self](const rpc::CallInfo&, ValueList a) { return self->OnDiscover(std::move(a)); }),
             agent_.RegisterRaw(kReleaseFn,
                                [self](const rpc::CallInfo& i, ValueList a) { return self->OnRelease(i, std::move(a)); }),
         }) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // ---------------------------------------------------------------- contexts

  std::shared_ptr<ContextState> NewContext() {
    const uint64_t id = (static_cast<uint64_t>(self_) << 48) | next_context_.fetch_add(1);
    auto ctx = std::make_shared<ContextState>(id, self_);
    absl::MutexLock lock(&mu_);
    contexts_[id] = ctx;
    return ctx;
  }

  std::shared_ptr<ContextState> GetOrCreate(uint64_t id, int creator) {
    absl::MutexLock lock(&mu_);
    auto& slot = contexts_[id];
    if (!slot) slot = std::make_shared<ContextState>(id, creator);
    return slot;
  }

  size_t live() const {
    absl::MutexLock lock(&mu_);
    return contexts_.size();
  }

  std::shared_ptr<ContextState> Find(uint64_t id) const {
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(id);
    return it == contexts_.end() ? nullptr : it->second;
  }

  // Forgets the context here and tells every peer it touched (but `except`); the future
  // completes when they all answered (or failed).
  Future<Value> Release(uint64_t id, int except) {
    std::shared_ptr<ContextState> ctx;
    {
      absl::MutexLock lock(&mu_);
      auto it = contexts_.find(id);
      if (it == contexts_.end()) return MakeReadyFuture<Value>(agent_.executor(), Value());
      ctx = it->second;
      contexts_.erase(it);
    }
    std::set<int> peers;
    {
      absl::MutexLock lock(&ctx->mu);
      peers = ctx->peers;
    }
    std::vector<Future<Value>> acks;
    for (int p : peers) {
      if (p == except || p == self_) continue;
      acks.push_back(agent_.Async<Value>(Name(p), kReleaseFn, I(id), rpc::CallOptions{kReleaseTimeout}));
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
    // Contexts whose creator died are reclaimed.
    absl::MutexLock lock(&mu_);
    absl::erase_if(contexts_, [rank](const auto& c) { return c.second->creator == rank; });
  }

  // ---------------------------------------------------------------- backward

  absl::Status Backward(const std::shared_ptr<ContextState>& ctx, const std::vector<Tensor>& roots,
                        const BackwardOptions& options) {
    if (ctx->creator != self_) {
      return absl::FailedPreconditionError("Backward runs on the worker that created the context");
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
      // 1. Which sends, on which workers, will receive a gradient.
      absl::flat_hash_map<int, std::vector<uint64_t>> recvs;
      CollectRecvs(edges, &recvs);
      Future<Value> discovered = Discover(*ctx, pass, options.retain_graph, deadline, std::move(recvs));
      absl::StatusOr<Value> d = discovered.Get(deadline - absl::Now() + absl::Seconds(1));
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
    absl::StatusOr<Value> r = waiter->done.future().Get(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!r.ok()) return Explain(*ctx, options.mode, r.status(), "gradient pass");
    return absl::OkStatus();
  }

  std::string Name(int rank) const {
    const auto& w = agent_.workers();
    return rank >= 0 && rank < static_cast<int>(w.size()) ? w[static_cast<size_t>(rank)].name
                                                          : absl::StrCat("rank ", rank);
  }

 private:
  // Outgoing messages of a context: a SendFunction for every tensor that requires grad.
  absl::Status Annotate(const std::shared_ptr<ContextState>& ctx, int to, Value& payload, Value& meta) {
    if (!ctx) return absl::OkStatus();
    ValueList keys;
    const bool recording = autograd::GradMode::IsEnabled();
    std::vector<std::pair<uint64_t, std::shared_ptr<SendFunction>>> sends;
    ForEachTensor(payload, [&](Tensor& t) {
      if (recording && t.requires_grad()) {
        const uint64_t key = (static_cast<uint64_t>(self_ + 1) << 48) | next_key_.fetch_add(1);
        sends.emplace_back(key, std::make_shared<SendFunction>(t));
        keys.push_back(Value(I(key)));
      } else {
        keys.push_back(Value(int64_t{0}));
      }
    });
    {
      absl::MutexLock lock(&ctx->mu);
      for (auto& [key, send] : sends) ctx->sends[key] = std::move(send);
      ctx->peers.insert(to);
    }
    ValueMap m;
    m["ctx"] = Value(I(ctx->id));
    m["creator"] = Value(int64_t{ctx->creator});
    m["keys"] = Value(std::move(keys));
    meta = Value(std::move(m));
    return absl::OkStatus();
  }

  // Incoming messages of a context: the context joins here, received tensors that had a
  // SendFunction get a RecvFunction.
  absl::StatusOr<std::shared_ptr<ContextState>> Attach(int from, Value& payload, const Value& meta) {
    if (!meta.is<ValueMap>()) return std::shared_ptr<ContextState>();
    const ValueMap& m = meta.get<ValueMap>();
    auto id = m.find("ctx"), creator = m.find("creator"), keys = m.find("keys");
    if (id == m.end()) return std::shared_ptr<ContextState>();
    if (creator == m.end() || keys == m.end() || !id->second.is<int64_t>() || !creator->second.is<int64_t>() ||
        !keys->second.is<ValueList>()) {
      return absl::InvalidArgumentError("malformed distributed-autograd annotation");
    }
    const ValueList& k = keys->second.get<ValueList>();
    std::vector<Tensor*> tensors;
    ForEachTensor(payload, [&](Tensor& t) { tensors.push_back(&t); });
    if (tensors.size() != k.size()) {
      return absl::InvalidArgumentError("distributed-autograd annotation does not match the message's tensors");
    }
    std::shared_ptr<ContextState> ctx =
        GetOrCreate(U(id->second), static_cast<int>(creator->second.get<int64_t>()));
    {
      absl::MutexLock lock(&ctx->mu);
      ctx->peers.insert(from);
    }
    for (size_t i = 0; i < k.size(); ++i) {
      if (!k[i].is<int64_t>()) return absl::InvalidArgumentError("malformed distributed-autograd key");
      const uint64_t key = U(k[i]);
      if (key == 0) continue;
      Tensor& t = *tensors[i];
      if (!IsFloating(t.dtype())) return absl::InvalidArgumentError("a gradient key on a non-floating tensor");
      autograd::SetHistory(t, std::make_shared<RecvFunction>(ctx, from, key));
    }
    return ctx;
  }

  void StartPass(ContextState& ctx, uint64_t pass, Mode mode, bool retain) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    ctx.pass = pass;
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

  // Counts from the roots plus the sends that will receive a gradient: every one of them
  // (FAST), or those the discovery reached (SMART).
  void PrepareDependencies(ContextState& ctx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    if (ctx.dependencies_ready) return;
    std::vector<autograd::Edge> roots = ctx.local_roots;
    for (const auto& [key, send] : ctx.sends) {
      if (ctx.mode == Mode::kFast || ctx.reachable_sends.contains(key)) roots.push_back({send, 0});
    }
    ctx.task->ComputeDependencies(roots);
    ctx.dependencies_ready = true;
  }

  void RunLocked(ContextState& ctx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu) {
    try {
      ctx.task->Run();
    } catch (const gw::Error& e) {
      if (ctx.error.ok()) ctx.error = absl::InternalError(absl::StrCat(Name(self_), ": ", e.what()));
    }
  }

  // Sends the gradients that RecvFunctions queued; returns the futures of their answers.
  std::vector<Future<Value>> Flush(const std::shared_ptr<ContextState>& ctx, absl::Time deadline) {
    std::vector<OutgoingGradient> out;
    std::vector<Future<Value>> answers;
    uint64_t pass;
    Mode mode;
    bool retain;
    {
      absl::MutexLock lock(&ctx->mu);
      out.swap(ctx->outbox);
      pass = ctx->pass;
      mode = ctx->mode;
      retain = ctx->retain_graph;
    }
    auto self = shared_from_this();
    for (OutgoingGradient& g : out) {
      const absl::Duration left = std::max(absl::Milliseconds(1), deadline - absl::Now());
      ValueList args{Value(I(ctx->id)), Value(int64_t{ctx->creator}), Value(I(pass)),
                     Value(int64_t{mode == Mode::kFast ? 1 : 0}), Value(retain), Value(I(g.key)),
                     g.grad.defined() ? Value(g.grad) : Value(), Value(absl::ToInt64Milliseconds(left))};
      Promise<Value> answered(agent_.executor());
      agent_.CallRaw(Name(g.to), kGradFn, std::move(args), rpc::CallOptions{left},
                     [answered](absl::StatusOr<Value> r) { answered.Set(std::move(r)); });
      answers.push_back(answered.future());
    }
    return answers;
  }

  // The waiter is answered once `sent` are all answered and the worker is quiet.
  void Await(const std::shared_ptr<ContextState>& ctx, const std::shared_ptr<ContextState::Waiter>& waiter,
             std::vector<Future<Value>> sent) {
    auto self = shared_from_this();
    AllOf(agent_.executor(), std::move(sent)).Subscribe([self, ctx, waiter](const absl::StatusOr<Value>& r) {
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
    for (auto& w : ready) w->done.Set(result.ok() ? absl::StatusOr<Value>(Value()) : absl::StatusOr<Value>(result));
  }

  // SMART discovery: mark the sends named by `recvs` on their workers, recursively.
  Future<Value> Discover(ContextState& ctx, uint64_t pass, bool retain, absl::Time deadline,
                         absl::flat_hash_map<int, std::vector<uint64_t>> recvs) {
    std::vector<Future<Value>> calls;
    for (auto& [worker, keys] : recvs) {
      ValueList k;
      for (uint64_t key : keys) k.push_back(Value(I(key)));
      const absl::Duration left = std::max(absl::Milliseconds(1), deadline - absl::Now());
      calls.push_back(agent_.Async<Value>(Name(worker), kDiscoverFn, I(ctx.id), int64_t{ctx.creator}, I(pass), retain,
                                         Value(std::move(k)), absl::ToInt64Milliseconds(left),
                                         rpc::CallOptions{left}));
    }
    return AllOf(agent_.executor(), std::move(calls));
  }

  Future<Value> Failed(absl::Status s) { return MakeReadyFuture<Value>(agent_.executor(), std::move(s)); }

  // ---------------------------------------------------------------- handlers

  // [ctx, creator, pass, retain, keys, budget_ms]
  Future<Value> OnDiscover(ValueList a) {
    if (a.size() != 6 || !a[0].is<int64_t>() || !a[1].is<int64_t>() || !a[2].is<int64_t>() || !a[3].is<bool>() ||
        !a[4].is<ValueList>() || !a[5].is<int64_t>()) {
      return Failed(absl::InvalidArgumentError("__dist.discover: malformed request"));
    }
    auto ctx = GetOrCreate(U(a[0]), static_cast<int>(a[1].get<int64_t>()));
    const absl::Time deadline = absl::Now() + absl::Milliseconds(a[5].get<int64_t>());
    absl::flat_hash_map<int, std::vector<uint64_t>> recvs;
    {
      absl::MutexLock lock(&ctx->mu);
      if (absl::Status s = EnsurePass(*ctx, U(a[2]), Mode::kSmart, a[3].get<bool>()); !s.ok()) return Failed(s);
      std::vector<autograd::Edge> from;
      for (const Value& k : a[4].get<ValueList>()) {
        if (!k.is<int64_t>()) return Failed(absl::InvalidArgumentError("__dist.discover: malformed key"));
        auto it = ctx->sends.find(U(k));
        if (it == ctx->sends.end()) {
          return Failed(absl::NotFoundError(absl::StrCat(Name(self_), ": no send ", U(k), " in context ", ctx->id)));
        }
        if (ctx->reachable_sends.insert(U(k)).second) from.push_back({it->second, 0});  // each once per pass
      }
      CollectRecvs(from, &recvs);
    }
    return Discover(*ctx, U(a[2]), a[3].get<bool>(), deadline, std::move(recvs));
  }

  // [ctx, creator, pass, fast, retain, key, grad|none, budget_ms]
  Future<Value> OnGrad(const rpc::CallInfo& info, ValueList a) {
    if (a.size() != 8 || !a[0].is<int64_t>() || !a[1].is<int64_t>() || !a[2].is<int64_t>() || !a[3].is<int64_t>() ||
        !a[4].is<bool>() || !a[5].is<int64_t>() || !(a[6].is<Tensor>() || a[6].is<std::monostate>()) ||
        !a[7].is<int64_t>()) {
      return Failed(absl::InvalidArgumentError("__dist.grad: malformed request"));
    }
    auto ctx = GetOrCreate(U(a[0]), static_cast<int>(a[1].get<int64_t>()));
    const absl::Time deadline = absl::Now() + absl::Milliseconds(a[7].get<int64_t>());
    const Mode mode = a[3].get<int64_t>() == 1 ? Mode::kFast : Mode::kSmart;
    auto waiter = std::make_shared<ContextState::Waiter>(agent_.executor());
    {
      absl::MutexLock lock(&ctx->mu);
      if (absl::Status s = EnsurePass(*ctx, U(a[2]), mode, a[4].get<bool>()); !s.ok()) return Failed(s);
      auto it = ctx->sends.find(U(a[5]));
      if (it == ctx->sends.end()) {
        return Failed(absl::NotFoundError(absl::StrCat(Name(self_), ": no send ", U(a[5]), " in context ", ctx->id,
                                                       " (gradient from ", info.caller, ")")));
      }
      PrepareDependencies(*ctx);
      Tensor grad = a[6].is<Tensor>() ? a[6].get<Tensor>() : Tensor();
      try {
        ctx->task->AddInput({it->second, 0}, std::move(grad));
      } catch (const gw::Error& e) {
        if (ctx->error.ok()) ctx->error = absl::InternalError(absl::StrCat(Name(self_), ": ", e.what()));
      }
      RunLocked(*ctx);
      ctx->waiters.push_back(waiter);
    }
    Await(ctx, waiter, Flush(ctx, deadline));
    return waiter->done.future();
  }

  // [ctx]
  Future<Value> OnRelease(const rpc::CallInfo& info, ValueList a) {
    if (a.size() != 1 || !a[0].is<int64_t>()) return Failed(absl::InvalidArgumentError("__dist.release: malformed"));
    return Release(U(a[0]), info.caller_rank);
  }

  rpc::Agent& agent_;
  const int self_;
  std::atomic<uint64_t> next_context_{1};
  std::atomic<uint64_t> next_key_{1};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<ContextState>> contexts_ ABSL_GUARDED_BY(mu_);

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
                      " still wait. In FAST mode every recorded send must receive a gradient: a tensor sent to a "
                      "call whose result does not reach the loss never gets one. SMART mode (the default) handles "
                      "this.");
    }
    return absl::DeadlineExceededError(why);
  }
};

// ------------------------------------------------------------------ public API

std::shared_ptr<DistAutograd> DistAutograd::Install(rpc::Agent& agent) {
  auto impl = std::make_shared<Impl>(agent);
  if (absl::Status s = impl->RegisterFunctions(); !s.ok()) return nullptr;
  std::weak_ptr<Impl> weak = impl;
  if (absl::Status s = InstallOptimizerHost(agent,
                                            [weak](uint64_t context_id, const Tensor& param) {
                                              auto engine = weak.lock();
                                              if (!engine) return Tensor();
                                              auto ctx = engine->Find(context_id);
                                              return ctx ? ctx->gradients.Of(param) : Tensor();
                                            });
      !s.ok()) {
    return nullptr;
  }
  agent.SetCallHooks(impl);
  return std::shared_ptr<DistAutograd>(new DistAutograd(impl));
}

DistAutograd::DistAutograd(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
DistAutograd::~DistAutograd() = default;
size_t DistAutograd::live_contexts() const { return impl_->live(); }

std::vector<std::pair<Tensor, Tensor>> DistAutograd::GradientsOf(uint64_t context_id) const {
  std::shared_ptr<ContextState> ctx = impl_->Find(context_id);
  return ctx ? ctx->gradients.All() : std::vector<std::pair<Tensor, Tensor>>{};
}

Tensor DistAutograd::GradOf(uint64_t context_id, const Tensor& leaf) const {
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

uint64_t Context::id() const { return state_->id; }

absl::Status Context::Backward(const std::vector<Tensor>& roots, BackwardOptions options) {
  return engine_.impl_->Backward(state_, roots, options);
}

std::vector<std::pair<Tensor, Tensor>> Context::GetGradients() const { return state_->gradients.All(); }
Tensor Context::GradOf(const Tensor& leaf) const { return state_->gradients.Of(leaf); }

Context::Scope::Scope(const Context& ctx) : previous_(std::move(t_current)) { t_current = ctx.state_; }
Context::Scope::~Scope() { t_current = std::move(previous_); }

}  // namespace gw::dist_autograd
