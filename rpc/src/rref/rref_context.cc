#include "rref/rref_context.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/rpc/agent.h"  // the one unit below the facade that calls it: Handle, Send
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/retry.h"

namespace gw::rpc::internal {
namespace {

// Control messages (RRefFork, RRefAccept, RRefDelete) while their peer is UNAVAILABLE.
RetryPolicy ControlRetry(absl::Duration deadline) {
  RetryPolicy p;
  p.initial_backoff = absl::Milliseconds(50);
  p.max_backoff = absl::Seconds(1);
  p.max_attempts = 6;
  p.deadline = deadline;
  return p;
}

// fn(result of f) as a future, run on the thread that completes f (or at once): results
// move along without a pool hop, so a caller blocking a pool thread on them never needs
// another one. fn returns absl::StatusOr<Value> or Future<Value>.
template <typename F>
Future<Value> Chain(const Future<Value>& f, Executor& ex, F fn) {
  Promise<Value> out(ex);
  f.Subscribe([out, fn = std::move(fn)](const absl::StatusOr<Value>& v) mutable {
    using R = std::invoke_result_t<F&, const absl::StatusOr<Value>&>;
    if constexpr (std::is_same_v<R, Future<Value>>) {
      fn(v).Subscribe([out](const absl::StatusOr<Value>& r) { out.Set(r); });
    } else {
      out.Set(fn(v));
    }
  });
  return out.future();
}

}  // namespace

// ------------------------------------------------------------------ RRefState

RRefState::~RRefState() {
  if (ctx_) ctx_->Release(d_, is_owner_);
}

std::string RRefState::owner_name() const {
  return ctx_ ? ctx_->WorkerName(d_.owner) : absl::StrCat("rank ", d_.owner);
}

absl::Duration RRefState::WaitBudget(absl::Duration timeout) const {
  return ctx_ ? ctx_->WaitBudget(timeout) : absl::Seconds(1);
}

bool RRefState::confirmed() const { return ctx_ && ctx_->Confirmed(d_, is_owner_); }

Future<Value> RRefState::Fetch(CallOptions options) const { return ctx_->Fetch(d_, is_owner_, options); }

absl::StatusOr<Value> RRefState::LocalValue() const {
  if (!is_owner_) {
    return absl::FailedPreconditionError(absl::StrCat("LocalValue of RRef #", d_.rref_id.ToString(),
                                                      ": this worker is not its owner (", owner_name(),
                                                      " is); use ToHere"));
  }
  return ctx_->LocalValue(d_);
}

Future<Value> RRefState::Call(const std::string& method, ValueList args, CallOptions options) const {
  return ctx_->Call(d_, is_owner_, method, std::move(args), options);
}

std::shared_ptr<RRefState> RRefState::Remote(const std::string& method, ValueList args, CallOptions options,
                                             std::string type) const {
  return ctx_->Remote(d_.owner, method, std::move(args), options, std::move(type), d_.rref_id);
}

// ------------------------------------------------------------------ RRefContext

RRefContext::RRefContext(Hooks hooks) : hooks_(std::move(hooks)) {}

absl::Status RRefContext::RegisterFunctions() {
  // All quick and non-blocking: they run on the I/O thread that received them.
  const RegisterOptions inline_mode{HandlerMode::kInline};
  auto self = this;  // the agent owns this context and outlives its handlers
  Agent& agent = *hooks_.agent;
  for (absl::Status s : {
           agent.Handle<RRefRemote>([self](const CallInfo&i, RRefRemote m) { return self->OnRemote(i, std::move(m)); },
                                    inline_mode),
           agent.Handle<RRefFetch>([self](const CallInfo&, const RRefFetch&m) { return self->OnFetch(m); },
                                   inline_mode),
           agent.Handle<RRefCall>([self](const CallInfo&i, RRefCall m) { return self->OnCall(i, std::move(m)); },
                                  inline_mode),
           agent.Handle<RRefFork>([self](const CallInfo&i, const RRefFork&m) { return self->OnFork(i, m); },
                                  inline_mode),
           agent.Handle<RRefAccept>([self](const CallInfo&, const RRefAccept&m) { return self->OnAccept(m); },
                                    inline_mode),
           agent.Handle<RRefDelete>([self](const CallInfo&, const RRefDelete&m) { return self->OnDelete(m); },
                                    inline_mode),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void RRefContext::SetWorkerNames(std::vector<std::string> names) {
  std::atomic_store(&names_, std::shared_ptr<const std::vector<std::string>>(
                                 std::make_shared<std::vector<std::string>>(std::move(names))));
}

std::string RRefContext::WorkerName(int rank) const {
  std::shared_ptr<const std::vector<std::string>> names = std::atomic_load(&names_);
  if (names && rank >= 0 && rank < static_cast<int>(names->size())) return (*names)[static_cast<size_t>(rank)];
  return absl::StrCat("rank ", rank);
}

absl::Duration RRefContext::WaitBudget(absl::Duration timeout) const {
  return timeout > absl::ZeroDuration() ? timeout + absl::Seconds(1) : hooks_.default_timeout + absl::Seconds(1);
}

Executor& RRefContext::Exec() {
  if (closed_.load()) return closed_executor_;
  return hooks_.agent->executor();
}

RRefContext::Owned& RRefContext::OwnedEntry(GlobalId rref_id, const std::string& type) {
  auto it = owned_.find(rref_id);
  if (it == owned_.end()) {
    it = owned_.emplace(rref_id, Owned(Exec())).first;
    if (rref_id.rank() != hooks_.self_rank) ++owned_for_peer_[rref_id.rank()];
  }
  if (it->second.type.empty()) it->second.type = type;
  return it->second;
}

Future<Value> RRefContext::Failed(absl::Status s) { return MakeReadyFuture<Value>(Exec(), std::move(s)); }

void RRefContext::Run(Outbox& out) {
  for (auto& action : out.actions) action();
  out.actions.clear();
  out.garbage.clear();  // may release RRefs held by freed values: mu_ is not held here
}

// ------------------------------------------------------------------ creation

void RRefContext::StartCreation(Promise<Value> promise, const std::string& caller, const std::string& function,
                                ValueList args, std::optional<Future<Value>> self_value) {
  auto ctx = shared_from_this();
  // The function runs on the pool, handed off with the rest of the current read's work.
  auto start = [ctx, promise, caller, function](ValueList args) {
    ctx->hooks_.defer([ctx, promise, caller, function, args = std::move(args)]() mutable {
      ctx->hooks_.invoke_here(caller, function, std::move(args)).Subscribe([promise](const absl::StatusOr<Value>& v) {
        promise.Set(v);
      });
    });
  };
  if (!self_value) {
    start(std::move(args));
    return;
  }
  self_value->Subscribe([start, promise, args = std::move(args)](const absl::StatusOr<Value>& v) mutable {
    if (!v.ok()) {
      promise.Set(v.status());
    } else {
      args.insert(args.begin(), *v);
      start(std::move(args));
    }
  });
}

RRefPtr RRefContext::Remote(int owner, const std::string& function, ValueList args, CallOptions options,
                            std::string type, GlobalId self_rref) {
  const int self = hooks_.self_rank;
  const GlobalId id = hooks_.ids->Next();
  if (owner == self) {
    std::optional<Promise<Value>> promise;
    std::optional<Future<Value>> self_value;
    {
      absl::MutexLock lock(&mu_);
      Owned& e = OwnedEntry(id, type);
      e.created = true;
      e.local = 1;
      promise = e.promise;
      if (closed_) {
        e.promise.Set(ShutDown());
      } else if (self_rref.valid()) {
        auto it = owned_.find(self_rref);
        if (it != owned_.end()) self_value = it->second.value;
      }
    }
    if (!closed() && !hooks_.has_function(function)) {
      promise->Set(hooks_.missing_function(function));
    } else if (!closed()) {
      StartCreation(*promise, WorkerName(self), function, std::move(args), std::move(self_value));
    }
    return std::make_shared<RRefState>(shared_from_this(), RRefDescriptor{id, {}, self, self, {}, type}, true);
  }
  const GlobalId fork = hooks_.ids->Next();
  bool send = false;
  {
    absl::MutexLock lock(&mu_);
    UserFork& u = users_[fork];
    u.rref_id = id;
    u.owner = owner;
    if (closed_) {
      u.state = ForkState::kFailed;
      u.error = ShutDown();
    } else if (owner < 0 || owner >= hooks_.world_size) {
      u.state = ForkState::kFailed;
      u.error = absl::NotFoundError(absl::StrCat("Remote: no worker of rank ", owner));
    } else if (gone_.contains(owner)) {
      u.state = ForkState::kFailed;
      u.error = GoneError(owner);
    } else {
      ++in_flight_;
      send = true;
    }
  }
  auto state = std::make_shared<RRefState>(shared_from_this(), RRefDescriptor{id, fork, owner, self, {}, type}, false);
  if (send) {
    auto ctx = shared_from_this();
    hooks_.agent->Send(WorkerName(owner), RRefRemote{id, fork, function, std::move(args), self_rref, type}, options,
                       [ctx, fork](const absl::StatusOr<Ack>& r) { ctx->Confirm(fork, r.status(), true); });
  }
  return state;
}

RRefPtr RRefContext::Own(Value value, std::string type) {
  const GlobalId id = hooks_.ids->Next();
  {
    absl::MutexLock lock(&mu_);
    Owned& e = OwnedEntry(id, type);
    e.created = true;
    e.local = 1;
    e.promise.Set(std::move(value));
  }
  return std::make_shared<RRefState>(shared_from_this(),
                                     RRefDescriptor{id, {}, hooks_.self_rank, hooks_.self_rank, {}, type}, true);
}

absl::Status RRefContext::ShutDown() const {
  return ShuttingDownError(WorkerName(hooks_.self_rank), "its RRefs are no longer usable");
}

absl::Status RRefContext::OnRemote(const CallInfo& info, RRefRemote m) {
  const int from = info.caller_rank;  // the connection's, not what the message claims
  if (from < 0 || !m.rref.valid() || !m.fork.valid()) {
    return absl::InvalidArgumentError("RRefRemote: malformed request (null id or unidentified caller)");
  }
  if (m.rref.rank() != from) {  // the caller makes the id (and is charged for it: PeerLimits::max_rrefs)
    return absl::InvalidArgumentError(absl::StrCat("RRefRemote: RRef id ", m.rref.ToString(), " was not made by ",
                                                   info.caller, ", who asks to create it"));
  }
  if (!hooks_.has_function(m.function)) {
    absl::Status s = hooks_.missing_function(m.function);
    FailUnfilled(m.rref, s);  // forks of it that arrived first must not wait for it
    return s;
  }
  std::optional<Promise<Value>> promise;
  std::optional<Future<Value>> self_value;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return ShutDown();
    if (gone_.contains(from)) return GoneError(from);  // forks of it that came first failed then
    if (m.self_rref.valid()) {
      auto it = owned_.find(m.self_rref);
      if (it == owned_.end()) {
        absl::Status s = absl::NotFoundError(absl::StrCat("RRef #", m.self_rref.ToString(), " is not owned by ",
                                                          WorkerName(hooks_.self_rank), " (freed?)"));
        auto e = owned_.find(m.rref);
        if (e != owned_.end() && !e->second.created) {
          e->second.created = true;
          promise = e->second.promise;
        }
        mu_.Unlock();
        if (promise) promise->Set(s);
        mu_.Lock();
        return s;
      }
      self_value = it->second.value;
    }
    if (const int64_t limit = hooks_.max_rrefs_per_peer; limit > 0 && !owned_.contains(m.rref)) {
      if (auto n = owned_for_peer_.find(from); n != owned_for_peer_.end() && n->second >= limit) {
        absl::Status s = absl::ResourceExhaustedError(
            absl::StrCat(WorkerName(hooks_.self_rank), " owns ", n->second, " RRefs for ", info.caller,
                         ", its limit (PeerLimits::max_rrefs, GRADWIRE_MAX_RREFS_PER_PEER): release some first"));
        mu_.Unlock();
        FailUnfilled(m.rref, s);
        mu_.Lock();
        return s;
      }
    }
    Owned& e = OwnedEntry(m.rref, m.type);
    e.forks[m.fork] = from;
    if (!e.created) {  // else: a retried request
      e.created = true;
      promise = e.promise;
    }
  }
  if (promise) StartCreation(*promise, info.caller, m.function, std::move(m.args), std::move(self_value));
  return absl::OkStatus();  // the acknowledgement
}

void RRefContext::FailUnfilled(GlobalId rref_id, const absl::Status& s) {
  constexpr size_t kRemembered = 10000;
  std::optional<Promise<Value>> promise;
  {
    absl::MutexLock lock(&mu_);
    if (failed_creations_.emplace(rref_id, s).second) {
      failed_order_.push_back(rref_id);
      if (failed_order_.size() > kRemembered) {
        failed_creations_.erase(failed_order_.front());
        failed_order_.pop_front();
      }
    }
    auto it = owned_.find(rref_id);
    if (it == owned_.end() || it->second.created) return;
    it->second.created = true;
    promise = it->second.promise;
  }
  promise->Set(s);
}

absl::Status RRefContext::GoneError(int rank) const {
  if (hooks_.gone_error) return hooks_.gone_error(rank);
  return DeclaredDeadError(WorkerName(rank));
}

void RRefContext::FailIfCreatorGone(GlobalId rref_id, Owned& e, Outbox& out) {
  if (e.created || !gone_.contains(rref_id.rank())) return;
  // Its creator is gone and its REMOTE has not arrived: it never will (or the value was
  // freed when the creator's forks went, and this entry is only a late fork's).
  e.created = true;
  out.actions.push_back([p = e.promise, name = WorkerName(rref_id.rank())] {
    p.Set(absl::UnavailableError(absl::StrCat("the worker that created this RRef, ", name, ", is gone")));
  });
}

bool RRefContext::KnownOrForeign(GlobalId rref_id) const {
  // Ids carry their creator's rank: one of ours that is not in the table was freed.
  return owned_.contains(rref_id) || rref_id.rank() != hooks_.self_rank;
}

// ------------------------------------------------------------------ forks

absl::Status RRefContext::Walk(Value* v, const std::function<absl::Status(RRefPtr&)>& fn) {
  auto& storage = v->storage();
  if (auto* r = std::get_if<RRefPtr>(&storage)) return *r ? fn(*r) : absl::OkStatus();
  if (auto* l = std::get_if<ValueList>(&storage)) {
    for (Value& e : *l) {
      if (absl::Status s = Walk(&e, fn); !s.ok()) return s;
    }
  } else if (auto* m = std::get_if<ValueMap>(&storage)) {
    for (auto& [_, e] : *m) {
      if (absl::Status s = Walk(&e, fn); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

bool RRefContext::ContainsRRef(const Value& v) {
  const auto& storage = v.storage();
  if (std::holds_alternative<RRefPtr>(storage)) return true;
  if (const auto* l = std::get_if<ValueList>(&storage)) {
    return std::any_of(l->begin(), l->end(), [](const Value& e) { return ContainsRRef(e); });
  }
  if (const auto* m = std::get_if<ValueMap>(&storage)) {
    return std::any_of(m->begin(), m->end(), [](const auto& e) { return ContainsRRef(e.second); });
  }
  return false;
}

absl::Status RRefContext::PrepareOutgoing(Value* payload, int dest) {
  if (!ContainsRRef(*payload)) return absl::OkStatus();  // the common case: no lock
  if (dest < 0) return absl::InvalidArgumentError("cannot send RRefs to an unidentified peer");
  const int self = hooks_.self_rank;
  std::vector<RRefPtr> replaced;  // released after mu_
  std::vector<RRefDescriptor> made;
  Outbox out;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (gone_.contains(dest)) return GoneError(dest);
    status = Walk(payload, [&](RRefPtr& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      if (!r->attached()) return absl::InternalError("an RRef in transit was sent on without being adopted");
      const RRefDescriptor& d = r->descriptor();
      RRefDescriptor child{d.rref_id, hooks_.ids->Next(), d.owner, self, {}, d.type};
      if (r->is_owner()) {
        auto it = owned_.find(d.rref_id);
        if (it == owned_.end()) {
          return absl::FailedPreconditionError(absl::StrCat("RRef #", d.rref_id.ToString(), " was freed"));
        }
        it->second.forks[child.fork_id] = dest;
      } else {
        auto it = users_.find(d.fork_id);
        if (it == users_.end()) {
          return absl::FailedPreconditionError(absl::StrCat("RRef #", d.rref_id.ToString(), " was released"));
        }
        if (it->second.state == ForkState::kFailed) {
          return absl::FailedPreconditionError(absl::StrCat("cannot send RRef #", d.rref_id.ToString(),
                                                            ": it is not valid: ", it->second.error.message()));
        }
        it->second.children[child.fork_id] = dest;
        child.parent_fork = d.fork_id;
      }
      made.push_back(child);
      replaced.push_back(std::move(r));
      r = std::make_shared<RRefState>(child);
      return absl::OkStatus();
    });
    if (!status.ok()) {
      for (const RRefDescriptor& c : made) Unfork(c, out);
    }
  }
  Run(out);
  return status;
}

void RRefContext::Unfork(const RRefDescriptor& child, Outbox& out) {
  if (!child.parent_fork.valid()) {
    auto it = owned_.find(child.rref_id);
    if (it == owned_.end()) return;
    it->second.forks.erase(child.fork_id);
    MaybeFree(child.rref_id, out);
  } else {
    auto it = users_.find(child.parent_fork);
    if (it == users_.end()) return;
    it->second.children.erase(child.fork_id);
    MaybeDelete(child.parent_fork, out);
  }
}

void RRefContext::AbandonOutgoing(Value* payload) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    (void)Walk(payload, [&](RRefPtr& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!r->attached() && r->descriptor().parent == hooks_.self_rank) Unfork(r->descriptor(), out);
      return absl::OkStatus();
    });
  }
  Run(out);
}

absl::Status RRefContext::AdoptIncoming(Value* payload, int from) {
  const int self = hooks_.self_rank;
  const int world = hooks_.world_size;
  Outbox out;
  std::vector<RRefPtr> replaced;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return ShutDown();
    status = Walk(payload, [&](RRefPtr& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      if (r->attached()) return absl::OkStatus();  // sent to ourselves through a local path
      const RRefDescriptor d = r->descriptor();
      if (gone_.contains(from)) return GoneError(from);
      if (gone_.contains(d.owner)) return GoneError(d.owner);
      if (d.owner >= world || d.parent >= world || d.parent != from || !d.fork_id.valid() ||
          d.parent_fork.valid() == (d.parent == d.owner)) {
        return absl::InvalidArgumentError(absl::StrCat("malformed RRef #", d.rref_id.ToString(), " from rank ", from));
      }
      auto ctx = shared_from_this();
      if (d.owner == self) {
        if (!KnownOrForeign(d.rref_id)) {
          return absl::NotFoundError(
              absl::StrCat("RRef #", d.rref_id.ToString(), " sent by rank ", from, " was already freed"));
        }
        if (auto f = failed_creations_.find(d.rref_id); f != failed_creations_.end() && !owned_.contains(d.rref_id)) {
          return f->second;
        }
        Owned& e = OwnedEntry(d.rref_id, d.type);
        FailIfCreatorGone(d.rref_id, e, out);
        ++e.local;
        if (d.parent == self) {
          e.forks.erase(d.fork_id);
        } else {
          QueueAccept(d.parent, d.parent_fork, d.fork_id, out);
        }
        replaced.push_back(std::move(r));
        r = std::make_shared<RRefState>(ctx, RRefDescriptor{d.rref_id, {}, self, self, {}, d.type}, true);
        return absl::OkStatus();
      }
      if (users_.contains(d.fork_id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("RRef fork #", d.fork_id.ToString(), " from rank ", from, " arrived twice"));
      }
      UserFork& u = users_[d.fork_id];
      u.rref_id = d.rref_id;
      u.owner = d.owner;
      if (d.parent == d.owner) {
        u.state = ForkState::kConfirmed;  // the owner registered it before sending
      } else {
        u.state = ForkState::kPending;
        u.accept_to = d.parent;
        u.accept_parent_fork = d.parent_fork;
        ++in_flight_;
        const GlobalId rref_id = d.rref_id, fork = d.fork_id;
        const int owner = d.owner;
        out.actions.push_back([ctx, owner, rref_id, fork] {
          ctx->SendControl(owner, RRefFork{rref_id, fork},
                           [ctx, fork](absl::Status s) { ctx->Confirm(fork, s, true); });
        });
      }
      replaced.push_back(std::move(r));
      r = std::make_shared<RRefState>(ctx, d, false);
      return absl::OkStatus();
    });
  }
  Run(out);
  return status;
}

void RRefContext::Confirm(GlobalId fork, absl::Status status, bool in_flight) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    if (in_flight) --in_flight_;  // in the same critical section as what follows (Idle)
    auto it = users_.find(fork);
    if (it == users_.end() || it->second.state != ForkState::kPending) return;
    UserFork& u = it->second;
    if (status.ok()) {
      u.state = ForkState::kConfirmed;
    } else {
      u.state = ForkState::kFailed;
      u.error = absl::Status(status.code(), absl::StrCat("RRef #", u.rref_id.ToString(), " owned by ",
                                                         WorkerName(u.owner), ": ", status.message()));
      // A timed-out request may still have registered the fork: it is deleted like a
      // confirmed one once its children are settled (DELETE is idempotent).
      u.maybe_registered = status.code() == absl::StatusCode::kDeadlineExceeded;
    }
    for (auto& send : u.after_registration) out.actions.push_back(std::move(send));
    u.after_registration.clear();
    // Confirmed or failed, the parent may now let go of its own fork.
    if (u.accept_to >= 0) {
      QueueAccept(u.accept_to, u.accept_parent_fork, fork, out);
      u.accept_to = -1;
    }
    MaybeDelete(fork, out);
  }
  Run(out);
}

