// Serving the Fashion-MNIST MLP: the other ranks serve the model (dynamic batching), rank 0
// routes requests to them and runs a load generator. Run it under the launcher:
//
//   gradwire launch -n 3 serve_fashion_mnist [--model=PATH] [--clients=64 | --rate=R]
//                                            [--duration_s=10] [--warmup_s=1]
//                                            [--max_batch_size=64] [--max_wait_ms=0]
//                                            [--min_accuracy=0.84] [--show_statistics]
//
// The model is the state dict at --model (scripts/train saves the main job's there); when
// there is no such file, rank 0 trains one quickly (--train_epochs) and saves it there. The
// replicas load it (the file must be readable by them: same host or a shared disk).
// Rank 0 then
//   1. sends each of the 10,000 test images as its own request (--clients at a time) and
//      compares the served predictions with the local model's: the accuracies must be
//      equal (exit status 1 otherwise, or below --min_accuracy);
//   2. loads the replicas for --duration_s, closed loop with --clients clients or open
//      loop at --rate requests/s, with a progress line, and prints throughput and
//      p50/p90/p99 latency as the clients saw them, and each replica's batching.
// Exit status 2 when the data, the model or the group cannot be set up.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "flags.h"
#include "epoch_progress.h"
#include "example_util.h"
#include "fashion_mnist_mlp.h"
#include "gradwire/gradwire.h"

ABSL_FLAG(std::string, model, "", "the model's state dict (trained and saved there first when missing)");
ABSL_FLAG(int, clients, 64, "closed loop: requests in flight, each client sending its next when answered");
ABSL_FLAG(double, rate, 0, "open loop instead: requests per second (Poisson arrivals)");
ABSL_FLAG(double, duration_s, 10, "seconds of measured load");
ABSL_FLAG(double, warmup_s, 1, "seconds of load before measuring");
ABSL_FLAG(int, max_batch_size, 64, "replicas: rows per model call at most");
ABSL_FLAG(double, max_wait_ms, 0, "replicas: how long a batch waits to fill (0: starts when the model is free)");
ABSL_FLAG(int, train_epochs, 2, "epochs of the quick training when there is no model file");
ABSL_FLAG(double, min_accuracy, 0.84, "exit with status 1 if the served test accuracy is below this");
ABSL_FLAG(bool, show_statistics, false, "print the first replica's agent statistics (Prometheus text) at the end");
ABSL_FLAG(uint64_t, seed, 0, "seed for the quick training");
ABSL_FLAG(std::string, data_dir, gw::data::kFashionMnistDir, "directory with the IDX files");

namespace {

using gw::examples::Fail;
constexpr char kModel[] = "fashion_mnist";
constexpr char kModelKey[] = "serve_example/model";   // store: the path replicas load
constexpr char kReadyKey[] = "serve_example/ready/";  // + rank: that replica serves

std::shared_ptr<gw::nn::Module> NewModel() {
  gw::Generator gen(0);
  return gw::examples::FashionMnistMlp(gen);
}

// Trains the MLP for a few epochs in this process (when no model file exists).
std::shared_ptr<gw::nn::Module> TrainQuickly(const gw::data::Dataset& train, const gw::data::Dataset& test) {
  gw::Generator gen(absl::GetFlag(FLAGS_seed));
  auto model = gw::examples::FashionMnistMlp(gen);
  gw::optim::Optimizer opt(model->Parameters(), gw::optim::Sgd{.lr = 0.05, .momentum = 0.9});
  gw::data::DataLoader loader(train, 64, /*shuffle=*/true, gen);
  const int epochs = absl::GetFlag(FLAGS_train_epochs);
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    gw::examples::EpochProgress progress(true, epoch, epochs, loader.batches_per_epoch(), 1);
    gw::data::Batch batch;
    loader.Reset();
    while (loader.Next(&batch)) {
      gw::Tensor logits = model->Forward(batch.inputs);
      gw::Tensor loss = gw::nn::CrossEntropyLoss(logits, batch.targets);
      opt.ZeroGrad();
      gw::autograd::Backward({loss});
      opt.Step();
      progress.Step(loss, logits, batch.targets);
    }
    gw::autograd::NoGradGuard no_grad;
    progress.Finish(gw::nn::Accuracy(model->Forward(test.images), test.labels));
  }
  return model;
}

int64_t ArgMax(const gw::Tensor& row) {
  const std::vector<float> v = row.ToVector<float>();
  return std::max_element(v.begin(), v.end()) - v.begin();
}

// Joins the group with Serving installed (every worker serves or routes).
absl::StatusOr<std::shared_ptr<gw::rpc::Agent>> JoinWithServing(const gw::rpc::AgentOptions& options,
                                                                std::shared_ptr<gw::serve::Serving>* serving) {
  return gw::rpc::Agent::Start(options, [serving](gw::rpc::Agent& a) -> absl::Status {
    absl::StatusOr<std::shared_ptr<gw::serve::Serving>> s = gw::serve::Serving::Install(a);
    if (s.ok()) *serving = *s;
    return s.status();
  });
}

