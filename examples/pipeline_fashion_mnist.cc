// Pipeline-parallel training on Fashion-MNIST: the model is split into two stages, each
// a RemoteModule on its own worker; rank 0 drives: every batch is split into micro-batches
// that flow through both stages at once (GPipe or 1F1B), one distributed-autograd context
// per step, and a DistributedOptimizer updates each stage where it lives. Run it under the
// launcher:
//
//   gradwire launch -n 2 pipeline_fashion_mnist [--model=mlp|resnet] [--chunks=8]
//                                               [--schedule=gpipe|1f1b] [--overlap_backward]
//                                               [--epochs=E]
//                                               [--batch_size=64] [--lr=LR] [--momentum=0.9]
//                                               [--max_steps=N] [--min_accuracy=0.85]
//
// --model=mlp (the default): an MLP 784-256 | 256-128-10. --model=resnet: the zoo's
// SmallResNet cut from its Pieces() where the two stages' arithmetic balances (stem and 3
// blocks | 3 blocks and the head); each stage worker builds the whole model from --seed
// and keeps its pieces (examples/pipeline_stages.h). Its BatchNorm layers normalise each
// micro-batch with the micro-batch's statistics and update their running statistics
// micro-batch by micro-batch in batch order (as one process running the micro-batches
// one after another would), on the stage that holds them; evaluation runs in eval mode.
// Defaults per model (--epochs=0, --lr=0): mlp 3 epochs at lr 0.05, resnet 4 at 0.05.
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
#include "example_util.h"
#include "fashion_mnist_mlp.h"
#include "flags.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/gradwire.h"
#include "gradwire/parallel/pipeline.h"
#include "pipeline_stages.h"

ABSL_FLAG(std::string, model, "mlp", "the model cut into 2 stages: mlp or resnet (the zoo's SmallResNet)");
ABSL_FLAG(int, epochs, 0, "passes over the training set (0: the model's default, mlp 3, resnet 4)");
ABSL_FLAG(int, batch_size, 64, "examples per step (split into --chunks micro-batches)");
ABSL_FLAG(int, chunks, 8, "micro-batches per batch");
ABSL_FLAG(std::string, schedule, "gpipe", "gpipe or 1f1b");
ABSL_FLAG(bool, overlap_backward, false,
          "GPipe: one backward pass over every micro-batch, so the stages compute gradients at the same time "
          "(faster; gradients equal up to float rounding, which varies from run to run); off: one pass per "
          "micro-batch in order (bitwise reproducible)");
ABSL_FLAG(double, lr, 0, "learning rate (0: the model's default, mlp 0.05, resnet 0.05)");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum");
ABSL_FLAG(uint64_t, seed, 0, "seed for initialisation and shuffling");
ABSL_FLAG(std::string, data_dir, gw::data::kFashionMnistDir, "directory with the IDX files");
ABSL_FLAG(int64_t, max_steps, 0, "stop after this many steps in all (0: every step of every epoch), e.g. for a quick test");
ABSL_FLAG(double, min_accuracy, 0.85, "exit with status 1 if the test accuracy ends below this");

