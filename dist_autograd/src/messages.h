// Internal: the messages of distributed autograd (the algorithm is at the top of
// dist_autograd/include/gradwire/dist_autograd/dist_autograd.h; this file is its
// vocabulary). Each is a record (rpc/message.h) that the sender and receiver share.
#ifndef GRADWIRE_DIST_AUTOGRAD_SRC_MESSAGES_H_
#define GRADWIRE_DIST_AUTOGRAD_SRC_MESSAGES_H_

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/optim/functional.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/tensor/tensor.h"

namespace gw::dist_autograd::internal {

using rpc::Ack;
using rpc::Field;
using rpc::GlobalId;

// Rides along every request and reply made inside a context (the CallHooks meta). The
// context's creator is context.rank().
struct AutogradMeta {
  GlobalId context;
  GlobalId send;                    // the message's SendFunction on the sender; null: no tensor requires grad
  std::vector<int64_t> with_grad;   // positions, in payload order, of the tensors it covers
  static constexpr auto Fields() {
    return std::make_tuple(Field("context", &AutogradMeta::context), Field("send", &AutogradMeta::send),
                           Field("with_grad", &AutogradMeta::with_grad));
  }
};

// A RecvFunction ran: the gradients of its message's tensors go to the matching
// SendFunction on the sender (FAST: zeros for those that got none; SMART: none).
// Answered once the deliveries this one caused were answered and the receiver is quiet.
struct GradMessage {
  static constexpr char kFunction[] = "__dist.grad";
  using Reply = Ack;
  GlobalId context;
  int64_t pass = 0;
  Mode mode = Mode::kSmart;
  bool retain_graph = false;
  GlobalId send;
  std::vector<std::optional<Tensor>> grads;  // one per tensor the send covers
  int64_t budget_ms = 0;                     // the pass's time left
  static constexpr auto Fields() {
    return std::make_tuple(Field("context", &GradMessage::context), Field("pass", &GradMessage::pass),
                           Field("mode", &GradMessage::mode), Field("retain_graph", &GradMessage::retain_graph),
                           Field("send", &GradMessage::send), Field("grads", &GradMessage::grads),
                           Field("budget_ms", &GradMessage::budget_ms));
  }
};

// SMART mode's reachability pass: these sends will receive a gradient; walk on from them.
struct DiscoverMessage {
  static constexpr char kFunction[] = "__dist.discover";
  using Reply = Ack;
  GlobalId context;
  int64_t pass = 0;
  bool retain_graph = false;
  std::vector<GlobalId> sends;
  int64_t budget_ms = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("context", &DiscoverMessage::context), Field("pass", &DiscoverMessage::pass),
                           Field("retain_graph", &DiscoverMessage::retain_graph), Field("sends", &DiscoverMessage::sends),
                           Field("budget_ms", &DiscoverMessage::budget_ms));
  }
};

// The context is released: forget it, and tell the peers it touched.
struct ReleaseMessage {
  static constexpr char kFunction[] = "__dist.release";
  using Reply = Ack;
  GlobalId context;
  // Why, when a worker the context reached is gone (its peers end it with this reason);
  // empty for the creator's release.
  std::string gone;
  static constexpr auto Fields() {
    return std::make_tuple(Field("context", &ReleaseMessage::context), Field("gone", &ReleaseMessage::gone));
  }
};

// DistributedOptimizer -> an owner of some of its parameters: keep optimizer state for them.
struct OptimizerRegister {
  static constexpr char kFunction[] = "__dist.opt_register";
  using Reply = Ack;
  GlobalId optimizer;
  optim::OptimizerConfig config;
  std::vector<rpc::RRef<Tensor>> params;
  static constexpr auto Fields() {
    return std::make_tuple(Field("optimizer", &OptimizerRegister::optimizer), Field("config", &OptimizerRegister::config),
                           Field("params", &OptimizerRegister::params));
  }
};

// Apply the optimizer to this owner's gradients of `context`.
struct OptimizerStep {
  static constexpr char kFunction[] = "__dist.opt_step";
  using Reply = Ack;
  GlobalId optimizer;
  GlobalId context;
  static constexpr auto Fields() {
    return std::make_tuple(Field("optimizer", &OptimizerStep::optimizer), Field("context", &OptimizerStep::context));
  }
};

// The optimizer is gone: drop its state.
struct OptimizerDrop {
  static constexpr char kFunction[] = "__dist.opt_drop";
  using Reply = Ack;
  GlobalId optimizer;
  static constexpr auto Fields() { return std::make_tuple(Field("optimizer", &OptimizerDrop::optimizer)); }
};

}  // namespace gw::dist_autograd::internal

#endif  // GRADWIRE_DIST_AUTOGRAD_SRC_MESSAGES_H_
