// README "Pipeline parallelism": two RemoteModule stages, 8 micro-batches a batch.
// [START include]
#include <gradwire/parallel/pipeline.h>
// [END include]

#include <memory>

#include <gradwire/dist_autograd/distributed_optimizer.h>
#include <gradwire/nn/loss.h>

namespace snippets::pipeline {

double Example(std::shared_ptr<gw::dist_autograd::DistAutograd> engine, gw::dist_nn::RemoteModule stage0,
               gw::dist_nn::RemoteModule stage1, std::unique_ptr<gw::dist_autograd::DistributedOptimizer>& optimizer,
               const gw::Tensor& x, const gw::Tensor& y) {
// [START body]

// On the driver: two stages that live on other workers, 8 micro-batches a batch.
gw::parallel::Pipeline pipe({stage0, stage1}, {.chunks = 8, .schedule = gw::parallel::Schedule::kGPipe});
gw::dist_autograd::Context ctx(*engine);
double loss = *pipe.ForwardBackward(ctx, x, y, [](auto& out, auto& y) { return gw::nn::CrossEntropyLoss(out, y); });
absl::Status stepped = optimizer->Step(ctx);         // DistributedOptimizer over both stages' parameters
// [END body]
  return stepped.ok() ? loss : -1;
}

}  // namespace snippets::pipeline
