// Benchmarks W16-W18: a training step of a zoo model (models/) in one process, one thread.
//
//   bench_models [--quick] cnn|resnet|lstm|vit
//
// One step = zero_grad + forward + loss + backward + SGD(momentum 0.9) on a batch of 64
// images [64, 1, 28, 28], as bench/pytorch/models_bench.py does with the same models
// written in PyTorch (bench/pytorch/zoo.py). Besides the step time it prints the step's
// arithmetic (the multiply-adds of its convolutions, matrix products and recurrent GEMMs,
// forward and backward, counted from the model's shapes), gradwire's own float32 GEMM
// rate measured here on a GEMM of the model's typical size, and the step's time over the
// arithmetic at that rate (the "within 2x of its arithmetic" bound).
#include <cstring>
#include <string>

#include "bench_util.h"
#include "gradwire/gradwire.h"
#include "gradwire/models/zoo.h"

namespace {

constexpr int64_t kBatch = 64;

// FLOPs of one training step: 2*m*n*k per GEMM, times 3 for forward, input gradient and
// weight gradient (2 where the input needs no gradient: the first layer).
double Gemm(double m, double n, double k, int passes = 3) { return 2.0 * m * n * k * passes; }
double Conv(double out_hw, double cout, double cin_k, int passes = 3) {
  return Gemm(kBatch * out_hw, cout, cin_k, passes);
}

double StepFlops(const std::string& model) {
  const double b = kBatch;
  if (model == "cnn") {
    return Conv(26 * 26, 32, 1 * 9, 2) + Conv(24 * 24, 64, 32 * 9) + Gemm(b, 128, 9216) + Gemm(b, 10, 128);
  }
  if (model == "resnet") {
    double f = Conv(28 * 28, 16, 1 * 9, 2);  // stem
    const int64_t widths[3] = {16, 32, 64}, sizes[3] = {28, 14, 7};
    int64_t in = 16;
    for (int s = 0; s < 3; ++s) {
      for (int blk = 0; blk < 2; ++blk) {
        const double hw = static_cast<double>(sizes[s] * sizes[s]), w = static_cast<double>(widths[s]);
        f += Conv(hw, w, static_cast<double>(in) * 9) + Conv(hw, w, w * 9);
        if (in != widths[s]) f += Conv(hw, w, static_cast<double>(in));  // 1x1 downsample
        in = widths[s];
      }
    }
    return f + Gemm(b, 10, 64);
  }
  if (model == "lstm") {
    const double t = 28, h = 128;
    return Gemm(b * t, 4 * h, 28, 2) + Gemm(b * t, 4 * h, h) +  // layer 0: input, hidden
           Gemm(b * t, 4 * h, h) + Gemm(b * t, 4 * h, h) +      // layer 1
           Gemm(b, 10, h);
  }
  // vit: 49 tokens of d 128, 4 layers, 4 heads of 32, feed-forward 256.
  const double tokens = b * 49, d = 128;
  double layer = Gemm(tokens, 3 * d, d) + Gemm(tokens, d, d) + 2 * Gemm(tokens, 256, d) +
                 2 * Gemm(b * 4 * 49, 49, 32);  // scores and weights x values, per head
  return Gemm(tokens, d, 16, 2) + 4 * layer + Gemm(b, 10, d);
}

// gradwire's float32 GEMM rate (GFLOP/s) on a product of the model's typical size.
double GemmRate(const std::string& model, int warmup, int iters) {
  gw::Generator gen(7);
  int64_t m = kBatch * 49, n = 384, k = 128;  // the ViT's in-projection
  if (model == "cnn" || model == "resnet") m = kBatch * 576, n = 64, k = 288;  // conv2 as a GEMM
  if (model == "lstm") m = kBatch * 28, n = 512, k = 128;
  const gw::Tensor a = gw::Tensor::Randn({m, k}, gen), w = gw::Tensor::Randn({n, k}, gen);
  const gw::Tensor c = gw::Tensor::Empty({m, n});
  const double ms = gw::bench::Quantile(
      gw::bench::TimeMs(warmup, iters, [&] { gw::kernels::Gemm(false, true, 1, a, w, 0, c); }), 0.5);
  return 2.0 * static_cast<double>(m * n * k) / (ms * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string model;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      model = argv[i];
    }
  }
  const std::string workload = model + "_step";
  const int warmup = quick ? 2 : 5, iters = quick ? 5 : 30;
  gw::Generator gen(0);
  absl::StatusOr<std::shared_ptr<gw::nn::Module>> made = gw::models::Create(model, gen);
  if (!made.ok()) {
    std::fprintf(stderr, "usage: bench_models [--quick] cnn|resnet|lstm|vit\nerror: %s\n",
                 std::string(made.status().message()).c_str());
    return 2;
  }
  gw::nn::Module& net = **made;
  net.Train();
  gw::optim::Optimizer opt(net.Parameters(), gw::optim::Sgd{.lr = 0.01, .momentum = 0.9});
  const gw::Tensor x = gw::Tensor::Randn({kBatch, 1, 28, 28}, gen);
  std::vector<int64_t> labels(kBatch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.NextBelow(10));
  const gw::Tensor y = gw::Tensor::FromVector<int64_t>(labels);

  double last_loss = 0;
  std::fprintf(stderr, "%s: %d warm-up + %d timed steps\n", workload.c_str(), warmup, iters);
  const std::vector<double> step_ms = gw::bench::TimeMs(warmup, iters, [&] {
    opt.ZeroGrad();
    gw::Tensor loss = gw::models::Loss(model, net.Forward(x), y);
    gw::autograd::Backward({loss});
    opt.Step();
    last_loss = loss.item();
  });
  const double step = gw::bench::Quantile(step_ms, 0.5);
  const double flops = StepFlops(model), rate = GemmRate(model, warmup, iters * 4);
  const double bound_ms = flops / (rate * 1e6);
  gw::bench::Report(workload, "step_ms_median", step, "ms");
  gw::bench::Report(workload, "step_ms_p90", gw::bench::Quantile(step_ms, 0.9), "ms");
  gw::bench::Report(workload, "step_gflop", flops / 1e9, "GFLOP");
  gw::bench::Report(workload, "gemm_gflops", rate, "GFLOP/s");
  gw::bench::Report(workload, "arithmetic_bound_ms", bound_ms, "ms");
  gw::bench::Report(workload, "step_over_bound", step / bound_ms, "x");
  std::fprintf(stderr, "%s: final loss %.4f\n", workload.c_str(), last_loss);
  return 0;
}
