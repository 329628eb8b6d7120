// README "GPUs": DataParallel over this process's GPUs; on a machine without one, the
// model alone, so the same program runs there.
// [START include]
#include <gradwire/parallel/data_parallel.h>
// [END include]

#include <memory>

#include <gradwire/autograd/functions.h>
#include <gradwire/nn/layers.h>
#include <gradwire/tensor/cuda.h>

namespace snippets::data_parallel {

gw::Tensor Example(const gw::Tensor& x) {
  // The README shows the region below as it is.
  // clang-format off
// [START body]

auto make = [] {  // the model; DataParallel makes one replica per further GPU with it
  gw::Generator gen(0);
  return std::make_shared<gw::nn::Linear>(784, 10, gen);
};
const gw::Device device = gw::cuda::Available() ? gw::Cuda(0) : gw::kCPU;
std::shared_ptr<gw::nn::Module> model = make();
model->To(device);
auto dp = *gw::parallel::DataParallel::Create(model, make);  // every GPU, or the model alone
gw::Tensor out = dp->Forward(gw::To(x, device));  // the batch split over the GPUs, joined on the first
// backward: the replicas' gradients are summed into model's, as if it had run the batch alone
// [END body]
  // clang-format on
  return out;
}

}  // namespace snippets::data_parallel
