// Benchmark `local_mlp`: the model of W5 (BENCHMARKS.md) in one process.
// Linear 1024-1024-1024-1024-10 with ReLUs, batch 128, cross-entropy, SGD lr 0.01;
// one step = zero_grad + forward + backward + optimizer step. Also times the same GEMMs
// alone (the floor this step can reach) and reports the ratio.
//
//   local_mlp [--quick]
#include <cstring>

#include "bench_util.h"
#include "gradwire/gradwire.h"

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int warmup = quick ? 3 : 10, iters = quick ? 10 : 50;
  const int64_t batch = 128, width = 1024, classes = 10;

  gw::Generator gen(0);
  auto model = std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{
      std::make_shared<gw::nn::Linear>(width, width, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(width, width, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(width, width, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(width, classes, gen)});
  gw::optim::Optimizer opt(model->Parameters(), gw::optim::Sgd{.lr = 0.01});
  const gw::Tensor x = gw::Tensor::Randn({batch, width}, gen);
  std::vector<int64_t> labels(batch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.NextBelow(classes));
  const gw::Tensor y = gw::Tensor::FromVector<int64_t>(labels);

  double last_loss = 0;
  std::fprintf(stderr, "local_mlp: %d warm-up + %d timed steps\n", warmup, iters);
  const std::vector<double> step_ms = gw::bench::TimeMs(warmup, iters, [&] {
    opt.ZeroGrad();
    gw::Tensor loss = gw::nn::CrossEntropyLoss(model->Forward(x), y);
    gw::autograd::Backward({loss});
    opt.Step();
    last_loss = loss.item();
  });

  // The GEMMs of one step, on preallocated buffers: forward x W^T (4 layers), weight
  // gradients g^T x (4 layers), input gradients g W (layers 2-4; the input needs none).
  std::vector<gw::Tensor> w, acts, outs, gw_, gin;
  const int64_t sizes[5] = {width, width, width, width, classes};
  for (int l = 0; l < 4; ++l) {
    w.push_back(gw::Tensor::Randn({sizes[l + 1], sizes[l]}, gen));
    acts.push_back(gw::Tensor::Randn({batch, sizes[l]}, gen));
    outs.push_back(gw::Tensor::Empty({batch, sizes[l + 1]}));
    gw_.push_back(gw::Tensor::Empty({sizes[l + 1], sizes[l]}));
    gin.push_back(gw::Tensor::Empty({batch, sizes[l]}));
  }
  const std::vector<double> gemm_ms = gw::bench::TimeMs(warmup, iters, [&] {
    for (int l = 0; l < 4; ++l) gw::kernels::Gemm(false, true, 1, acts[l], w[l], 0, outs[l]);
    for (int l = 3; l >= 0; --l) {
      gw::kernels::Gemm(true, false, 1, outs[l], acts[l], 0, gw_[l]);
      if (l > 0) gw::kernels::Gemm(false, false, 1, outs[l], w[l], 0, gin[l]);
    }
  });

  const double step = gw::bench::Quantile(step_ms, 0.5), gemm = gw::bench::Quantile(gemm_ms, 0.5);
  gw::bench::Report("local_mlp", "step_ms_median", step, "ms");
  gw::bench::Report("local_mlp", "step_ms_p90", gw::bench::Quantile(step_ms, 0.9), "ms");
  gw::bench::Report("local_mlp", "gemm_only_ms_median", gemm, "ms");
  gw::bench::Report("local_mlp", "step_over_gemm", step / gemm, "x");
  double flops = 0;
  for (int l = 0; l < 4; ++l) {
    const double layer = 2.0 * static_cast<double>(batch * sizes[l] * sizes[l + 1]);
    flops += layer * (l > 0 ? 3 : 2);  // forward, weight grad, input grad (not for layer 0)
  }
  gw::bench::Report("local_mlp", "gemm_gflops", flops / (gemm * 1e6), "GFLOP/s");
  std::fprintf(stderr, "local_mlp: final loss %.4f\n", last_loss);
  return 0;
}
