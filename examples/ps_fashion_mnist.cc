// A parameter-server deployment training a model on Fashion-MNIST (--model: the MLP
// 784-256-128-10 by default, or a model of the zoo): the first --servers ranks hold the
// parameters (one dense table per parameter, sharded over them, SGD with momentum applied
// there, synchronous steps), the other ranks are trainers that each train on their shard
// of the data, pushing gradients and pulling parameters every step. --model=cnn is the
// network of PyTorch's parameter-server tutorial (its parameters conv1.weight, ...,
// fc2.bias are the tables). Buffers are not parameters: with --model=resnet each trainer
// keeps its own BatchNorm running statistics (from its own batches) and trainer 0
// evaluates with its own. Run it under the launcher:
//
//   gradwire launch -n 4 ps_fashion_mnist [--model=mlp|cnn|resnet|lstm] [--servers=2]
//                                         [--epochs=E] [--batch_size=64] [--lr=LR]
//                                         [--momentum=0.9] [--min_accuracy=0.85] [--max_steps=N]
//                                         [--stop_at=0.85] [--report] [--checkpoint_dir=DIR]
//                                         [--checkpoint_every_s=S] [--checkpoint_keep=K] [--fresh]
//                                         [--checkpoint_max_failures=N] [--reconnect_timeout_s=S]
//                                         [--show_network] [--save=PATH] [--device=cpu|cuda:N]
//                                         [--logdir=DIR]
//
// --logdir=DIR: trainer 0 writes the training curves (loss, accuracy, samples/s, step
// time) as TensorBoard event files in DIR (examples/curves.h).
// --device=cuda:0 trains each trainer on that GPU with the servers on the CPU: gradients
// and parameters cross through host memory (not yet run on a GPU; see README "GPUs").
//
// Defaults per model (--epochs=0, --lr=0): mlp 10 epochs at lr 0.05, cnn 8 at 0.05,
// resnet 4 at 0.05, lstm 5 at 0.1, others 3 at 0.02.
//
// Elastic: start it with `gradwire launch -n 4 --max-workers 6 --master-port P ...`, then
// add a trainer with `gradwire launch --join --master-port P ps_fashion_mnist --epochs=1`
// (it joins the synchronous steps at the next step boundary, on a copy of a trainer's
// data shard) or a server with `... ps_fashion_mnist --join_as=server` (the tables are
// re-sharded onto it while the trainers train).
// Trainer 0 shows the progress and the final test accuracy; exit status 1 when it ends
// below --min_accuracy, 2 when the data or the group cannot be set up.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "epoch_progress.h"
#include "fashion_mnist_mlp.h"
#include "logdir_flag.h"
#include "ps_job.h"

ABSL_FLAG(std::string, model, "mlp",
          "the model: mlp, or a model of the zoo (cnn: PyTorch's parameter-server tutorial's network, resnet, lstm)");
ABSL_FLAG(int, epochs, 0,
          "passes over the training set (0: the model's default: mlp 10, cnn 8, resnet 4, lstm 5, others 3)");
ABSL_FLAG(int64_t, max_steps, 0, "stop after this many steps in all (0: every step of every epoch), e.g. for a quick test");
ABSL_FLAG(double, min_accuracy, 0.85, "exit with status 1 if the test accuracy ends below this");
ABSL_FLAG(double, lr, 0,
          "learning rate (0: the model's default: mlp 0.05, cnn 0.05, resnet 0.05, lstm 0.1, others 0.02)");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum");
ABSL_FLAG(double, stop_at, 0, "stop after the first epoch whose test accuracy reaches this (0: run every epoch)");
ABSL_FLAG(std::string, save, "",
          "trainer 0 writes the trained model's state dict to this file (examples/serve_fashion_mnist serves the "
          "mlp's)");
ABSL_FLAG(std::string, device, "cpu",
          "where each trainer computes: cpu, or cuda:N (the servers stay on the CPU; gradients and parameters "
          "cross through host memory)");
ABSL_FLAG(bool, report, false,
          "print benchmark W9's result lines (time_to_85, samples_per_s, final_test_acc) at the end");

namespace {

using gw::examples::Fail;

// The defaults per model (--epochs=0, --lr=0); the flags' help and the file comment repeat them.
const std::vector<gw::examples::Recipe> kRecipes = {
    {"mlp", 0.05, 10}, {"cnn", 0.05, 8}, {"resnet", 0.05, 4}, {"lstm", 0.1, 5}, {"*", 0.02, 3}};

gw::examples::Recipe ChosenRecipe() {
  return gw::examples::ChooseRecipe(kRecipes, absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_lr),
                                    absl::GetFlag(FLAGS_epochs));
}

