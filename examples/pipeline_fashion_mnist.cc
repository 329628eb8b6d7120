// Pipeline-parallel training of an MLP 784-256-128-10 on Fashion-MNIST: the model is
// split into two stages (784-256 and 256-128-10), each a RemoteModule on its own worker;
// rank 0 drives: every batch is split into micro-batches that flow through both stages at
// once (GPipe or 1F1B), one distributed-autograd context per step, and a
// DistributedOptimizer updates each stage where it lives. Run it under the launcher:
//
//   gradwire launch -n 2 pipeline_fashion_mnist [--chunks=8] [--schedule=gpipe|1f1b]
//                                               [--epochs=3] [--batch_size=64] [--lr=0.05]
//                                               [--momentum=0.9] [--min_accuracy=0.85]
//
// Rank 0 holds stage 0 and drives; rank 1 holds stage 1 (with -n 3, ranks 1 and 2 hold
// the stages and rank 0 only drives). Rank 0 shows the progress and the final test
// accuracy; exit status 1 below --min_accuracy, 2 when the job cannot be set up.
#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "flags.h"
#include "example_util.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/gradwire.h"
#include "gradwire/parallel/pipeline.h"

ABSL_FLAG(int, epochs, 3, "passes over the training set");
ABSL_FLAG(int, batch_size, 64, "examples per step (split into --chunks micro-batches)");
ABSL_FLAG(int, chunks, 8, "micro-batches per batch");
ABSL_FLAG(std::string, schedule, "gpipe", "gpipe or 1f1b");
ABSL_FLAG(double, lr, 0.05, "learning rate");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum");
ABSL_FLAG(uint64_t, seed, 0, "seed for initialisation and shuffling");
ABSL_FLAG(std::string, data_dir, gw::data::kFashionMnistDir, "directory with the IDX files");
ABSL_FLAG(double, min_accuracy, 0.85, "exit with status 1 if the test accuracy ends below this");

namespace {

using gw::examples::Fail;

// The two stages; a stage worker builds its own from the seed the driver sends.
std::shared_ptr<gw::nn::Module> Stage(int64_t which, int64_t seed) {
  gw::Generator gen(static_cast<uint64_t>(seed));
  if (which == 0) {
    return std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{
        std::make_shared<gw::nn::Linear>(784, 256, gen), std::make_shared<gw::nn::ReLU>()});
  }
  return std::make_shared<gw::nn::Sequential>(std::vector<std::shared_ptr<gw::nn::Module>>{
      std::make_shared<gw::nn::Linear>(256, 128, gen), std::make_shared<gw::nn::ReLU>(),
      std::make_shared<gw::nn::Linear>(128, 10, gen)});
}

