// Internal: the message a pipeline's driver sends to each of its stages to keep the
// replicas of a stage equal (DDP of pipelines, parallel/pipeline.h). It runs on the
// stage's worker with the stage module as its value (Agent::HandleMethod, RRef::Send).
#ifndef GRADWIRE_PARALLEL_SRC_STAGE_MESSAGES_H_
#define GRADWIRE_PARALLEL_SRC_STAGE_MESSAGES_H_

#include <cstdint>
#include <tuple>
#include <vector>

#include "gradwire/rpc/global_id.h"
#include "gradwire/rpc/message.h"

namespace gw::parallel::internal {

// Stage `stage`'s replicas are the modules on `ranks` (one per replica, the same list in
// every replica). kAverageGradients: average the gradients of the module's parameters in
// distributed-autograd context `context` over the replicas; kBroadcastParameters: copy
// the first replica's parameters into every other.
struct StageSync {
  static constexpr char kFunction[] = "__parallel.stage_sync";
  using Reply = rpc::Ack;
  enum Kind : int64_t { kAverageGradients = 0, kBroadcastParameters = 1 };
  int64_t kind = kAverageGradients;
  int64_t stage = 0;
  std::vector<int64_t> ranks;
  rpc::GlobalId context;  // kAverageGradients only
  static constexpr auto Fields() {
    return std::make_tuple(rpc::Field("kind", &StageSync::kind), rpc::Field("stage", &StageSync::stage),
                           rpc::Field("ranks", &StageSync::ranks), rpc::Field("context", &StageSync::context));
  }
};

}  // namespace gw::parallel::internal

#endif  // GRADWIRE_PARALLEL_SRC_STAGE_MESSAGES_H_
