// The umbrella header alone brings the whole public API: this file includes nothing
// else and names a type of every layer, so a header that gradwire.h left out fails to
// compile here. It is also the main() of the readme_snippets program, which links every
// README snippet (examples/snippets/*.cc) so that their calls must resolve.
#include <gradwire/gradwire.h>

namespace {

template <typename... T>
constexpr bool AllComplete() {
  return ((sizeof(T) > 0) && ...);
}

static_assert(AllComplete<
              // tensor/, autograd/, nn/, optim/, data/
              gw::Tensor, gw::Generator, gw::Storage, gw::cuda::Stream, gw::CachingDeviceAllocator,
              gw::autograd::GraphTask, gw::autograd::GradCheckResult, gw::nn::Sequential, gw::nn::EmbeddingBag,
              gw::optim::Optimizer, gw::optim::Adagrad, gw::data::DataLoader, gw::data::ProgressBar, gw::nn::Conv2d,
              gw::nn::MaxPool2d, gw::nn::BatchNorm2d, gw::nn::LSTM, gw::Conv2dArgs, gw::Pool2dArgs,
              gw::kernels::RnnLayerArgs, gw::kernels::NormGrads,
              // models/
              gw::models::TutorialCnn, gw::models::SmallResNet, gw::models::LstmClassifier, gw::models::SmallViT,
              gw::nn::MultiheadAttention, gw::nn::TransformerEncoder,
              // rpc/
              gw::rpc::Agent, gw::rpc::AgentOptions, gw::rpc::RRef<gw::Tensor>, gw::rpc::Security, gw::rpc::DeviceMap,
              gw::rpc::RetryPolicy, gw::rpc::TimerQueue, gw::rpc::Statistics, gw::rpc::Store, gw::rpc::FaultSpec,
              gw::Future<gw::Tensor>,
              // model parallelism, distributed autograd
              gw::dist_nn::RemoteModule, gw::dist_autograd::Context, gw::dist_autograd::DistributedOptimizer,
              // collectives, data parallelism, pipelines
              gw::collectives::ProcessGroup, gw::parallel::DistributedDataParallel, gw::parallel::Pipeline,
              gw::parallel::DataParallel,
              // parameter servers
              gw::param_server::ParameterServer, gw::param_server::Client, gw::param_server::Reader,
              gw::param_server::SparseEmbedding, gw::param_server::RowStore, gw::param_server::KeyRange,
              // serving
              gw::serve::Serving, gw::serve::Router, gw::serve::Batcher, gw::serve::Follower,
              gw::serve::InferenceEndpoint, gw::serve::InferenceClient, gw::serve::ModelStats, gw::serve::Prediction,
              // worker/
              gw::worker::LaunchOptions>());

}  // namespace

int main() { return 0; }
