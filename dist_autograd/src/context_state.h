// Internal: what one worker knows of one distributed-autograd context, and the
// send/recv nodes that connect its graph to other workers' (see dist_autograd.h).
#ifndef GRADWIRE_DIST_AUTOGRAD_SRC_CONTEXT_STATE_H_
#define GRADWIRE_DIST_AUTOGRAD_SRC_CONTEXT_STATE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
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
#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/rpc/value.h"
#include "gradwire/tensor/kernels.h"

namespace gw::dist_autograd {

using rpc::GlobalId;
class ContextState;

// Where the send and recv functions record their runs: a slice each in the worker's trace
// (rpc/trace.h), in the context, naming the peer and how many tensors. The agent, whose
// tracer it is, outlives its contexts' functions.
struct FunctionTrace {
  rpc::Tracer* tracer = nullptr;  // null: not traced
  rpc::Tracer::Name category = 0, send = 0, recv = 0, peer = 0, tensors = 0;

  void Record(rpc::Tracer::Name name, int64_t begin_us, GlobalId context, int peer_rank, size_t count) const {
    tracer->Record({.category = category,
                    .name = name,
                    .begin_us = begin_us,
                    .end_us = tracer->Now(),
                    .arg_names = {peer, tensors},
                    .arg_values = {peer_rank, static_cast<int64_t>(count)},
                    .context = context.bits()});
  }
  bool on() const { return tracer != nullptr && tracer->enabled(); }
};

// On the sender of a message: its inputs are the message's tensors that require grad; it
// receives their gradients from the peer and passes each on to that tensor's own
// gradient edge (PyTorch's SendRpcBackward). A gradient arrives where the peer's device
// map put it (on the CPU without one): it moves to the device its tensor was sent from.
class SendFunction final : public autograd::Node {
 public:
  // `to`: the message's receiver, which sends the gradients back.
  SendFunction(const std::vector<Tensor>& sent, GlobalId context, int to, const FunctionTrace& trace)
      : context_(context), to_(to), trace_(trace) {
    for (const Tensor& t : sent) {
      AddInputMeta(t);
      add_next_edge(autograd::GradientEdge(t));
      devices_.push_back(t.device());
    }
  }
  std::string name() const override { return "SendFunction"; }
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override {
    const int64_t begin_us = trace_.on() ? trace_.tracer->Now() : 0;
    for (size_t i = 0; i < grads.size() && i < devices_.size(); ++i) {
      if (grads[i].defined() && grads[i].device() != devices_[i]) grads[i] = kernels::ToDevice(grads[i], devices_[i]);
    }
    if (begin_us != 0) trace_.Record(trace_.send, begin_us, context_, to_, grads.size());
    return std::move(grads);
  }

 private:
  std::vector<Device> devices_;
  const GlobalId context_;
  const int to_;
  const FunctionTrace trace_;
};

// On the receiver: its outputs are the message's tensors that require grad (declared by
// SetHistory(received, recv), in payload order); running it queues their gradients for
// the sender (PyTorch's RecvRpcBackward). In FAST mode an output that got no gradient
// sends zeros, as PyTorch does; in SMART mode, none.
class RecvFunction final : public autograd::Node {
 public:
  RecvFunction(std::weak_ptr<ContextState> ctx, int sender, GlobalId key, const FunctionTrace& trace)
      : ctx_(std::move(ctx)), sender_(sender), key_(key), trace_(trace) {}
  std::string name() const override { return "RecvFunction"; }
  std::vector<Tensor> Apply(std::vector<Tensor>&& grads) override;
  bool RunsWithoutGradient() const override { return true; }
  int sender() const { return sender_; }
  GlobalId key() const { return key_; }

 private:
  std::weak_ptr<ContextState> ctx_;
  const int sender_;
  const GlobalId key_;
  const FunctionTrace trace_;
};

// Leaf gradients of a context on this worker, summed over passes.
class GradientStore final : public autograd::GradSink {
 public:
  Tensor Accumulate(const Tensor& leaf, Tensor grad) override;
  std::vector<std::pair<Tensor, Tensor>> All() const;
  Tensor Of(const Tensor& leaf) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<const void*, std::pair<Tensor, Tensor>> grads_ ABSL_GUARDED_BY(mu_);
};

struct OutgoingGradients {
  int to;
  GlobalId key;
  std::vector<std::optional<Tensor>> grads;  // none: no gradient
};

class ContextState {
 public:
  explicit ContextState(GlobalId id) : id(id), creator(id.rank()) {}

  const GlobalId id;
  const int creator;
  GradientStore gradients;

  absl::Mutex mu;
  absl::flat_hash_map<GlobalId, std::shared_ptr<SendFunction>> sends ABSL_GUARDED_BY(mu);
  std::set<int> peers ABSL_GUARDED_BY(mu);  // workers this context exchanged messages with

  // The current backward pass on this worker.
  uint64_t pass ABSL_GUARDED_BY(mu) = 0;
  Mode mode ABSL_GUARDED_BY(mu) = Mode::kSmart;
  bool retain_graph ABSL_GUARDED_BY(mu) = false;
  std::unique_ptr<autograd::GraphTask> task ABSL_GUARDED_BY(mu);
  bool dependencies_ready ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_set<GlobalId> reachable_sends ABSL_GUARDED_BY(mu);  // SMART
  std::vector<autograd::Edge> local_roots ABSL_GUARDED_BY(mu);        // the creator's roots
  absl::Status error ABSL_GUARDED_BY(mu);
  // Set when the context was ended because a worker it reached is gone (UNAVAILABLE
  // naming it): its backward fails with it at once.
  absl::Status ended ABSL_GUARDED_BY(mu);
  // One per gradient delivery (and the creator's Backward): answered once the gradients
  // its run sent out were answered and no node here holds input while waiting.
  struct Waiter {
    explicit Waiter(rpc::Executor& ex) : done(ex) {}
    Promise<rpc::Ack> done;
    bool sent_answered = false;
  };
  std::vector<std::shared_ptr<Waiter>> waiters ABSL_GUARDED_BY(mu);
  std::vector<OutgoingGradients> outbox ABSL_GUARDED_BY(mu);  // filled by RecvFunction::Apply
  // For the waits (waits.h): when this worker's part of the pass began (read without the
  // lock, which a pass holds while it runs nodes here), and its gradient messages not
  // answered yet, by rank.
  std::atomic<int64_t> pass_started_ns{0};
  std::map<int, int> unanswered ABSL_GUARDED_BY(mu);
};

}  // namespace gw::dist_autograd

#endif  // GRADWIRE_DIST_AUTOGRAD_SRC_CONTEXT_STATE_H_