void RRefContext::QueueAccept(int parent, GlobalId parent_fork, GlobalId fork, Outbox& out) {
  auto ctx = shared_from_this();
  ++in_flight_;
  out.actions.push_back([ctx, parent, parent_fork, fork] {
    ctx->SendControl(parent, RRefAccept{parent_fork, fork}, [ctx](absl::Status) {
      absl::MutexLock lock(&ctx->mu_);
      --ctx->in_flight_;
    });
  });
}

void RRefContext::MaybeDelete(GlobalId fork, Outbox& out) {
  auto it = users_.find(fork);
  if (it == users_.end()) return;
  UserFork& u = it->second;
  if (!u.released || !u.children.empty() || u.state == ForkState::kPending) return;
  if (u.state == ForkState::kConfirmed || u.maybe_registered) QueueDelete(u.owner, u.rref_id, fork, out);
  users_.erase(it);
}

void RRefContext::MaybeFree(GlobalId rref_id, Outbox& out) {
  auto it = owned_.find(rref_id);
  if (it == owned_.end() || !it->second.forks.empty() || it->second.local > 0) return;
  out.garbage.push_back(std::move(it->second));
  owned_.erase(it);
  if (rref_id.rank() != hooks_.self_rank) {
    if (auto n = owned_for_peer_.find(rref_id.rank()); n != owned_for_peer_.end() && --n->second == 0) {
      owned_for_peer_.erase(n);
    }
  }
}

