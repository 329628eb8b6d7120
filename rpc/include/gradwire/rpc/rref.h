// RRef<T>: a reference to a value that lives on one worker, its owner.
//
// Contract
//   - Agent::Remote<T>(worker, function, args...) runs `function` on `worker` and returns
//     at once an RRef owned by that worker; Agent::Own<T>(value) makes an RRef owned here.
//     T is what the owner holds: a Value type (Tensor, int, list, ...) or
//     std::shared_ptr<C> for any C++ object (a module, a table), which never leaves its
//     owner (ToHere of it works on the owner only; call its methods instead).
//   - RRef API: IsOwner, Owner (worker name), ConfirmedByOwner, ToHere(timeout) (copies
//     the value here; waits until it exists), LocalValue (owner only), and method proxies
//     Sync/Async/Remote(method, args...): run the registered function `method` on the
//     owner with the owned value as first argument (like rref.rpc_sync().method()).
//     Errors follow agent.h's failure model: UNAVAILABLE naming the owner when it is
//     dead, DEADLINE_EXCEEDED, CANCELLED once this agent shuts down, FAILED_PRECONDITION
//     for an RRef whose creation failed (passing it on) or a non-owner's LocalValue, the
//     function's own error.
//   - RRefs are Values: they may be arguments and results of any call, to any worker.
//     Copies of an RRef<T> in one process share one reference (one fork).
//   - Introspection: Agent::rref_stats() counts owned values, their forks and users.
//   - Thread-safe.
//   - This header is the handle alone: it does not include the agent (agent.h includes
//     it, and defines Agent::Remote and Agent::Own); the state one fork shares is in
//     internal/rref_state.h, which the wire codec reads without the agent.
//
// Reference counting protocol (rref_context.cc). Every reference held outside the owner
// is a *fork* with a GlobalId (global_id.h); the owner keeps, per owned value, the set of
// forks that exist (with the worker holding each) and a count of its own local handles.
// The value is freed exactly when both are empty.
//
//   Fork states at the worker holding it (a user):
//     PENDING   created, the owner has not acknowledged it yet
//     CONFIRMED the owner acknowledged it (it is in the owner's fork set)
//     FAILED    creation failed (Remote of an unknown function, owner dead)
//     RELEASED  no local handle left; the fork lingers while it is PENDING or has
//               unconfirmed children, then a DELETE goes to the owner and it is gone
//   Messages: the records of rpc/src/rref/rref_messages.h, all idempotent. RRefFork,
//   RRefAccept and RRefDelete are retried by the agent's retry policy (retry.h) while the
//   peer is UNAVAILABLE and still alive to us; nothing else is retried.
//     RRefRemote {rref, fork, function, args, self_rref, type}   user -> owner: create the
//                 value (if not known yet) and add `fork`; acknowledged before the function
//                 finishes; self_rref set: a method of that owned value, result kept there.
//     RRefFetch {rref} / RRefCall {rref, method, args}           user -> owner: ToHere, and
//                 method calls on the value.
//     RRefFork {rref, fork}               new user -> owner: add `fork` (creating the entry
//                 if the RRefRemote has not arrived yet: messages from different workers
//                 arrive in any order).
//     RRefAccept {parent_fork, fork}      new user (or owner) -> parent: the child is known
//                 to the owner; the parent may now be released.
//     RRefDelete {forks: [ForkOf {rref, fork}]}  user -> owner, batched per owner.
//   Sending an RRef from worker P to worker X creates a child fork c:
//     P is the owner: c is added to the owner's set before sending; X's fork is
//       CONFIRMED on arrival (no FORK, no ACCEPT).
//     P is a user:    P remembers c as an unconfirmed child, which keeps P's own fork
//       (and so the value) alive: guarantee 2, a parent is not released before the
//       owner confirmed the child. On arrival X sends FORK to the owner, and once it is
//       acknowledged, ACCEPT to P. If X is the owner itself, it takes a local handle and
//       sends ACCEPT at once.
//   A user sends DELETE only for a CONFIRMED fork without unconfirmed children, so the
//   owner learns of every user's deletion (guarantee 1) after it learned of the fork.
//   Failures: when a worker is declared dead (its connections closed), its owner drops
//   the forks that worker held, users drop forks owned by it (their calls fail with
//   UNAVAILABLE naming it), and parents drop unconfirmed children sent to it. A worker
//   declared dead stays dead for RRefs, even if it is alive and dials again (until
//   membership can tell a restart from a dropped connection): RRefs it creates, sends or
//   owns and forks meant for it are refused with UNAVAILABLE naming it, so no fork is
//   registered that nobody would delete.
//   At graceful shutdown every worker first drains its control messages; then each
//   owner reports values still referenced by forks of other workers (leaks), as
//   AgentOptions::rref_leak_check says.
#ifndef GRADWIRE_RPC_RREF_H_
#define GRADWIRE_RPC_RREF_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/internal/handler.h"
#include "gradwire/rpc/internal/rref_state.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/worker.h"

