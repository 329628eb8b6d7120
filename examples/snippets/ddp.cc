// README "Data parallelism": DistributedDataParallel around a local model.
// [START include]
#include <gradwire/parallel/distributed_data_parallel.h>
// [END include]

#include <memory>

#include <gradwire/autograd/engine.h>
#include <gradwire/collectives/collectives.h>
#include <gradwire/nn/loss.h>
#include <gradwire/optim/optimizer.h>

namespace snippets::ddp {

void Example(std::shared_ptr<gw::nn::Module> model, std::shared_ptr<gw::collectives::Collectives> coll,
             const gw::Tensor& x, const gw::Tensor& y) {
// [START body]

// In every replica (e.g. `gradwire launch -n 2 ./my_program`), with the collectives installed:
auto ddp = *gw::parallel::DistributedDataParallel::Create(model, *coll->NewGroup());  // rank 0's parameters
gw::optim::Optimizer opt(ddp->Parameters(), gw::optim::Sgd{.lr = 0.05, .momentum = 0.9});
opt.ZeroGrad();
gw::autograd::Backward({gw::nn::CrossEntropyLoss(ddp->Forward(x), y)});  // gradients averaged meanwhile
opt.Step();                                          // every replica applies the same update
{ auto no_sync = ddp->NoSync(); /* backward passes that only accumulate */ }
// [END body]
}

}  // namespace snippets::ddp