int Drive(gw::rpc::Agent& agent, gw::dist_autograd::DistAutograd& engine) {
  absl::StatusOr<gw::examples::FashionMnist> data =
      gw::examples::LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), /*show=*/true);
  if (!data.ok()) return Fail("Fashion-MNIST", data.status());
  const gw::data::Dataset* train = &data->train;
  const gw::data::Dataset* test = &data->test;
  const int world = static_cast<int>(agent.workers().size());
  std::vector<gw::dist_nn::RemoteModule> stages;
  std::vector<gw::rpc::RRef<gw::Tensor>> params;
  for (int64_t s = 0; s < 2; ++s) {
    const std::string worker = agent.workers()[static_cast<size_t>(world == 2 ? s : s + 1)].name;
    auto m = gw::dist_nn::RemoteModule::Create(agent, worker, "stage", s,
                                               static_cast<int64_t>(absl::GetFlag(FLAGS_seed)) + s);
    if (!m.ok()) return Fail("cannot build a stage", m.status());
    auto p = m->RemoteParameters();
    if (!p.ok()) return Fail("cannot reach a stage's parameters", p.status());
    params.insert(params.end(), p->begin(), p->end());
    stages.push_back(*m);
  }
  auto opt = gw::dist_autograd::DistributedOptimizer::Create(
      agent, gw::optim::Sgd{.lr = absl::GetFlag(FLAGS_lr), .momentum = absl::GetFlag(FLAGS_momentum)}, params);
  if (!opt.ok()) return Fail("cannot make the optimizer", opt.status());
  const std::string schedule = absl::GetFlag(FLAGS_schedule);
  if (schedule != "gpipe" && schedule != "1f1b") {
    return Fail("--schedule", absl::InvalidArgumentError("must be gpipe or 1f1b, got '" + schedule + "'"));
  }
  const gw::parallel::Pipeline pipe(
      stages, gw::parallel::PipelineOptions{.chunks = absl::GetFlag(FLAGS_chunks),
                                            .schedule = schedule == "gpipe" ? gw::parallel::Schedule::kGPipe
                                                                            : gw::parallel::Schedule::k1F1B});
  std::printf("pipeline of 2 stages on %s and %s, %d micro-batches per batch of %d (%s)\n",
              stages[0].worker().c_str(), stages[1].worker().c_str(), absl::GetFlag(FLAGS_chunks),
              absl::GetFlag(FLAGS_batch_size), schedule.c_str());
  std::fflush(stdout);
  gw::Generator shuffle(absl::GetFlag(FLAGS_seed) + 1);
  gw::data::DataLoader loader(*train, absl::GetFlag(FLAGS_batch_size), /*shuffle=*/true, shuffle);
  const auto start = std::chrono::steady_clock::now();
  double test_acc = 0;
  int64_t samples = 0;
  for (int epoch = 1; epoch <= absl::GetFlag(FLAGS_epochs); ++epoch) {
    gw::data::ProgressBar bar(absl::StrFormat("epoch %d/%d", epoch, absl::GetFlag(FLAGS_epochs)),
                              loader.batches_per_epoch());
    const auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t step = 0, seen = 0;
    auto fields = [&] {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      return absl::StrFormat("loss=%.4f %.0f samples/s", loss_sum / std::max<int64_t>(step, 1),
                             seen / std::max(secs, 1e-9));
    };
    gw::data::Batch batch;
    loader.Reset();
    while (loader.Next(&batch)) {
      gw::dist_autograd::Context ctx(engine);
      absl::StatusOr<double> loss = pipe.ForwardBackward(ctx, batch.inputs, batch.targets, [](auto& out, auto& y) {
        return gw::nn::CrossEntropyLoss(out, y);
      });
      if (!loss.ok()) return Fail("training step", loss.status());
      if (absl::Status s = (*opt)->Step(ctx); !s.ok()) return Fail("optimizer step", s);
      loss_sum += *loss;
      seen += batch.targets.size(0);
      bar.Update(++step, fields());
    }
    samples += seen;
    absl::StatusOr<gw::Tensor> logits = pipe.Forward(test->images);
    if (!logits.ok()) return Fail("evaluation", logits.status());
    test_acc = gw::nn::Accuracy(*logits, test->labels);
    bar.Finish(fields() + absl::StrFormat(" test_acc=%.4f", test_acc));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("final test accuracy: %.4f (%.1f s, %.0f samples/s)\n", test_acc, secs,
              static_cast<double>(samples) / secs);
  if (test_acc < absl::GetFlag(FLAGS_min_accuracy)) {
    std::fprintf(stderr, "test accuracy %.4f is below the required %.4f\n", test_acc,
                 absl::GetFlag(FLAGS_min_accuracy));
    return 1;
  }
  return 0;
}

int Run() {
  absl::StatusOr<gw::rpc::AgentOptions> options = gw::rpc::AgentOptions::FromEnv();
  if (!options.ok()) return Fail("not started by a launcher (run it under `gradwire launch -n 2`)", options.status());
  if (options->world_size < 2 || options->world_size > 3) {
    std::fprintf(stderr, "error: WORLD_SIZE is %d; run with -n 2 (driver + stage 0, stage 1) or -n 3\n",
                 options->world_size);
    return 2;
  }
  options->start_timeout = absl::Seconds(120);
  options->shutdown_timeout = absl::Hours(24);  // stage workers serve until the driver is done
  std::shared_ptr<gw::dist_autograd::DistAutograd> engine;
  auto agent = gw::rpc::Agent::Start(*options, [&](gw::rpc::Agent& a) -> absl::Status {
    if (absl::Status s = gw::rpc::Assign(gw::dist_autograd::DistAutograd::Install(a), engine); !s.ok()) return s;
    return gw::dist_nn::RegisterModuleFactory(a, "stage", Stage);
  });
  if (!agent.ok()) return Fail("cannot join the group", agent.status());
  int code = 0;
  if (options->rank == 0) {
    code = Drive(**agent, *engine);
  } else {
    std::printf("%s: serving a pipeline stage\n", (*agent)->self().name.c_str());
  }
  if (absl::Status s = (*agent)->Shutdown(); !s.ok()) return Fail("shutdown", s);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  gw::examples::ParseFlags(
      argc, argv,
      "Pipeline-parallel training of an MLP on Fashion-MNIST (2 stages); run under `gradwire launch -n 2`.");
  return Run();
}
