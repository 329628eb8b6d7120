// Benchmarks W5 `model_parallel_mlp` and W12 `pipeline_mlp` of BENCHMARKS.md for
// gradwire, over W5's model (w5_model.h) on two workers: this process (worker 0) and a
// copy of this program started with GW_BENCH_ROLE=server (worker 1), which holds stage 2
// as a RemoteModule. Batch 128, cross-entropy on worker 0; an iteration is a
// distributed-autograd context, forward, backward, DistributedOptimizer(SGD lr 0.01) step.
//   W5: worker 0 runs stage 1 itself, then calls stage 2 (one after the other).
//   W12: a parallel::Pipeline (GPipe) over stage 1 as a RemoteModule on worker 0 and
//        stage 2 on worker 1, the batch in 1, 4 and 8 micro-batches, so the two workers
//        compute at the same time.
// Both also time the same model in one process (the floor).
//   W16_pipeline (`pipeline_resnet`): the zoo's SmallResNet cut into the two stages of
//        pipeline_fashion_mnist --model=resnet (examples/pipeline_stages.h; stage 0 on
//        worker 0, which drives, stage 1 on worker 1), batch 64 of [1, 28, 28] images in
//        1, 4 and 8 micro-batches, GPipe and 1F1B, SGD lr 0.05 momentum 0.9 (the
//        example's step), next to the same model's step in one process (batch 64, and the
//        micro-batches one after another: what the stages compute without the overlap).
//
//   bench_model_parallel [pipeline | pipeline_resnet] [--quick]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench_util.h"
#include "microbatch_gemms.h"
#include "gradwire/gradwire.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/parallel/pipeline.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/models/resnet.h"
#include "gradwire/models/zoo.h"
#include "pipeline_stages.h"
#include "w5_model.h"