namespace {

using gw::examples::Fail;

// The defaults per model (--epochs=0, --lr=0); the flags' help repeats them.
const std::vector<gw::examples::Recipe> kRecipes = {{"mlp", 0.05, 3}, {"resnet", 0.05, 4}};

int Drive(gw::rpc::Agent& agent, gw::dist_autograd::DistAutograd& engine) {
  absl::StatusOr<gw::examples::FashionMnist> data =
      gw::examples::LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), /*show=*/true);
  if (!data.ok()) return Fail("Fashion-MNIST", data.status());
  const gw::data::Dataset* train = &data->train;
  const gw::data::Dataset* test = &data->test;
  const int world = static_cast<int>(agent.workers().size());
  const std::string model = absl::GetFlag(FLAGS_model);
  const gw::examples::Recipe recipe =
      gw::examples::ChooseRecipe(kRecipes, model, absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_epochs));
  const int epochs = recipe.epochs;
  std::vector<gw::dist_nn::RemoteModule> stages;
  std::vector<gw::rpc::RRef<gw::Tensor>> params;
  for (int64_t s = 0; s < 2; ++s) {
    const std::string worker = agent.workers()[static_cast<size_t>(world == 2 ? s : s + 1)].name;
    auto m = gw::dist_nn::RemoteModule::Create(agent, worker, "pipeline_stage", model, s,
                                               static_cast<int64_t>(absl::GetFlag(FLAGS_seed)),
                                               static_cast<int64_t>(gw::DType::kFloat32));
    if (!m.ok()) return Fail("cannot build a stage", m.status());
    auto p = m->RemoteParameters();
    if (!p.ok()) return Fail("cannot reach a stage's parameters", p.status());
    params.insert(params.end(), p->begin(), p->end());
    stages.push_back(*m);
  }
  auto opt = gw::dist_autograd::DistributedOptimizer::Create(
      agent, gw::optim::Sgd{.lr = recipe.lr, .momentum = absl::GetFlag(FLAGS_momentum)}, params);
  if (!opt.ok()) return Fail("cannot make the optimizer", opt.status());
  const std::string schedule = absl::GetFlag(FLAGS_schedule);
  if (schedule != "gpipe" && schedule != "1f1b") {
    return Fail("--schedule", absl::InvalidArgumentError("must be gpipe or 1f1b, got '" + schedule + "'"));
  }
  const gw::parallel::Pipeline pipe(
      stages, gw::parallel::PipelineOptions{
                  .chunks = absl::GetFlag(FLAGS_chunks),
                  .schedule = schedule == "gpipe" ? gw::parallel::Schedule::kGPipe : gw::parallel::Schedule::k1F1B,
                  .ordered_backward = !absl::GetFlag(FLAGS_overlap_backward),
                  .tracer = &agent.tracer()});  // GRADWIRE_TRACE: micro-batches as spans
  for (const gw::dist_nn::RemoteModule& stage : stages) {
    absl::StatusOr<std::string> text = stage.Describe();
    if (!text.ok()) return Fail("cannot describe a stage", text.status());
    std::printf("stage on %s: %s\n", stage.worker().c_str(), text->c_str());
  }
  std::printf("pipeline of 2 stages (--model=%s) on %s and %s, %d micro-batches per batch of %d (%s), "
              "%d epochs at lr %g\n",
              model.c_str(), stages[0].worker().c_str(), stages[1].worker().c_str(), absl::GetFlag(FLAGS_chunks),
              absl::GetFlag(FLAGS_batch_size), schedule.c_str(), epochs, recipe.lr);
  std::fflush(stdout);
  gw::Generator shuffle(absl::GetFlag(FLAGS_seed) + 1);
  gw::data::DataLoader loader(*train, absl::GetFlag(FLAGS_batch_size), /*shuffle=*/true, shuffle);
  const auto start = std::chrono::steady_clock::now();
  double test_acc = 0;
  int64_t samples = 0, steps = 0;
  const int64_t max_steps = absl::GetFlag(FLAGS_max_steps);
  auto more = [&] { return max_steps == 0 || steps < max_steps; };
  gw::examples::PipelineModel whole(pipe);  // the pipeline as a module, to evaluate it
  for (int epoch = 1; epoch <= epochs && more(); ++epoch) {
    gw::data::ProgressBar bar(absl::StrFormat("epoch %d/%d", epoch, epochs),
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
    while (more() && loader.Next(&batch)) {
      ++steps;
      gw::dist_autograd::Context ctx(engine);
      absl::StatusOr<double> loss =
          pipe.ForwardBackward(ctx, gw::examples::TagRows(batch.inputs), batch.targets,
                               [&model](const gw::Tensor& out, const gw::Tensor& y) {
                                 return gw::models::Loss(model, out, y);
                               });
      if (!loss.ok()) return Fail("training step", loss.status());
      if (absl::Status s = (*opt)->Step(ctx); !s.ok()) return Fail("optimizer step", s);
      loss_sum += *loss;
      seen += batch.targets.size(0);
      bar.Update(++step, fields());
    }
    samples += seen;
    // In eval mode (BatchNorm's running statistics), 1000 test images at a time.
    if (absl::Status s = gw::examples::SetStagesTraining(stages, false); !s.ok()) return Fail("evaluation", s);
    try {
      test_acc = gw::examples::TestAccuracy(whole, *test);
    } catch (const gw::Error& e) {
      return Fail("evaluation", absl::InternalError(e.what()));
    }
    if (absl::Status s = gw::examples::SetStagesTraining(stages, true); !s.ok()) return Fail("evaluation", s);
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
    return gw::examples::RegisterPipelineStages(a);
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
  gw::examples::ParseFlags(argc, argv,
                           "Pipeline-parallel training of an MLP or a ResNet on Fashion-MNIST (2 stages); run under "
                           "`gradwire launch -n 2`.");
  if (absl::Status s = gw::examples::CheckModel(absl::GetFlag(FLAGS_model), gw::examples::PipelineModels()); !s.ok()) {
    return gw::examples::Fail("cannot cut the model into pipeline stages", s);
  }
  return Run();
}