// A replica: loads the model rank 0 names, serves it until every worker is done.
int Replica(gw::rpc::AgentOptions options) {
  options.shutdown_timeout = absl::Hours(24);  // serves as long as rank 0 runs
  std::shared_ptr<gw::serve::Serving> serving;
  auto agent = JoinWithServing(options, &serving);
  if (!agent.ok()) return Fail("cannot join the group", agent.status());
  const std::string self = (*agent)->self().name;
  // Rank 0 may first train the model: wait as long as that takes.
  absl::StatusOr<std::string> path = (*agent)->store().Get(kModelKey, absl::Minutes(30));
  if (!path.ok()) return Fail("no model from rank 0", path.status());
  std::shared_ptr<gw::nn::Module> model = NewModel();
  if (absl::Status s = model->Load(*path); !s.ok()) return Fail("cannot load the model", s);
  gw::serve::ModelConfig config{
      .name = kModel,
      .input_shape = {784},
      .batching = {.max_batch_size = absl::GetFlag(FLAGS_max_batch_size),
                   .max_wait = absl::Microseconds(absl::GetFlag(FLAGS_max_wait_ms) * 1e3)},
      .factory = NewModel};
  const std::string version = std::filesystem::path(*path).filename().string();
  if (absl::Status s = serving->Serve(config, model, version); !s.ok()) return Fail("cannot serve", s);
  std::printf("%s: serving '%s' (version %s, batches of at most %d rows)\n", self.c_str(), kModel, version.c_str(),
              absl::GetFlag(FLAGS_max_batch_size));
  std::fflush(stdout);
  const std::string ready = absl::StrCat(kReadyKey, (*agent)->self().rank);
  if (absl::Status s = (*agent)->store().Set(ready, "1"); !s.ok()) return Fail("store", s);
  // Serves until every worker has reached shutdown (rank 0, when it is done).
  absl::Status s = (*agent)->Shutdown();
  return s.ok() ? 0 : Fail("shutdown", s);
}