void RRefContext::QueueDelete(int owner, GlobalId rref_id, GlobalId fork, Outbox& out) {
  DeleteQueue& q = deletes_[owner];
  q.queued.push_back(ForkOf{rref_id, fork});
  if (q.in_flight) return;  // goes with the next batch
  q.in_flight = true;
  auto ctx = shared_from_this();
  out.actions.push_back([ctx, owner] { ctx->SendDeletes(owner); });
}

// One DELETE message at a time per owner; deletes queued meanwhile travel together.
void RRefContext::SendDeletes(int owner) {
  RRefDelete batch;
  {
    absl::MutexLock lock(&mu_);
    DeleteQueue& q = deletes_[owner];
    if (q.queued.empty() || closed_) {
      q.in_flight = false;
      return;
    }
    batch.forks.swap(q.queued);
    ++in_flight_;
  }
  auto ctx = shared_from_this();
  SendControl(owner, std::move(batch), [ctx, owner](absl::Status) {
    {
      absl::MutexLock lock(&ctx->mu_);
      --ctx->in_flight_;
    }
    ctx->SendDeletes(owner);
  });
}

template <typename M>
void RRefContext::SendControl(int to, M message, std::function<void(absl::Status)> done) {
  if (closed()) {
    done(ShutDown());
    return;
  }
  // Sends may block on a full socket or a dial: never on a transport I/O thread.
  auto ctx = shared_from_this();
  hooks_.defer([ctx, to, message = std::move(message), done = std::move(done)]() mutable {
    if (ctx->closed()) {
      done(ctx->ShutDown());
      return;
    }
    RetryPolicy policy = ControlRetry(ctx->hooks_.default_timeout);
    policy.retryable = [ctx, to](const absl::Status& s) {
      if (!IsRetryable(s) || ctx->closed()) return false;
      absl::MutexLock lock(&ctx->mu_);
      return !ctx->gone_.contains(to);
    };
    Agent& agent = *ctx->hooks_.agent;
    const std::string peer = ctx->WorkerName(to);
    Retry<Ack>(agent.executor(), agent.timers(), std::move(policy), [&agent, peer, message = std::move(message)](int) {
      return agent.Send(peer, message);
    }).Subscribe([done = std::move(done)](const absl::StatusOr<Ack>& r) { done(r.status()); });
  });
}

