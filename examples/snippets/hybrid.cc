// README "Hybrid jobs": DDP replicas of the dense layers with an embedding on the
// parameter servers, one distributed-autograd context a step.
// [START include]
#include <gradwire/param_server/sparse_embedding.h>
// [END include]

#include <memory>

#include <gradwire/dist_autograd/distributed_optimizer.h>
#include <gradwire/nn/loss.h>
#include <gradwire/parallel/distributed_data_parallel.h>

namespace snippets::hybrid {

absl::Status Example(gw::param_server::Client& ps_client, std::shared_ptr<gw::dist_autograd::DistAutograd> engine,
                     std::shared_ptr<gw::parallel::DistributedDataParallel> ddp,
                     std::unique_ptr<gw::dist_autograd::DistributedOptimizer>& dist_optimizer, const gw::Tensor& ids,
                     const gw::Tensor& offsets, const gw::Tensor& y) {
// [START body]

gw::param_server::SparseEmbedding embedding(ps_client, "pixels");  // a sparse table on the servers
gw::dist_autograd::Context ctx(*engine);
gw::Tensor bags = *embedding.LookupBag(ids, offsets, gw::nn::BagMode::kMean);  // pulls the batch's rows
gw::Tensor loss = gw::nn::CrossEntropyLoss(ddp->Forward(bags), y);               // dense part replicated
absl::Status s = ctx.Backward({loss});  // one backward: DDP allreduces, the rows' gradient is pushed to the servers
s.Update(dist_optimizer->Step(ctx));    // one step: the dense layers here; the servers apply the rows' update
s.Update(embedding.Step());             // waits for the push, next clock
// [END body]
  return s;
}

}  // namespace snippets::hybrid
