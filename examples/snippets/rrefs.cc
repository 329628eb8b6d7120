// README "Remote references and remote modules".
// [START include]
#include <gradwire/dist_nn/remote_module.h>   // also brings rref.h
// [END include]

#include <cstdint>
#include <memory>

#include <gradwire/nn/layers.h>

namespace snippets::rrefs {

std::shared_ptr<gw::nn::Module> Mlp(int64_t hidden) {
  gw::Generator gen(0);
  return std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{
      std::make_shared<gw::nn::Linear>(784, hidden, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(hidden, 10, gen)});
}

// What the README's comment says worker1 runs in the `setup` of Agent::Start.
absl::Status Setup(gw::rpc::Agent& self) {
  return gw::dist_nn::RegisterModuleFactory(self, "mlp", [](int64_t hidden) { return Mlp(hidden); });
}

void Example(absl::StatusOr<std::shared_ptr<gw::rpc::Agent>>& agent, const gw::Tensor& x) {
// [START body]

// The result of "make_table" stays on ps0; r refers to it from here.
gw::rpc::RRef<gw::Tensor> r = (*agent)->Remote<gw::Tensor>("ps0", "make_table", int64_t{1} << 20);
absl::StatusOr<gw::Tensor> copy = r.ToHere();                   // a copy, here
absl::StatusOr<double> norm = r.Sync<double>("norm");            // runs norm(table) on ps0
gw::rpc::RRef<gw::Tensor> mine = (*agent)->Own(gw::Tensor::Zeros({4}));  // owned here

// RRefs are values: pass them to any worker, return them from any function.
absl::StatusOr<bool> kept = (*agent)->Sync<bool>("worker2", "keep", r);

// A module that lives on worker1; its factory is registered there by name, in the
// `setup` of Agent::Start:
//   gw::dist_nn::RegisterModuleFactory(self, "mlp", [](int64_t hidden) { return Mlp(hidden); });
auto stage = gw::dist_nn::RemoteModule::Create(**agent, "worker1", "mlp", int64_t{256});
absl::StatusOr<gw::Tensor> y = stage->Forward(x);            // many clients may call it
auto params = stage->RemoteParameters();                     // RRefs of its parameters
// [END body]
}

}  // namespace snippets::rrefs