absl::Status RRefContext::OnFork(const CallInfo& info, const RRefFork& m) {
  if (info.caller_rank < 0 || !m.rref.valid() || !m.fork.valid()) {
    return absl::InvalidArgumentError("RRefFork: malformed request (null id or unidentified caller)");
  }
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return ShutDown();
    if (gone_.contains(info.caller_rank)) return GoneError(info.caller_rank);
    if (!KnownOrForeign(m.rref)) {
      return absl::NotFoundError(absl::StrCat("RRef #", m.rref.ToString(), " was already freed"));
    }
    if (auto f = failed_creations_.find(m.rref); f != failed_creations_.end() && !owned_.contains(m.rref)) {
      return f->second;
    }
    // May come before the RRefRemote that creates the value (another worker sent it).
    Owned& e = OwnedEntry(m.rref, "");
    e.forks[m.fork] = info.caller_rank;
    FailIfCreatorGone(m.rref, e, out);
  }
  Run(out);
  return absl::OkStatus();
}

absl::Status RRefContext::OnAccept(const RRefAccept& m) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    auto it = users_.find(m.parent_fork);
    if (it != users_.end()) {
      it->second.children.erase(m.fork);
      MaybeDelete(m.parent_fork, out);
    }
  }
  Run(out);
  return absl::OkStatus();
}

