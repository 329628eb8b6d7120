// DistributedOptimizer: applies a context's gradients to parameters where they live.
//
// Contract
//   - DistributedOptimizer::Create(agent, config, params) takes a functional optimizer of
//     optim/ (Sgd, Adam, AdamW, Adagrad) and RRefs of parameter tensors on any workers
//     (RemoteModule::RemoteParameters, Agent::Own). Each owner keeps its parameters'
//     optimizer state under this optimizer's id, for the optimizer's lifetime.
//   - Step(ctx) asks every owner, concurrently, to apply the update to the gradients its
//     worker holds for that context (DistAutograd::GradOf) and returns when all are done,
//     or the first error, which names the owner. A parameter that received no gradient in
//     the context is left unchanged (as torch.optim skips a grad of None).
//   - Each parameter is updated under its own lock on the owner: trainers stepping the
//     same parameters concurrently never interleave within one update.
//   - The owners' workers must have installed DistAutograd (DistAutograd::Install).
//   - Destroying the optimizer drops its state on the owners (best effort).
#ifndef GRADWIRE_DIST_AUTOGRAD_DISTRIBUTED_OPTIMIZER_H_
#define GRADWIRE_DIST_AUTOGRAD_DISTRIBUTED_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/optim/functional.h"
#include "gradwire/rpc/agent.h"

namespace gw::dist_autograd {

class DistributedOptimizer {
 public:
  static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(rpc::Agent& agent,
                                                                      optim::OptimizerConfig config,
                                                                      std::vector<rpc::RRef<Tensor>> params);
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  absl::Status Step(const Context& ctx) { return Step(ctx.id()); }
  absl::Status Step(rpc::GlobalId context_id);

 private:
  DistributedOptimizer(rpc::Agent& agent, rpc::GlobalId id, std::vector<std::string> owners)
      : agent_(agent), id_(id), owners_(std::move(owners)) {}

  rpc::Agent& agent_;
  const rpc::GlobalId id_;
  const std::vector<std::string> owners_;
};

}  // namespace gw::dist_autograd

#endif  // GRADWIRE_DIST_AUTOGRAD_DISTRIBUTED_OPTIMIZER_H_
