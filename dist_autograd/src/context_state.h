// Internal: what one worker knows of one distributed-autograd context, and the
// send/recv nodes that connect its graph to other workers' (see dist_autograd.h).
#ifndef GRADWIRE_DIST_AUTOGRAD_SRC_CONTEXT_STATE_H_
#define GRADWIRE_DIST_AUTOGRAD_SRC_CONTEXT_STATE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/node.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/future.h"
#include "gradwire/rpc/value.h"

namespace gw::dist_autograd {

class ContextState;

// On the sender of a tensor: receives its gradient from the peer and passes it on to
// the tensor's own gradient edge.
class SendFunction final : public autograd::Node {
 public:
  explicit SendFunction(const Tensor& sent) {
    AddInputMeta(sent);
    add_next_edge(autograd::GradientEdge(sent));
  }
  std::string name() const override { return "SendFunction"; }
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override { return {std::move(grads[0])}; }
};

// On the receiver: running it queues the gradient (or "none") for the sender.
class RecvFunction final : public autograd::Node {
 public:
  // Its one input is declared by SetHistory(received, recv).
  RecvFunction(std::weak_ptr<ContextState> ctx, int sender, uint64_t key)
      : ctx_(std::move(ctx)), sender_(sender), key_(key) {}
  std::string name() const override { return "RecvFunction"; }
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override;
  bool RunsWithoutGradient() const override { return true; }
  int sender() const { return sender_; }
  uint64_t key() const { return key_; }

 private:
  std::weak_ptr<ContextState> ctx_;
  const int sender_;
  const uint64_t key_;
};

// Leaf gradients of a context on this worker, summed over passes.
class GradientStore final : public autograd::GradSink {
 public:
  void Accumulate(const Tensor& leaf, Tensor grad) override;
  std::vector<std::pair<Tensor, Tensor>> All() const;
  Tensor Of(const Tensor& leaf) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<const void*, std::pair<Tensor, Tensor>> grads_ ABSL_GUARDED_BY(mu_);
};

struct OutgoingGradient {
  int to;
  uint64_t key;
  Tensor grad;  // undefined: "no gradient"
};

class ContextState {
 public:
  ContextState(uint64_t id, int creator) : id(id), creator(creator) {}

  const uint64_t id;
  const int creator;
  GradientStore gradients;

  absl::Mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<SendFunction>> sends ABSL_GUARDED_BY(mu);
  std::set<int> peers ABSL_GUARDED_BY(mu);  // workers this context exchanged messages with

  // The current backward pass on this worker.
  uint64_t pass ABSL_GUARDED_BY(mu) = 0;
  Mode mode ABSL_GUARDED_BY(mu) = Mode::kSmart;
  bool retain_graph ABSL_GUARDED_BY(mu) = false;
  std::unique_ptr<autograd::GraphTask> task ABSL_GUARDED_BY(mu);
  bool dependencies_ready ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_set<uint64_t> reachable_sends ABSL_GUARDED_BY(mu);  // SMART
  std::vector<autograd::Edge> local_roots ABSL_GUARDED_BY(mu);        // the creator's roots
  absl::Status error ABSL_GUARDED_BY(mu);
  // One per gradient delivery (and the creator's Backward): answered once the gradients
  // its run sent out were answered and no node here holds input while waiting.
  struct Waiter {
    explicit Waiter(rpc::Executor& ex) : done(ex) {}
    Promise<rpc::Value> done;
    bool sent_answered = false;
  };
  std::vector<std::shared_ptr<Waiter>> waiters ABSL_GUARDED_BY(mu);
  std::vector<OutgoingGradient> outbox ABSL_GUARDED_BY(mu);  // filled by RecvFunction::Apply
};

}  // namespace gw::dist_autograd

#endif  // GRADWIRE_DIST_AUTOGRAD_SRC_CONTEXT_STATE_H_
