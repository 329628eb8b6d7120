// Internal: the state of one RRef fork held by this process (RRefDescriptor, its wire
// form, and RRefState, which every RRef<T> copy of it shares). Split from rref.h so that
// the value and wire units (value.cc, codec.cc) name an RRef without the agent facade.
//
// Contract
//   - An RRefState is detached (no context) while in transit: between decoding a frame
//     and its adoption by the agent's RRef context (rpc/src/rref/rref_context.h), which
//     implements the methods below; a detached state answers only descriptor() and
//     attached().
//   - Thread-safe: the descriptor never changes; the methods go through the context.
#ifndef GRADWIRE_RPC_INTERNAL_RREF_STATE_H_
#define GRADWIRE_RPC_INTERNAL_RREF_STATE_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/worker.h"

namespace gw::rpc {
namespace internal {

class RRefContext;

// The wire form of one fork of an RRef.
struct RRefDescriptor {
  GlobalId rref_id;
  GlobalId fork_id;      // null for the owner's own handles
  int owner = -1;        // rank
  int parent = -1;       // rank that sent this fork
  GlobalId parent_fork;  // the sender's fork (null: the sender is the owner)
  std::string type;      // TypeName<T>() of the owned value
};

// One reference held by this process; shared by every RRef<T> copy of it. Detached
// (no context) while in transit, between decoding a frame and adoption by the agent.
class RRefState {
 public:
  explicit RRefState(RRefDescriptor d) : d_(std::move(d)) {}
  RRefState(std::shared_ptr<RRefContext> ctx, RRefDescriptor d, bool is_owner)
      : ctx_(std::move(ctx)), d_(std::move(d)), is_owner_(is_owner) {}
  ~RRefState();
  RRefState(const RRefState&) = delete;
  RRefState& operator=(const RRefState&) = delete;

  const RRefDescriptor& descriptor() const { return d_; }
  bool attached() const { return ctx_ != nullptr; }
  bool is_owner() const { return is_owner_; }
  std::string owner_name() const;
  bool confirmed() const;
  Future<Value> Fetch(CallOptions options) const;
  absl::StatusOr<Value> LocalValue() const;
  Future<Value> Call(const std::string& method, ValueList args, CallOptions options) const;
  std::shared_ptr<RRefState> Remote(const std::string& method, ValueList args, CallOptions options,
                                    std::string type) const;
  // How long to wait for a result asked with `timeout` (0: the agent's default).
  absl::Duration WaitBudget(absl::Duration timeout) const;

 private:
  const std::shared_ptr<RRefContext> ctx_;
  const RRefDescriptor d_;
  const bool is_owner_ = false;
};

}  // namespace internal

}  // namespace gw::rpc

#endif  // GRADWIRE_RPC_INTERNAL_RREF_STATE_H_