// --device: where this trainer computes; a GPU it cannot use is an error naming it.
absl::StatusOr<gw::Device> TrainerDevice() {
  absl::StatusOr<gw::Device> device = gw::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok() || device->is_cpu()) return device;
  try {
    gw::cuda::CheckDevice("a trainer cannot use it", *device);
  } catch (const gw::Error& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return device;
}

int Train(gw::rpc::AgentOptions options, int servers) {
  const absl::StatusOr<gw::Device> device = TrainerDevice();
  if (!device.ok()) return Fail("--device", device.status());
  if (options.rank == servers && !options.join) {  // trainer 0 saves the model
    gw::examples::CheckWritable("save", absl::GetFlag(FLAGS_save));
  }
  gw::examples::TrainerSetup setup;
  if (int failed = gw::examples::StartTrainer(options, servers, &setup); failed != 0) return failed;
  const gw::data::Dataset* train = &setup.train;
  const gw::data::Dataset* test = &setup.test;
  const int trainers = setup.trainers, trainer = setup.trainer;
  gw::param_server::Client& ps = *setup.ps;

  // Every trainer builds the same initial model (same seed) and creates the tables.
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const gw::examples::Recipe recipe = ChosenRecipe();
  const int epochs = recipe.epochs;
  gw::Generator gen(absl::GetFlag(FLAGS_seed));
  absl::StatusOr<std::shared_ptr<gw::nn::Module>> built = gw::examples::ExampleModel(model_name, gen);
  if (!built.ok()) return Fail("cannot build the model", built.status());
  const std::shared_ptr<gw::nn::Module> model = *built;
  const gw::nn::NamedTensors params = model->NamedParameters();
  const gw::optim::Sgd sgd{.lr = recipe.lr, .momentum = absl::GetFlag(FLAGS_momentum)};
  for (const auto& [name, p] : params) {
    if (absl::Status s = ps.CreateDense(name, p, sgd, gw::param_server::Consistency::kSync); !s.ok()) {
      return Fail("cannot create the tables", s);
    }
  }
  model->To(*device);  // in place: `params` are the GPU tensors now
  std::vector<std::string> names;
  for (const auto& [name, p] : params) names.push_back(name);
  gw::Generator shuffle(absl::GetFlag(FLAGS_seed) + 1 + static_cast<uint64_t>(trainer));
  gw::data::DataLoader loader(*train, absl::GetFlag(FLAGS_batch_size), /*shuffle=*/true, shuffle);
  loader.Shard(trainer % trainers, trainers);  // one that joined trains on a copy of a shard
  // A job started on a checkpoint continues from its step, with the same data order.
  absl::StatusOr<gw::examples::Resumed> resumed = gw::examples::Resume(setup, loader, epochs);
  if (!resumed.ok()) return Fail("cannot resume the checkpoint", resumed.status());
  int64_t clock = resumed->step;
  if (setup.agent->options().join) {  // a trainer that joins the running job: at the next step boundary
    absl::StatusOr<int64_t> from = ps.Join(names);
    if (!from.ok()) return Fail("cannot join the tables", from.status());
    clock = *from;
    std::printf("%s: joined the job as trainer %d at step %lld\n", setup.agent->self().name.c_str(), trainer,
                static_cast<long long>(clock));
    std::fflush(stdout);
  }
  std::vector<gw::Tensor> values;  // the parameters as of `clock`, from the servers
  for (const std::string& name : names) {
    absl::StatusOr<gw::Tensor> v = ps.Pull(name, clock).Get();
    if (!v.ok()) return Fail("pull", v.status());
    values.push_back(*v);
  }
  const bool show = trainer == 0;
  absl::StatusOr<gw::examples::Curves> curves = gw::examples::Curves::Open(absl::GetFlag(FLAGS_logdir), show, clock);
  if (!curves.ok()) return Fail("--logdir", curves.status());
  if (show) {
    std::printf("%s\n%d servers, %d trainers, %lld parameters in %zu tables, batch %d per trainer, "
                "%d epochs at lr %g (--model=%s)\n",
                model->ToString().c_str(), servers, trainers, static_cast<long long>(model->NumParameters()),
                params.size(), absl::GetFlag(FLAGS_batch_size), epochs, recipe.lr, model_name.c_str());
    if (!model->NamedBuffers().empty()) {
      std::printf("the model's buffers (BatchNorm running statistics) are not tables: each trainer keeps its own, "
                  "and trainer 0 evaluates with its own\n");
    }
    std::fflush(stdout);  // the launcher's pipe: seen before the first epoch ends
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int64_t samples = 0;  // samples: both trainers' (every trainer sees the same count)
  double test_acc = 0, time_to_85 = -1, samples_to_85 = 0;
  const double stop_at = absl::GetFlag(FLAGS_stop_at);
  // --max_steps counts this run's steps; every trainer stops at the same one.
  const int64_t max_steps = absl::GetFlag(FLAGS_max_steps), first_step = clock;
  auto more = [&] { return max_steps == 0 || clock - first_step < max_steps; };
  for (int epoch = resumed->first_epoch; epoch <= epochs && more(); ++epoch) {
    gw::examples::EpochProgress progress(show, epoch, epochs, loader.batches_per_epoch(), trainers);
    progress.LogTo(&*curves);
    gw::data::Batch batch;
    loader.Reset();
    if (epoch == resumed->first_epoch) gw::examples::SkipBatches(loader, resumed->skip);
    while (more() && loader.Next(&batch)) {
      // The parameters as of this step, then this trainer's gradient for it; the answer
      // carries the parameters of the next step (one message each way per server).
      for (size_t i = 0; i < params.size(); ++i) gw::kernels::CopyInPlace(params[i].second, values[i]);
      model->ZeroGrad();
      gw::Tensor logits = model->Forward(gw::kernels::ToDevice(batch.inputs, *device));
      gw::Tensor loss = gw::models::Loss(model_name, logits, gw::kernels::ToDevice(batch.targets, *device));
      gw::autograd::Backward({loss});
      std::vector<gw::Tensor> grads;
      for (const auto& [name, p] : params) grads.push_back(p.grad());
      absl::StatusOr<std::vector<gw::Tensor>> next = ps.PushPullMany(names, clock, grads).Get();
      if (!next.ok()) return Fail("push/pull", next.status());
      values = *std::move(next);
      ++clock;
      samples += trainers * batch.targets.size(0);
      progress.Step(loss, logits, batch.targets);
    }
    // Evaluate the parameters as the servers hold them after this epoch (eval mode: this
    // trainer's own BatchNorm running statistics, no dropout; 1000 images at a time).
    for (size_t i = 0; i < params.size(); ++i) gw::kernels::CopyInPlace(params[i].second, values[i]);
    test_acc = gw::examples::TestAccuracy(*model, *test);
    progress.Finish(test_acc);
    if (time_to_85 < 0 && test_acc >= 0.85) {
      time_to_85 = elapsed();
      samples_to_85 = static_cast<double>(samples);
    }
    // Every trainer evaluates the same parameters, so all of them stop at the same epoch.
    if (stop_at > 0 && test_acc >= stop_at) break;
  }
  const double secs = elapsed();
  if (const std::string path = absl::GetFlag(FLAGS_save); show && !path.empty()) {
    if (absl::Status s = model->Save(path); !s.ok()) return Fail("cannot save the model", s);
    std::printf("saved the model to %s\n", path.c_str());
  }
  if (show) {
    std::printf("final test accuracy: %.4f (%.1f s, %.0f samples/s over %d trainers)\n", test_acc, secs,
                static_cast<double>(samples) / secs, trainers);
    if (time_to_85 >= 0) std::printf("reached 85%% test accuracy after %.1f s\n", time_to_85);
  }
  if (show && absl::GetFlag(FLAGS_report)) {
    auto line = [](const char* metric, double value, const char* unit) {
      gw::examples::ReportLine("fashion_mnist_ps", metric, value, unit);
    };
    line("time_to_85", time_to_85 >= 0 ? time_to_85 : std::nan(""), "s");
    line("samples_per_s", time_to_85 >= 0 ? samples_to_85 / time_to_85 : static_cast<double>(samples) / secs,
         "samples/s");
    line("final_test_acc", test_acc, "fraction");
  }
  if (absl::Status s = gw::examples::FinalCheckpoint(setup); !s.ok()) return Fail("final checkpoint", s);
  if (absl::Status s = gw::examples::LeaveTables(setup, names, clock); !s.ok()) return Fail("leave the tables", s);
  if (setup.agent->options().join) {
    std::printf("%s: trained %lld steps, test accuracy %.4f\n", setup.agent->self().name.c_str(),
                static_cast<long long>(samples / std::max(1, trainers) / absl::GetFlag(FLAGS_batch_size)), test_acc);
  }
  return gw::examples::Finish(*setup.agent, show, test_acc, absl::GetFlag(FLAGS_min_accuracy));
}

}  // namespace

int main(int argc, char** argv) {
  return gw::examples::Main(
      argc, argv,
      "Parameter-server training of an MLP or a model of the zoo (--model) on Fashion-MNIST; run under `gradwire "
      "launch -n N`.",
      Train,
      [] {
        gw::Generator gen(0);
        std::vector<std::string> tables;
        absl::StatusOr<std::shared_ptr<gw::nn::Module>> model = gw::examples::ExampleModel(absl::GetFlag(FLAGS_model), gen);
        if (model.ok()) {
          for (const auto& [name, p] : (*model)->NamedParameters()) tables.push_back(name);
        }
        return tables;
      },
      [] { return gw::examples::CheckModel(absl::GetFlag(FLAGS_model)); });
}