absl::Status RRefContext::OnDelete(const RRefDelete& m) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    for (const ForkOf& f : m.forks) {
      auto it = owned_.find(f.rref);
      if (it == owned_.end()) continue;  // a repeated delete
      it->second.forks.erase(f.fork);
      MaybeFree(f.rref, out);
    }
  }
  Run(out);
  return absl::OkStatus();
}

// ------------------------------------------------------------------ values

Future<Value> RRefContext::ValueOf(GlobalId rref_id) {
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    auto it = owned_.find(rref_id);
    if (it != owned_.end()) return it->second.value;
    if (auto f = failed_creations_.find(rref_id); f != failed_creations_.end()) failed = f->second;
  }
  if (!failed.ok()) return Failed(failed);
  return Failed(absl::NotFoundError(absl::StrCat("RRef #", rref_id.ToString(), " is not owned by ",
                                                 WorkerName(hooks_.self_rank), " (already freed?)")));
}

Future<Value> RRefContext::OnFetch(const RRefFetch& m) {
  const GlobalId id = m.rref;
  return Chain(ValueOf(id), Exec(), [id](const absl::StatusOr<Value>& v) -> absl::StatusOr<Value> {
    if (v.ok() && v->is<Object>()) {
      return absl::FailedPreconditionError(
          absl::StrCat("RRef #", id.ToString(), " holds an object of type ", v->get<Object>().type,
                       ", which stays on its owner: call its methods instead of ToHere"));
    }
    return v;
  });
}