namespace gw::rpc {

// What one agent holds (Agent::rref_stats).
struct RRefStats {
  int64_t owned = 0;        // values owned here
  int64_t owner_forks = 0;  // forks of owned values held by users
  int64_t owner_local = 0;  // this worker's own handles to owned values
  int64_t users = 0;        // forks held here (user RRefs), including released ones
                            // still waiting for a confirmation
  int64_t pending_control = 0;  // control messages sent and not yet acknowledged
};

template <typename T>
class RRef {
 public:
  RRef() = default;  // null
  explicit RRef(std::shared_ptr<internal::RRefState> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  bool IsOwner() const { return state_->is_owner(); }
  std::string Owner() const { return state_->owner_name(); }
  int owner_rank() const { return state_->descriptor().owner; }
  GlobalId id() const { return state_->descriptor().rref_id; }
  bool ConfirmedByOwner() const { return state_->confirmed(); }

  Future<T> ToHereAsync(CallOptions options = {}) const {
    return state_->Fetch(options).Then([](const absl::StatusOr<Value>& v) -> absl::StatusOr<T> {
      if (!v.ok()) return v.status();
      return ValueTraits<T>::From(*v);
    });
  }
  absl::StatusOr<T> ToHere(absl::Duration timeout = absl::ZeroDuration()) const {
    // Converted on this thread: a handler blocking a pool thread here needs no other.
    absl::StatusOr<Value> v = state_->Fetch(CallOptions{timeout}).Get(state_->WaitBudget(timeout));
    if (!v.ok()) return v.status();
    return ValueTraits<T>::From(*v);
  }
  // REQUIRES: IsOwner() (else FAILED_PRECONDITION).
  absl::StatusOr<T> LocalValue() const {
    absl::StatusOr<Value> v = state_->LocalValue();
    if (!v.ok()) return v.status();
    return ValueTraits<T>::From(*v);
  }

  // Runs the registered function `method` on the owner as method(value, args...).
  template <typename R, typename... Args>
  Future<R> Async(const std::string& method, Args&&... args) const {
    CallOptions options;
    ValueList values;
    (internal::AddArg(&values, &options, std::forward<Args>(args)), ...);
    const std::string owner = Owner();
    return state_->Call(method, std::move(values), options)
        .Then([owner, method](const absl::StatusOr<Value>& v) {
          return internal::ConvertResult<R>(v, owner, method);
        });
  }
  template <typename R, typename... Args>
  absl::StatusOr<R> Sync(const std::string& method, Args&&... args) const {
    CallOptions options;
    ValueList values;
    (internal::AddArg(&values, &options, std::forward<Args>(args)), ...);
    Future<Value> result = state_->Call(method, std::move(values), options);
    return internal::ConvertResult<R>(result.Get(state_->WaitBudget(options.timeout)), Owner(), method);
  }
  // Sends method message M (message.h) to the owner, where the handler registered with
  // Agent::HandleMethod<T, M> runs with the owned value.
  template <ProtocolMessage M>
  Future<typename M::Reply> Send(M message, CallOptions options = {}) const {
    Value fields = ValueTraits<M>::To(std::move(message));
    const std::string owner = Owner();
    return Map<typename M::Reply>(state_->Call(M::kFunction, std::move(std::get<ValueList>(fields.storage())), options),
                                  [owner](const absl::StatusOr<Value>& v) {
                                    return internal::ConvertResult<typename M::Reply>(v, owner, M::kFunction);
                                  });
  }

  // Like Async, but the result stays on the owner: an RRef to it.
  template <typename R, typename... Args>
  RRef<R> Remote(const std::string& method, Args&&... args) const {
    CallOptions options;
    ValueList values;
    (internal::AddArg(&values, &options, std::forward<Args>(args)), ...);
    return RRef<R>(state_->Remote(method, std::move(values), options, internal::TypeName<R>()));
  }

  const std::shared_ptr<internal::RRefState>& state() const { return state_; }

 private:
  std::shared_ptr<internal::RRefState> state_;
};

template <typename T>
struct ValueTraits<RRef<T>> {
  static constexpr const char* kName = "rref";
  static Value To(RRef<T> r) { return Value(r.state()); }
  static absl::StatusOr<RRef<T>> From(const Value& v) {
    if (!v.is<RRefPtr>() || !v.get<RRefPtr>()) return KindMismatch(kName, v);
    const RRefPtr& s = v.get<RRefPtr>();
    if (s->descriptor().type != internal::TypeName<T>()) {
      return absl::InvalidArgumentError(absl::StrCat("expected an RRef of ", internal::TypeName<T>(),
                                                     ", got an RRef of ", s->descriptor().type));
    }
    return RRef<T>(s);
  }
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_RREF_H_