// Rank 0: the model, the accuracy check, the load.
int Client(const gw::rpc::AgentOptions& options) {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  auto test = gw::data::LoadFashionMnist(gw::data::Split::kTest, dir);
  if (!test.ok()) return Fail("test data", test.status());
  std::string path = absl::GetFlag(FLAGS_model);
  const bool temporary = path.empty();  // then removed at the end
  if (temporary) path = absl::StrCat(std::filesystem::temp_directory_path().string(), "/serve_fashion_mnist_", getpid(), ".gwtf");
  std::shared_ptr<gw::nn::Module> local = NewModel();
  if (std::filesystem::exists(path)) {
    if (absl::Status s = local->Load(path); !s.ok()) return Fail("cannot load the model", s);
    std::printf("model: %s\n", path.c_str());
  } else {
    gw::examples::CheckWritable("model", path);
    std::printf("no model at %s: training one for %d epochs\n", path.c_str(), absl::GetFlag(FLAGS_train_epochs));
    std::fflush(stdout);
    auto train = gw::data::LoadFashionMnist(gw::data::Split::kTrain, dir);
    if (!train.ok()) return Fail("training data", train.status());
    local = TrainQuickly(*train, *test);
    if (absl::Status s = local->Save(path); !s.ok()) return Fail("cannot save the model", s);
    std::printf("saved the model to %s\n", path.c_str());
  }
  std::vector<int64_t> local_pred(static_cast<size_t>(test->size()));
  double local_acc = 0;
  {
    gw::autograd::NoGradGuard no_grad;
    const gw::Tensor logits = local->Forward(test->images);
    local_acc = gw::nn::Accuracy(logits, test->labels);
    for (int64_t i = 0; i < test->size(); ++i) local_pred[static_cast<size_t>(i)] = ArgMax(gw::kernels::Narrow(logits, 0, i, 1));
  }

  std::shared_ptr<gw::serve::Serving> serving;
  auto agent = JoinWithServing(options, &serving);
  if (!agent.ok()) return Fail("cannot join the group", agent.status());
  if (absl::Status s = (*agent)->store().Set(kModelKey, path); !s.ok()) return Fail("store", s);
  absl::StatusOr<gw::serve::Router> router = gw::serve::Router::Create(serving, kModel);
  if (!router.ok()) return Fail("cannot route", router.status());
  // A replica's Serve returns once every worker (this one too) knows it serves.
  const size_t replicas = (*agent)->workers().size() - 1;
  for (size_t r = 1; r <= replicas; ++r) {
    if (absl::StatusOr<std::string> ready = (*agent)->store().Get(absl::StrCat(kReadyKey, r), absl::Minutes(2));
        !ready.ok()) {
      return Fail(absl::StrCat("waiting for replica ", r, " (see its error above)").c_str(), ready.status());
    }
  }
  const int clients = absl::GetFlag(FLAGS_clients);
  const double rate = absl::GetFlag(FLAGS_rate);
  std::printf("%zu replicas serve '%s'\n", replicas, kModel);

  // 1. The test set, one request per image.
  std::vector<int64_t> served_pred(static_cast<size_t>(test->size()), -1);
  {
    gw::data::ProgressBar bar("test set", test->size(), stdout);
    gw::serve::LoadOptions o{.clients = std::max(clients, 1), .duration = absl::ZeroDuration(), .requests = test->size()};
    o.progress = [&](const gw::serve::LoadProgress& p) { bar.Update(p.answered + p.failed, absl::StrFormat("%.0f req/s", p.recent_rps)); };
    gw::serve::LoadReport r = gw::serve::RunLoad(
        *router, o, [&](int64_t i) { return gw::kernels::Narrow(test->images, 0, i, 1); },
        [&](int64_t i, const gw::serve::Prediction& p) { served_pred[static_cast<size_t>(i)] = ArgMax(p.output); });
    bar.Finish();
    if (r.failed > 0) return Fail("serving the test set", r.first_error);
  }
  int64_t correct = 0, differ = 0;
  const std::vector<int64_t> labels = test->labels.ToVector<int64_t>();
  for (size_t i = 0; i < labels.size(); ++i) {
    correct += served_pred[i] == labels[i] ? 1 : 0;
    differ += served_pred[i] != local_pred[i] ? 1 : 0;
  }
  const double served_acc = static_cast<double>(correct) / static_cast<double>(labels.size());
  std::printf("served test accuracy: %.4f (the local model: %.4f; %lld of %zu predictions differ)\n", served_acc,
              local_acc, static_cast<long long>(differ), labels.size());

  // 2. The load.
  gw::serve::LoadOptions o{.clients = rate > 0 ? 0 : clients,
                           .rate = rate,
                           .warmup = absl::Seconds(absl::GetFlag(FLAGS_warmup_s)),
                           .duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s))};
  const std::string loop = rate > 0 ? absl::StrFormat("open loop at %.0f requests/s", rate)
                                    : absl::StrFormat("closed loop, %d clients", clients);
  std::printf("load: %s, %g s warm-up + %g s measured\n", loop.c_str(), absl::GetFlag(FLAGS_warmup_s),
              absl::GetFlag(FLAGS_duration_s));
  const bool tty = isatty(fileno(stdout)) != 0;
  o.progress = [&](const gw::serve::LoadProgress& p) {
    std::printf(tty ? "\r%s\033[K" : "%s\n", p.ToString().c_str());
    std::fflush(stdout);
  };
  o.progress_every = tty ? absl::Milliseconds(250) : absl::Seconds(1);
  const gw::serve::LoadReport report = gw::serve::RunLoad(
      *router, o, [&](int64_t i) { return gw::kernels::Narrow(test->images, 0, i % test->size(), 1); });
  if (tty) std::printf("\n");
  std::printf("%s: %s\n", loop.c_str(), report.ToString().c_str());
  for (const std::string& replica : router->replicas()) {
    absl::StatusOr<gw::serve::ModelStats> stats = router->ReplicaStats(replica);
    if (stats.ok()) std::printf("  %s\n", stats->ToString().c_str());
  }
  if (absl::GetFlag(FLAGS_show_statistics) && !router->replicas().empty()) {
    absl::StatusOr<std::vector<gw::rpc::Sample>> samples =
        (*agent)->StatisticsOf(router->replicas().front()).Get(absl::Seconds(10));
    if (samples.ok()) std::printf("statistics of %s:\n%s", router->replicas().front().c_str(), gw::rpc::ToText(*samples).c_str());
  }
  const absl::Status shutdown = (*agent)->Shutdown();
  if (temporary) std::filesystem::remove(path);
  if (!shutdown.ok()) return Fail("shutdown", shutdown);
  if (!report.first_error.ok()) return Fail("under load", report.first_error);
  if (served_acc != local_acc) {
    std::fprintf(stderr, "the served accuracy %.4f differs from the local model's %.4f\n", served_acc, local_acc);
    return 1;
  }
  if (served_acc < absl::GetFlag(FLAGS_min_accuracy)) {
    std::fprintf(stderr, "served test accuracy %.4f is below the required %.4f\n", served_acc,
                 absl::GetFlag(FLAGS_min_accuracy));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gw::examples::ParseFlags(
      argc, argv, "Serves the Fashion-MNIST MLP on replicas and loads it; run under `gradwire launch -n N` (N >= 2).");
  absl::StatusOr<gw::rpc::AgentOptions> options = gw::rpc::AgentOptions::FromEnv();
  if (!options.ok()) return Fail("not started by a launcher", options.status());
  if (options->world_size < 2) {
    std::fprintf(stderr, "error: needs at least 2 workers (rank 0 sends requests, the others serve): "
                         "gradwire launch -n 3 serve_fashion_mnist\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_clients) < 1 && absl::GetFlag(FLAGS_rate) <= 0) {
    std::fprintf(stderr, "error: --clients must be at least 1 (or --rate positive)\n");
    return 2;
  }
  options->start_timeout = absl::Minutes(5);  // rank 0 loads data first
  return options->rank == 0 ? Client(*options) : Replica(*options);
}