Future<Value> RRefContext::OnCall(const CallInfo& info, RRefCall m) {
  auto ctx = shared_from_this();
  return Chain(ValueOf(m.rref), Exec(),
               [ctx, caller = info.caller, method = std::move(m.method),
                args = std::move(m.args)](const absl::StatusOr<Value>& v) mutable -> Future<Value> {
                 if (!v.ok()) return ctx->Failed(v.status());
                 args.insert(args.begin(), *v);
                 return ctx->hooks_.invoke(caller, method, std::move(args));
               });
}

Future<Value> RRefContext::Fetch(const RRefDescriptor& d, bool is_owner, CallOptions options) {
  if (closed()) return Failed(ShutDown());
  if (is_owner) return ValueOf(d.rref_id);
  return SendThroughFork(d, RRefFetch{d.rref_id}, options);
}

Future<Value> RRefContext::Call(const RRefDescriptor& d, bool is_owner, const std::string& method, ValueList args,
                                CallOptions options) {
  if (closed()) return Failed(ShutDown());
  if (is_owner) {
    return OnCall(CallInfo{WorkerName(hooks_.self_rank), method, hooks_.self_rank},
                  RRefCall{d.rref_id, method, std::move(args)});
  }
  return SendThroughFork(d, RRefCall{d.rref_id, method, std::move(args)}, options);
}