namespace {

using gw::bench::W5Stage;

gw::rpc::AgentOptions Options(int rank, int port) {
  gw::rpc::AgentOptions o;
  o.rank = rank;
  o.world_size = 2;
  o.rendezvous = "127.0.0.1:" + std::to_string(port);
  o.start_timeout = absl::Seconds(60);
  o.default_timeout = absl::Seconds(120);
  o.shutdown_timeout = absl::Hours(1);  // worker 1 serves until worker 0 is done, however long it runs
  return o;
}

absl::Status Setup(gw::rpc::Agent& a, std::shared_ptr<gw::dist_autograd::DistAutograd>* engine) {
  if (absl::Status s = gw::rpc::Assign(gw::dist_autograd::DistAutograd::Install(a), *engine); !s.ok()) return s;
  if (absl::Status s = gw::examples::RegisterPipelineStages(a); !s.ok()) return s;
  if (absl::Status s = gw::dist_nn::RegisterModuleFactory(a, "stage1", [] { return W5Stage(true, 1); }); !s.ok()) {
    return s;
  }
  return gw::dist_nn::RegisterModuleFactory(a, "stage2", [] { return W5Stage(false, 2); });
}

int Server(int port) {
  std::shared_ptr<gw::dist_autograd::DistAutograd> engine;
  auto agent = gw::rpc::Agent::Start(Options(1, port), [&](gw::rpc::Agent& a) { return Setup(a, &engine); });
  if (!agent.ok()) return 1;
  return (*agent)->Shutdown().ok() ? 0 : 1;
}

void Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "model_parallel_mlp: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}
// Median ms of a training step of `model` in one process: the batch in `chunks`
// micro-batches one after the other (gradients accumulated), then one optimizer step.
double LocalStepMs(gw::nn::Module& model, gw::optim::Optimizer& opt, const gw::Tensor& x, const gw::Tensor& y,
                   const gw::parallel::PipelineLoss& loss, int warmup, int iters, int chunks) {
  const int64_t rows = x.size(0) / chunks;
  return gw::bench::Quantile(gw::bench::TimeMs(warmup, iters,
                                               [&] {
                                                 opt.ZeroGrad();
                                                 for (int c = 0; c < chunks; ++c) {
                                                   gw::Tensor l = loss(model.Forward(gw::Narrow(x, 0, c * rows, rows)),
                                                                       gw::kernels::Narrow(y, 0, c * rows, rows));
                                                   gw::autograd::Backward({l * (1.0 / chunks)});
                                                 }
                                                 opt.Step();
                                               }),
                             0.5);
}

// The same 4-layer model in one process: median ms per iteration. With chunks > 1: what
// the pipeline's stages compute, without the overlap.
double LocalMedianMs(const gw::Tensor& x, const gw::Tensor& y, int warmup, int iters, int chunks = 1) {
  auto model = std::make_shared<gw::nn::Sequential>(
      std::vector<std::shared_ptr<gw::nn::Module>>{W5Stage(true, 1), W5Stage(false, 2)});
  gw::optim::Optimizer opt(model->Parameters(), gw::optim::Sgd{.lr = 0.01});
  const auto loss = [](const gw::Tensor& out, const gw::Tensor& target) { return gw::nn::CrossEntropyLoss(out, target); };
  return LocalStepMs(*model, opt, x, y, loss, warmup, iters, chunks);
}

// W5: stage 1 here, stage 2 behind a RemoteModule, one after the other.
void ModelParallel(gw::rpc::Agent& w0, gw::dist_autograd::DistAutograd& engine, bool quick) {
  const int warmup = quick ? 2 : 5, iters = quick ? 5 : 50;
  const auto [x, y] = gw::bench::W5Batch();
  double dist_median = 0;
  {
    auto stage1 = W5Stage(true, 1);
    absl::StatusOr<gw::dist_nn::RemoteModule> stage2 = gw::dist_nn::RemoteModule::Create(w0, "worker1", "stage2");
    if (!stage2.ok()) Fail("remote module", stage2.status());
    std::vector<gw::rpc::RRef<gw::Tensor>> params;
    for (const gw::Tensor& p : stage1->Parameters()) params.push_back(w0.Own(p));
    absl::StatusOr<std::vector<gw::rpc::RRef<gw::Tensor>>> remote = stage2->RemoteParameters();
    if (!remote.ok()) Fail("remote parameters", remote.status());
    params.insert(params.end(), remote->begin(), remote->end());
    auto opt = gw::dist_autograd::DistributedOptimizer::Create(w0, gw::optim::Sgd{.lr = 0.01}, params);
    if (!opt.ok()) Fail("optimizer", opt.status());

    std::fprintf(stderr, "model_parallel_mlp: gradwire, %d warm-up + %d timed iterations (SMART mode)\n", warmup,
                 iters);
    double last_loss = 0;
    const std::vector<double> ms = gw::bench::TimeMs(warmup, iters, [&] {
      gw::dist_autograd::Context ctx(engine);
      absl::StatusOr<gw::Tensor> logits = stage2->Forward(stage1->Forward(x));
      if (!logits.ok()) Fail("forward", logits.status());
      gw::Tensor loss = gw::nn::CrossEntropyLoss(*logits, y);
      if (absl::Status s = ctx.Backward({loss}); !s.ok()) Fail("backward", s);
      if (absl::Status s = (*opt)->Step(ctx); !s.ok()) Fail("step", s);
      last_loss = loss.item();
    });
    dist_median = gw::bench::Quantile(ms, 0.5);
    gw::bench::Report("model_parallel_mlp", "dist_ms_per_iter_median", dist_median, "ms");
    gw::bench::Report("model_parallel_mlp", "dist_ms_per_iter_p90", gw::bench::Quantile(ms, 0.9), "ms");
    std::fprintf(stderr, "model_parallel_mlp: distributed loss after %d steps %.4f\n", warmup + iters, last_loss);
  }
  const double local_median = LocalMedianMs(x, y, warmup, iters);
  gw::bench::Report("model_parallel_mlp", "local_ms_per_iter_median", local_median, "ms");
  gw::bench::Report("model_parallel_mlp", "dist_overhead_ms", dist_median - local_median, "ms");
}

// W12: a GPipe pipeline over stage 1 (a RemoteModule on this worker) and stage 2 (on
// worker 1), fresh stages for each micro-batch count.
void PipelineMlp(gw::rpc::Agent& w0, gw::dist_autograd::DistAutograd& engine, bool quick) {
  const int warmup = quick ? 2 : 5, iters = quick ? 5 : 30;
  const auto [x, y] = gw::bench::W5Batch();
  const double local_median = LocalMedianMs(x, y, warmup, iters);
  gw::bench::Report("pipeline_mlp", "local_ms_per_iter", local_median, "ms");
  const auto loss = [](const gw::Tensor& out, const gw::Tensor& target) { return gw::nn::CrossEntropyLoss(out, target); };
  for (int chunks : {1, 4, 8}) {
    std::vector<gw::dist_nn::RemoteModule> stages;
    std::vector<gw::rpc::RRef<gw::Tensor>> params;
    for (const char* where : {"worker0", "worker1"}) {
      absl::StatusOr<gw::dist_nn::RemoteModule> stage =
          gw::dist_nn::RemoteModule::Create(w0, where, stages.empty() ? "stage1" : "stage2");
      if (!stage.ok()) Fail("remote module", stage.status());
      absl::StatusOr<std::vector<gw::rpc::RRef<gw::Tensor>>> p = stage->RemoteParameters();
      if (!p.ok()) Fail("remote parameters", p.status());
      params.insert(params.end(), p->begin(), p->end());
      stages.push_back(*stage);
    }
    auto opt = gw::dist_autograd::DistributedOptimizer::Create(w0, gw::optim::Sgd{.lr = 0.01}, params);
    if (!opt.ok()) Fail("optimizer", opt.status());
    gw::parallel::Pipeline pipe(stages,
                                {.chunks = chunks, .schedule = gw::parallel::Schedule::kGPipe, .tracer = &w0.tracer()});
    std::fprintf(stderr, "pipeline_mlp: gradwire, %d micro-batches, %d warm-up + %d timed iterations\n", chunks,
                 warmup, iters);
    double last_loss = 0;
    const std::vector<double> ms = gw::bench::TimeMs(warmup, iters, [&] {
      gw::dist_autograd::Context ctx(engine);
      absl::StatusOr<double> l = pipe.ForwardBackward(ctx, x, y, loss);
      if (!l.ok()) Fail("pipeline step", l.status());
      if (absl::Status s = (*opt)->Step(ctx); !s.ok()) Fail("step", s);
      last_loss = *l;
    });
    const double median = gw::bench::Quantile(ms, 0.5);
    gw::bench::Report("pipeline_mlp", absl::StrCat("pipe_ms_per_iter_chunks", chunks), median, "ms");
    // Diagnostic: the same micro-batches in one process, one after the other.
    gw::bench::Report("pipeline_mlp", absl::StrCat("local_ms_per_iter_chunks", chunks),
                      LocalMedianMs(x, y, warmup, iters, chunks), "ms");
    // Diagnostic: the GEMMs alone on these micro-batches, as called today and with weights
    // packed once per step (bench/microbatch_gemms.h).
    gw::bench::Report("pipeline_mlp", absl::StrCat("gemm_ms_chunks", chunks),
                      gw::bench::MicroBatchGemmMs(chunks, false, warmup, iters), "ms");
    gw::bench::Report("pipeline_mlp", absl::StrCat("gemm_packed_ms_chunks", chunks),
                      gw::bench::MicroBatchGemmMs(chunks, true, warmup, iters), "ms");
    std::fprintf(stderr, "pipeline_mlp: %d micro-batches: %.2f ms/iter = %.2fx the local floor; loss after %d steps %.4f\n",
                 chunks, median, median / local_median, warmup + iters, last_loss);
  }
}

// W16_pipeline: the SmallResNet's step in one process, batch [64, 784] in `chunks`
// micro-batches one after the other (gradients accumulated, one SGD step).
double LocalResNetMs(const gw::Tensor& x, const gw::Tensor& y, int warmup, int iters, int chunks) {
  gw::Generator gen(0);
  absl::StatusOr<std::shared_ptr<gw::nn::Module>> net = gw::models::Create("resnet", gen);
  if (!net.ok()) Fail("resnet", net.status());
  (*net)->Train();
  gw::optim::Optimizer opt((*net)->Parameters(), gw::optim::Sgd{.lr = 0.05, .momentum = 0.9});
  const auto loss = [](const gw::Tensor& out, const gw::Tensor& target) {
    return gw::models::Loss("resnet", out, target);
  };
  return LocalStepMs(**net, opt, gw::Reshape(x, {x.size(0), 1, 28, 28}), y, loss, warmup, iters, chunks);
}

// W16_pipeline diagnostic: each stage's forward and backward on one micro-batch of
// `rows` in one process (the stages the pipeline runs, cut the same way): median ms of
// {stage 0 forward, stage 1 forward, stage 1 backward, stage 0 backward}.
std::vector<double> StageMs(const gw::Tensor& x, const gw::Tensor& y, int warmup, int iters, int64_t rows) {
  gw::Generator gen(0);
  gw::models::SmallResNet net(gen);
  net.Train();
  const auto stages = gw::examples::CutResNet(net, gw::DType::kFloat32);
  const gw::Tensor in = gw::examples::TagRows(gw::Narrow(x, 0, 0, rows));
  const gw::Tensor target = gw::kernels::Narrow(y, 0, 0, rows);
  std::vector<std::vector<double>> ms(4);
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  for (int i = 0; i < warmup + iters; ++i) {
    auto t = Clock::now();
    const gw::Tensor out0 = stages[0]->Forward(in);
    const double f0 = since(t);
    const gw::Tensor in1 = gw::kernels::Clone(out0).set_requires_grad(true);
    t = Clock::now();
    const gw::Tensor loss = gw::models::Loss("resnet", stages[1]->Forward(in1), target);
    const double f1 = since(t);
    t = Clock::now();
    gw::autograd::Backward({loss});
    const double b1 = since(t);
    t = Clock::now();
    gw::autograd::Backward({out0}, {in1.grad()});
    const double b0 = since(t);
    if (i >= warmup) {
      ms[0].push_back(f0);
      ms[1].push_back(f1);
      ms[2].push_back(b1);
      ms[3].push_back(b0);
    }
  }
  std::vector<double> out;
  for (const auto& v : ms) out.push_back(gw::bench::Quantile(v, 0.5));
  return out;
}

// W16_pipeline: the example's two ResNet stages (stage 0 here, stage 1 on worker 1).
void PipelineResNet(gw::rpc::Agent& w0, gw::dist_autograd::DistAutograd& engine, bool quick) {
  constexpr int64_t kBatch = 64;
  const int warmup = quick ? 2 : 5, iters = quick ? 5 : 20;
  gw::Generator gen(1);
  const gw::Tensor x = gw::Tensor::Randn({kBatch, 28 * 28}, gen);
  std::vector<int64_t> labels(kBatch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.NextBelow(10));
  const gw::Tensor y = gw::Tensor::FromVector<int64_t>(labels);
  (void)LocalResNetMs(x, y, warmup, iters, 1);  // warm-up (the first primitives, the pool threads)
  const double local = LocalResNetMs(x, y, warmup, iters, 1);
  {  // diagnostic: the forward alone (no gradients recorded)
    gw::Generator g(0);
    gw::models::SmallResNet net(g);
    gw::autograd::NoGradGuard no_grad;
    const gw::Tensor images = gw::Reshape(x, {x.size(0), 1, 28, 28});
    gw::bench::Report("pipeline_resnet", "local_forward_ms",
                      gw::bench::Quantile(gw::bench::TimeMs(warmup, iters, [&] { (void)net.Forward(images); }), 0.5),
                      "ms");
  }
  gw::bench::Report("pipeline_resnet", "local_ms_per_iter", local, "ms");
  const auto loss = [](const gw::Tensor& out, const gw::Tensor& target) {
    return gw::models::Loss("resnet", out, target);
  };
  for (int64_t rows : {kBatch, kBatch / 4}) {
    const std::vector<double> st = StageMs(x, y, warmup, iters, rows);
    const char* what[] = {"stage0_forward", "stage1_forward", "stage1_backward", "stage0_backward"};
    for (size_t i = 0; i < st.size(); ++i) {
      gw::bench::Report("pipeline_resnet", absl::StrCat(what[i], "_ms_rows", rows), st[i], "ms");
    }
    std::fprintf(stderr, "pipeline_resnet: %lld rows in one process: stage 0 %.1f + %.1f ms, stage 1 %.1f + %.1f ms\n",
                 static_cast<long long>(rows), st[0], st[3], st[1], st[2]);
  }
  const gw::Tensor tagged = gw::examples::TagRows(x);
  struct Variant {
    gw::parallel::Schedule schedule;
    bool ordered_backward;
    const char* name;
  };
  for (const auto& [schedule, ordered, name] : {Variant{gw::parallel::Schedule::kGPipe, true, "gpipe"},
                                                Variant{gw::parallel::Schedule::kGPipe, false, "gpipe_overlap"},
                                                Variant{gw::parallel::Schedule::k1F1B, true, "1f1b"}}) {
    for (int chunks : {1, 4, 8}) {
      if (chunks == 1 && (schedule == gw::parallel::Schedule::k1F1B || !ordered)) continue;  // the same as GPipe
      std::vector<gw::dist_nn::RemoteModule> stages;
      std::vector<gw::rpc::RRef<gw::Tensor>> params;
      for (int64_t s = 0; s < 2; ++s) {
        absl::StatusOr<gw::dist_nn::RemoteModule> stage = gw::dist_nn::RemoteModule::Create(
            w0, s == 0 ? "worker0" : "worker1", "pipeline_stage", std::string("resnet"), s, int64_t{0},
            static_cast<int64_t>(gw::DType::kFloat32));
        if (!stage.ok()) Fail("remote module", stage.status());
        absl::StatusOr<std::vector<gw::rpc::RRef<gw::Tensor>>> p = stage->RemoteParameters();
        if (!p.ok()) Fail("remote parameters", p.status());
        params.insert(params.end(), p->begin(), p->end());
        stages.push_back(*stage);
      }
      auto opt = gw::dist_autograd::DistributedOptimizer::Create(
          w0, gw::optim::Sgd{.lr = 0.05, .momentum = 0.9}, params);
      if (!opt.ok()) Fail("optimizer", opt.status());
      gw::parallel::Pipeline pipe(
          stages, {.chunks = chunks, .schedule = schedule, .ordered_backward = ordered, .tracer = &w0.tracer()});
      std::fprintf(stderr, "pipeline_resnet: gradwire, %s, %d micro-batches, %d warm-up + %d timed iterations\n", name,
                   chunks, warmup, iters);
      const std::vector<double> ms = gw::bench::TimeMs(warmup, iters, [&] {
        gw::dist_autograd::Context ctx(engine);
        absl::StatusOr<double> l = pipe.ForwardBackward(ctx, tagged, y, loss);
        if (!l.ok()) Fail("pipeline step", l.status());
        if (absl::Status s = (*opt)->Step(ctx); !s.ok()) Fail("step", s);
      });
      const double median = gw::bench::Quantile(ms, 0.5);
      if (ordered) {  // diagnostic: the forward alone (no gradients recorded)
        gw::autograd::NoGradGuard no_grad;
        const double fwd = gw::bench::Quantile(gw::bench::TimeMs(warmup, iters,
                                                                 [&] {
                                                                   if (absl::StatusOr<gw::Tensor> out = pipe.Forward(tagged);
                                                                       !out.ok()) {
                                                                     Fail("pipeline forward", out.status());
                                                                   }
                                                                 }),
                                               0.5);
        gw::bench::Report("pipeline_resnet", absl::StrCat("pipe_", name, "_forward_ms_chunks", chunks), fwd, "ms");
      }
      gw::bench::Report("pipeline_resnet", absl::StrCat("pipe_", name, "_ms_per_iter_chunks", chunks), median, "ms");
      gw::bench::Report("pipeline_resnet", absl::StrCat("pipe_", name, "_over_local_chunks", chunks),
                        median / local, "x");
      if (schedule == gw::parallel::Schedule::kGPipe && ordered) {  // diagnostic: without the overlap
        gw::bench::Report("pipeline_resnet", absl::StrCat("local_ms_per_iter_chunks", chunks),
                          LocalResNetMs(x, y, warmup, iters, chunks), "ms");
      }
      std::fprintf(stderr, "pipeline_resnet: %s, %d micro-batches: %.1f ms/iter = %.2fx the one-process step\n",
                   name, chunks, median, median / local);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* role = std::getenv("GW_BENCH_ROLE")) {
    int port = 0;
    if (std::strcmp(role, "server") != 0 || !absl::SimpleAtoi(std::getenv("GW_BENCH_PORT"), &port)) return 2;
    return Server(port);
  }
  bool quick = false, pipeline = false, resnet = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "pipeline") == 0) pipeline = true;
    else if (std::strcmp(argv[i], "pipeline_resnet") == 0) resnet = true;
    else {
      std::fprintf(stderr, "usage: bench_model_parallel [pipeline | pipeline_resnet] [--quick]\n");
      return 2;
    }
  }
  absl::StatusOr<int> port = gw::worker::PickFreePort("127.0.0.1");
  if (!port.ok()) Fail("port", port.status());
  const pid_t child = gw::bench::SpawnSelf({{"GW_BENCH_ROLE", "server"}, {"GW_BENCH_PORT", std::to_string(*port)}});

  std::shared_ptr<gw::dist_autograd::DistAutograd> engine;
  auto agent = gw::rpc::Agent::Start(Options(0, *port), [&](gw::rpc::Agent& a) { return Setup(a, &engine); });
  if (!agent.ok()) Fail("start", agent.status());
  gw::rpc::Agent& w0 = **agent;
  if (resnet) {
    PipelineResNet(w0, *engine, quick);
  } else if (pipeline) {
    PipelineMlp(w0, *engine, quick);
  } else {
    ModelParallel(w0, *engine, quick);
  }
  const bool ok = w0.Shutdown().ok();
  int status = 0;
  ::waitpid(child, &status, 0);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
