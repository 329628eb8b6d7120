// Trains y = 2x + 1 with an installed gradwire; exits non-zero if it does not converge.
#include <cstdio>

#include "gradwire/gradwire.h"

int main() {
  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::Linear>(1, 1, gen);
  gw::optim::Optimizer opt(model->Parameters(), gw::optim::Sgd{.lr = 0.1});
  gw::Tensor x = gw::Tensor::Randn({64, 1}, gen);
  gw::Tensor y = x * 2.0 + 1.0;
  double loss = 0;
  for (int i = 0; i < 200; ++i) {
    opt.ZeroGrad();
    gw::Tensor l = gw::nn::MseLoss(model->Forward(x), y);
    gw::autograd::Backward({l});
    opt.Step();
    loss = l.item();
  }
  // The RPC layer is part of the package too: a one-worker group calls itself.
  gw::rpc::AgentOptions options;
  options.rendezvous = "127.0.0.1:0";
  auto agent = gw::rpc::Agent::Start(options);
  if (!agent.ok()) return 1;
  (void)(*agent)->Register("square", [](double v) { return v * v; });
  absl::StatusOr<double> nine = (*agent)->Sync<double>("worker0", "square", 3.0);
  const bool rpc_ok = nine.ok() && *nine == 9.0 && (*agent)->Shutdown().ok();
  std::printf("consumer: find_package(gradwire) works, final loss %.2e, rpc %s\n", loss,
              rpc_ok ? "ok" : "FAILED");
  return loss < 1e-6 && rpc_ok ? 0 : 1;
}