template <typename M>
Future<Value> RRefContext::SendThroughFork(const RRefDescriptor& d, M message, CallOptions options) {
  Promise<Value> promise(Exec());
  std::function<void()> send = [ctx = shared_from_this(), d, message = std::move(message), options, promise]() mutable {
    if (ctx->closed()) {
      promise.Set(ctx->ShutDown());
      return;
    }
    ctx->hooks_.agent->Send(ctx->WorkerName(d.owner), std::move(message), options, ctx->Completion(d, promise));
  };
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    auto it = users_.find(d.fork_id);
    if (closed_) {
      failed = ShutDown();
    } else if (it != users_.end() && it->second.state == ForkState::kFailed) {
      failed = it->second.error;
    } else if (it != users_.end() && it->second.state == ForkState::kPending && it->second.accept_to >= 0) {
      // Received from another user: the request could overtake the fork's FORK and the
      // creator's REMOTE and reach an owner that does not know the RRef yet.
      it->second.after_registration.push_back(std::move(send));
      return promise.future();
    }
  }
  if (!failed.ok()) return Failed(failed);
  send();
  return promise.future();
}

// Requests through a fork may be sent before the owner acknowledged it; when the
// creation failed, the owner's reply to them is "not found", and the creation's own error
// (which arrived first, on the same connection) is the one to report.
std::function<void(absl::StatusOr<Value>)> RRefContext::Completion(const RRefDescriptor& d, Promise<Value> promise) {
  auto ctx = shared_from_this();
  return [ctx, d, promise](absl::StatusOr<Value> r) {
    if (!r.ok()) {
      if (absl::Status s = ctx->UsableFork(d); !s.ok()) r = s;
    }
    promise.Set(std::move(r));
  };
}

absl::Status RRefContext::UsableFork(const RRefDescriptor& d) {
  absl::MutexLock lock(&mu_);
  if (closed_) return ShutDown();
  auto it = users_.find(d.fork_id);
  if (it != users_.end() && it->second.state == ForkState::kFailed) return it->second.error;
  return absl::OkStatus();
}

