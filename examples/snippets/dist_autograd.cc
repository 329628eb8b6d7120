// README "Distributed autograd": a forward pass over two remote stages, a distributed
// backward pass and a DistributedOptimizer step, in one context.
// [START include]
#include <gradwire/dist_autograd/distributed_optimizer.h>
#include <gradwire/dist_nn/remote_module.h>
#include <gradwire/nn/loss.h>
// [END include]

#include <memory>
#include <vector>

namespace snippets::dist_autograd {

void Example(absl::StatusOr<std::shared_ptr<gw::rpc::Agent>>& agent,
             std::shared_ptr<gw::dist_autograd::DistAutograd>& engine, const gw::dist_nn::RemoteModule& stage1,
             const gw::dist_nn::RemoteModule& stage2, std::vector<gw::rpc::RRef<gw::Tensor>> params,
             const gw::Tensor& x, const gw::Tensor& y) {
// [START body]

// In setup:  return gw::rpc::Assign(gw::dist_autograd::DistAutograd::Install(self), engine);
// stage1, stage2: RemoteModules on two workers; params: their RemoteParameters().
auto opt = gw::dist_autograd::DistributedOptimizer::Create(**agent, gw::optim::Sgd{.lr = 0.01}, params);
{
  gw::dist_autograd::Context ctx(*engine);                  // current on this thread
  gw::Tensor hidden = *stage1.Forward(x);                   // on stage1's worker
  gw::Tensor logits = *stage2.Forward(hidden);              // on stage2's worker
  absl::Status s = ctx.Backward({gw::nn::CrossEntropyLoss(logits, y)});
  s.Update((*opt)->Step(ctx));                              // updates run on the owners
}                                                           // released on every worker
// [END body]
}

}  // namespace snippets::dist_autograd
