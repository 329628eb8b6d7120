// CallHooks: how a layer above rpc (distributed autograd) follows every call.
//
// Contract
//   - Agent::SetCallHooks installs one CallHooks, before calls are made (in Start's
//     setup). The agent keeps it alive.
//   - Every request and reply passes through the hooks on both sides, in this order:
//       caller OnSendRequest -> callee OnReceiveRequest -> the handler runs inside
//       RunInScope(scope) -> callee OnSendReply(scope) -> caller OnReceiveReply.
//     Work a handler defers to the pool (RRef creations) also runs inside its scope.
//   - Hooks may replace tensors in the payload (keeping its structure) and fill `meta`,
//     which travels with the message and is handed to the other side's hook. `from`/`to`
//     are ranks.
//   - A hook's error fails the call on the caller's side, or answers it with that error
//     on the callee's side. Hooks run on the calling thread or a transport I/O thread:
//     they must be quick and must not block.
#ifndef GRADWIRE_RPC_CALL_HOOKS_H_
#define GRADWIRE_RPC_CALL_HOOKS_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "gradwire/rpc/value.h"

namespace gw::rpc {

class CallHooks {
 public:
  // What the callee keeps for one request: current while its handler runs, and handed
  // to OnSendReply. Null: nothing to keep.
  using Scope = std::shared_ptr<void>;

  virtual ~CallHooks() = default;
  virtual absl::Status OnSendRequest(int to, Value& payload, Value& meta) = 0;
  virtual absl::StatusOr<Scope> OnReceiveRequest(int from, Value& payload, const Value& meta) = 0;
  // Runs fn with `scope` current on this thread (calls fn directly when scope is null).
  virtual void RunInScope(const Scope& scope, const std::function<void()>& fn) = 0;
  // The scope current on this thread (null if none).
  virtual Scope CurrentScope() = 0;
  virtual absl::Status OnSendReply(int to, const Scope& scope, Value& payload, Value& meta) = 0;
  virtual absl::Status OnReceiveReply(int from, Value& payload, const Value& meta) = 0;
  // The worker of rank `rank` closed or reset its connections (it is gone).
  virtual void OnPeerGone(int rank) { (void)rank; }
};

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_CALL_HOOKS_H_