absl::StatusOr<Value> RRefContext::LocalValue(const RRefDescriptor& d) {
  if (closed()) return ShutDown();
  return ValueOf(d.rref_id).Get(hooks_.default_timeout);
}

bool RRefContext::Confirmed(const RRefDescriptor& d, bool is_owner) const {
  if (is_owner) return true;
  absl::MutexLock lock(&mu_);
  auto it = users_.find(d.fork_id);
  return it != users_.end() && it->second.state == ForkState::kConfirmed;
}

void RRefContext::Release(const RRefDescriptor& d, bool is_owner) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    if (is_owner) {
      auto it = owned_.find(d.rref_id);
      if (it != owned_.end()) {
        --it->second.local;
        MaybeFree(d.rref_id, out);
      }
    } else {
      auto it = users_.find(d.fork_id);
      if (it != users_.end()) {
        it->second.released = true;
        MaybeDelete(d.fork_id, out);
      }
    }
  }
  Run(out);
}

// ------------------------------------------------------------------ failures, shutdown

void RRefContext::OnPeerGone(int rank) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    if (closed_ || rank == hooks_.self_rank) return;
    gone_.insert(rank);
    std::vector<GlobalId> owned_ids, user_ids;
    for (auto& [id, e] : owned_) {
      absl::erase_if(e.forks, [rank](const auto& f) { return f.second == rank; });
      owned_ids.push_back(id);
      FailIfCreatorGone(id, e, out);
    }
    for (auto& [fork, u] : users_) {
      absl::erase_if(u.children, [rank](const auto& c) { return c.second == rank; });
      if (u.owner == rank && u.state != ForkState::kFailed) {
        u.state = ForkState::kFailed;
        u.error =
            UnavailableError(absl::StrCat("RRef #", u.rref_id.ToString(), "'s owner ", WorkerName(rank)), "it is gone");
        u.children.clear();
        for (auto& send : u.after_registration) out.actions.push_back(std::move(send));  // each fails: kFailed
        u.after_registration.clear();
      }
      if (u.accept_to == rank) u.accept_to = -1;
      user_ids.push_back(fork);
    }
    deletes_[rank].queued.clear();
    for (GlobalId id : owned_ids) MaybeFree(id, out);
    for (GlobalId fork : user_ids) MaybeDelete(fork, out);
  }
  Run(out);
}

bool RRefContext::Idle() const {
  absl::MutexLock lock(&mu_);
  return IdleLocked();
}

bool RRefContext::AwaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return IdleLocked(); };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

bool RRefContext::IdleLocked() const {
  if (in_flight_ > 0) return false;
  for (const auto& [_, q] : deletes_) {
    if (q.in_flight || !q.queued.empty()) return false;
  }
  return true;
}

bool RRefContext::closed() const { return closed_.load(); }

std::vector<std::string> RRefContext::Leaks() const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : owned_) {
    if (e.forks.empty()) continue;
    std::vector<std::string> holders;
    for (const auto& [_, rank] : e.forks) holders.push_back(WorkerName(rank));
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    out.push_back(absl::StrCat("RRef #", id.ToString(), " (", e.type.empty() ? "unknown type" : e.type, ") owned by ",
                               WorkerName(hooks_.self_rank), " is still referenced by ", e.forks.size(), " fork(s) on ",
                               absl::StrJoin(holders, ", ")));
  }
  std::sort(out.begin(), out.end());
  return out;
}

RRefStats RRefContext::Stats() const {
  absl::MutexLock lock(&mu_);
  return StatsLocked();
}

RRefStats RRefContext::StatsLocked() const {
  RRefStats s;
  s.owned = static_cast<int64_t>(owned_.size());
  for (const auto& [_, e] : owned_) {
    s.owner_forks += static_cast<int64_t>(e.forks.size());
    s.owner_local += e.local;
  }
  s.users = static_cast<int64_t>(users_.size());
  s.pending_control = in_flight_;
  return s;
}

bool RRefContext::AwaitStats(const std::function<bool(const RRefStats&)>& until, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return until(StatsLocked()); };
  return mu_.AwaitWithDeadline(absl::Condition(&holds), deadline);
}

void RRefContext::Close() {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [_, e] : owned_) {
      Promise<Value> p = e.promise;  // completed after mu_ is released: callbacks run inline
      out.actions.push_back([p] { p.Set(absl::CancelledError("the agent shut down before the value was created")); });
      out.garbage.push_back(std::move(e));
    }
    owned_.clear();
    for (auto& [_, u] : users_) {
      for (auto& send : u.after_registration) out.actions.push_back(std::move(send));  // each fails: closed
    }
    users_.clear();
    deletes_.clear();
  }
  Run(out);
}

}  // namespace gw::rpc::internal
