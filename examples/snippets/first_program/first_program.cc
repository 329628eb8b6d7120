// A first gradwire program: an MLP trained for a few steps on random data, then saved.
#include <gradwire/gradwire.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

int main() {
  gw::Generator gen(/*seed=*/0);                     // no hidden global RNG
  auto mlp = std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{
      std::make_shared<gw::nn::Linear>(784, 256, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(256, 10, gen)});
  gw::optim::Optimizer opt(mlp->Parameters(), gw::optim::Sgd{.lr = 0.05, .momentum = 0.9});

  gw::Tensor x = gw::Tensor::Randn({64, 784}, gen);  // a batch of 64 inputs
  std::vector<int64_t> labels(64);
  for (int64_t i = 0; i < 64; ++i) labels[i] = i % 10;
  gw::Tensor y = gw::Tensor::FromVector<int64_t>(labels);
  for (int step = 0; step < 20; ++step) {
    gw::Tensor loss = gw::nn::CrossEntropyLoss(mlp->Forward(x), y);
    opt.ZeroGrad();
    gw::autograd::Backward({loss});
    opt.Step();
    if (step % 5 == 0) std::printf("step %d: loss %.4f\n", step, loss.item<float>());
  }
  absl::Status saved = mlp->Save("mlp.gwtf");
  if (!saved.ok()) {
    std::fprintf(stderr, "%s\n", saved.ToString().c_str());
    return 1;
  }
  return 0;
}
