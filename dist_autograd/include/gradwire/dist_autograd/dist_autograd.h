// Distributed autograd: backward passes that follow the forward pass across workers.
//
// Contract
//   - DistAutograd::Install(agent), in Agent::Start's setup, attaches the engine to an
//     agent (its CallHooks and its protocol messages). One engine per agent; an error
//     (e.g. installed twice) comes back as the StatusOr's status.
//   - Context ctx(engine) opens a context on the creating worker; its id is a GlobalId
//     (rpc/global_id.h) whose rank is the creator's. While ctx is alive it is current on
//     the thread that made it; many contexts may be live at once (on different threads,
//     or made current with Context::Scope), and their gradients never mix.
//   - Recording needs no user code: inside a context, every message (request or reply)
//     that carries tensors requiring grad (arguments, results, ToHere of an RRef,
//     RemoteModule inputs and outputs) gets one SendFunction on the sender, whose inputs
//     are those tensors, and one RecvFunction on the receiver, whose outputs they become,
//     keyed by (context, message key): PyTorch's SendRpcBackward/RecvRpcBackward. A
//     handler runs with the caller's context current, so calls it makes join the same
//     context. Tensors sent outside a context carry no history; nor do messages sent with
//     gradient recording off (NoGradGuard, and code that runs inside a backward pass:
//     gradient hooks such as a parameter-server push, backward functions), whose handlers
//     run outside the context.
//   - ctx.Backward(roots, options) blocks until the distributed pass is done or failed.
//     A failure anywhere (a backward function's error, a dead peer, the deadline) is
//     returned as a Status naming the worker where it happened; the failure model is
//     agent.h's (CANCELLED once this agent shuts down, UNAVAILABLE naming a dead peer,
//     DEADLINE_EXCEEDED). Leaf gradients accumulate in the context on each worker
//     (never in .grad()); GetGradients() returns this worker's. retain_graph allows
//     another pass.
//   - Releasing a context (~Context) cleans it up on every worker it touched, bounded by a
//     timeout, also when a peer died; contexts whose creator died are reclaimed.
//   - Thread-safe.
//
// The algorithm
//   Each worker keeps, per context, the SendFunctions and RecvFunctions recorded there.
//   A RecvFunction has no local next edges: running it sends the gradients of its
//   message's tensors to the SendFunction with the same key on the sender (GradMessage),
//   whose engine delivers them there (GraphTask::AddInput) and runs what became ready.
//   FAST mode (exactly PyTorch's): every worker computes dependencies from the roots
//     (creator) plus every SendFunction recorded in the context, assuming each will
//     receive gradients. A RecvFunction runs once the gradients of its outputs that the
//     loss reaches have arrived, and sends zeros for the others, so a reply carrying
//     several tensors of which only some reach the loss does not make the pass wait. A
//     message none of whose tensors reaches the loss never gets gradients, so the nodes
//     behind its send wait forever: the pass ends with DEADLINE_EXCEEDED, saying how many
//     nodes on which worker still wait.
//   SMART mode (default): first a distributed reachability pass. The creator walks its
//     graph from the roots; each RecvFunction it reaches names a SendFunction on a peer,
//     which is asked to walk on from there (DiscoverMessage, recursively, each send
//     visited once per pass, so cycles w0 -> w1 -> w0 terminate). Each worker then knows
//     exactly which of its sends will receive gradients, and computes dependencies from
//     the roots plus those sends only. Every counted input then arrives, so the pass
//     never waits for a gradient that cannot come, gradients behind an unused send are
//     not lost, and a tensor whose gradient is not needed gets none (not zeros), as in a
//     local backward pass.
//   Completion: a GradMessage is answered once its worker is quiescent for the context
//   (no node holding input while waiting, no gradient it sent still unanswered), so the
//   creator's Backward returns when the whole tree of deliveries has finished. Every pass
//   has a deadline (options.timeout) in both modes.
//   Messages (dist_autograd/src/messages.h): AutogradMeta (the annotation of every
//   message in a context), GradMessage, DiscoverMessage, ReleaseMessage, and for
//   DistributedOptimizer OptimizerRegister, OptimizerStep, OptimizerDrop.
#ifndef GRADWIRE_DIST_AUTOGRAD_DIST_AUTOGRAD_H_
#define GRADWIRE_DIST_AUTOGRAD_DIST_AUTOGRAD_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/tensor/tensor.h"

namespace gw::dist_autograd {

enum class Mode { kSmart, kFast };

struct BackwardOptions {
  Mode mode = Mode::kSmart;
  bool retain_graph = false;
  absl::Duration timeout = absl::Seconds(60);
};

class ContextState;  // internal

// The engine of one agent.
class DistAutograd {
 public:
  // REQUIRES: called in Agent::Start's setup.
  static absl::StatusOr<std::shared_ptr<DistAutograd>> Install(rpc::Agent& agent);
  ~DistAutograd();

  // Contexts known on this worker (created here or joined by a call).
  size_t live_contexts() const;
  // Waits until `until(live_contexts())` holds (re-checked whenever contexts come or go)
  // or the deadline passes; returns whether it holds.
  bool AwaitContexts(const std::function<bool(size_t live)>& until, absl::Time deadline) const;
  // The leaf gradients this worker holds for a context (created here or elsewhere), e.g.
  // for an optimizer step on the parameters it owns.
  std::vector<std::pair<Tensor, Tensor>> GradientsOf(rpc::GlobalId context_id) const;
  Tensor GradOf(rpc::GlobalId context_id, const Tensor& leaf) const;

  class Impl;

 private:
  friend class Context;
  explicit DistAutograd(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

class Context {
 public:
  explicit Context(DistAutograd& engine);
  ~Context();  // releases the context on every worker it touched
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  rpc::GlobalId id() const;
  absl::Status Backward(const std::vector<Tensor>& roots, BackwardOptions options = {});
  // This worker's accumulated leaf gradients: (leaf, gradient) pairs.
  std::vector<std::pair<Tensor, Tensor>> GetGradients() const;
  // The gradient of one leaf (undefined if none reached it).
  Tensor GradOf(const Tensor& leaf) const;

  // Makes the context current on this thread for the scope's lifetime (for work done
  // on other threads than the one that created it).
  class Scope {
   public:
    explicit Scope(const Context& ctx);
    ~Scope();

   private:
    std::shared_ptr<ContextState> previous_;
  };

 private:
  DistAutograd& engine_;
  std::shared_ptr<ContextState> state_;
  std::shared_ptr<ContextState> previous_;
};

}  // namespace gw::dist_autograd

#endif  // GRADWIRE_DIST_AUTOGRAD_DIST_AUTOGRAD_H_
