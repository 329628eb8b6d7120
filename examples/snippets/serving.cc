// README "Serving models": replicas with dynamic batching, a router, the gRPC endpoint,
// and a served model that follows a parameter-server job.
// [START include]
#include <gradwire/serve/router.h>   // also brings serving.h
// [END include]

#include <memory>
#include <string>
#include <vector>

#include <gradwire/nn/layers.h>
#include <gradwire/param_server/client.h>
// [START endpoint_include]
#include <gradwire/serve/inference_endpoint.h>
// [END endpoint_include]
// [START follower_include]
#include <gradwire/serve/follower.h>
// [END follower_include]

namespace snippets::serving {

std::shared_ptr<gw::nn::Module> MakeMlp() {
  gw::Generator gen(0);
  return std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{
      std::make_shared<gw::nn::Linear>(784, 256, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(256, 10, gen)});
}

void Example(const gw::rpc::AgentOptions& options, std::shared_ptr<gw::nn::Module> model, const gw::Tensor& sample) {
// [START body]

// On every worker that serves or routes, in the agent's setup:
std::shared_ptr<gw::serve::Serving> serving;
auto agent = gw::rpc::Agent::Start(options, [&](gw::rpc::Agent& a) -> absl::Status {
  auto s = gw::serve::Serving::Install(a);
  if (s.ok()) serving = *s;
  return s.status();
});

// A replica: requests [rows, 784] are batched dynamically (a batch starts the moment the
// model is free, up to 64 rows; a bounded queue answers RESOURCE_EXHAUSTED when full).
absl::Status served = serving->Serve({.name = "mnist", .input_shape = {784},
                                      .batching = {.max_batch_size = 64, .max_queue = 1024},
                                      .factory = [] { return MakeMlp(); }},   // for LoadVersion
                                     model, "v1");
served.Update(serving->LoadVersion("mnist", "mnist_v2.gwtf", "v2"));  // atomic: no request sees half of each
served.Update(serving->Stop("mnist"));                               // withdraw, answer what is queued

// A client, on any worker of the job: least outstanding requests, failover to another
// replica when one dies, drains or is full; every request answered or failed.
gw::serve::Router router = *gw::serve::Router::Create(serving, "mnist");
absl::StatusOr<gw::serve::Prediction> p = router.PredictSync(sample);   // p->output, p->version, p->replica
gw::Future<gw::serve::Prediction> f = router.Predict(sample, absl::Milliseconds(50));  // with a deadline
// [END body]
}

void Endpoint(std::shared_ptr<gw::serve::Serving> serving, const gw::Tensor& sample) {
// [START endpoint]
auto endpoint = *gw::serve::InferenceEndpoint::Start(serving, "0.0.0.0", 8500);  // on any worker
// anywhere else:
auto client = *gw::serve::InferenceClient::Connect("10.0.0.1:8500");
absl::StatusOr<gw::serve::Prediction> p = client->Predict("mnist", sample);
// [END endpoint]
}

void Follow(std::shared_ptr<gw::serve::Serving> serving) {
// [START follower]
auto follower = *gw::serve::Follower::Start(serving, "mnist",
    {.servers = {"worker0", "worker1"}, .every_steps = 100});    // or .every = absl::Seconds(5)
std::string line = follower->Status().ToString();  // "serving step-4200, 37 updates behind, 0.4 s old, 42 refreshes, 0 failed"
absl::Status s = gw::serve::ServeCheckpoint(*serving, "mnist", "ckpt", "ckpt-7");  // its newest complete version
// [END follower]
}

}  // namespace snippets::serving
