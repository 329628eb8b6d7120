// A parameter-server deployment with a sparse first layer: each Fashion-MNIST image
// becomes a bag of sparse feature ids (one per lit pixel: id = pixel * 8 + its intensity
// in eighths, so 6,272 possible ids and ~380 per image), an EmbeddingBag (mean) over
// rows held in a sparse table on the servers, then dense layers 64-128-10 held in
// dense tables. Synchronous steps; the rows are Adagrad-updated on the servers (only the
// rows a step touched), the dense layers SGD with momentum. Run it under the launcher:
//
//   gradwire launch -n 4 ps_embedding_fashion_mnist [--servers=2] [--epochs=3] [--dim=64]
//
// Three epochs reach about 84% test accuracy (the featurisation is a bag of pixel
// intensities: more epochs overfit rather than improve).
//
// Each step a trainer pulls only the rows its batch uses (param_server::SparseEmbedding:
// the batch's distinct ids), looks them up locally with autograd; backward pushes their
// gradient rows, next to the dense gradients (PushPullMany). Trainer 0 shows the progress;
// exit status 1 when the final test accuracy is below --min_accuracy.
#include <chrono>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "epoch_progress.h"
#include "logdir_flag.h"
#include "pixel_bags.h"
#include "ps_job.h"

ABSL_FLAG(int, epochs, 3, "passes over the training set");
ABSL_FLAG(double, min_accuracy, 0.80, "exit with status 1 if the test accuracy ends below this");
ABSL_FLAG(int64_t, dim, 64, "embedding width");
ABSL_FLAG(double, lr, 0.05, "learning rate of the dense layers (SGD)");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum of the dense layers");
ABSL_FLAG(double, embedding_lr, 0.3, "learning rate of the embedding rows (Adagrad)");

namespace {

using gw::Tensor;
using gw::examples::Fail;

int Train(gw::rpc::AgentOptions options, int servers) {
  gw::examples::TrainerSetup setup;
  if (int failed = gw::examples::StartTrainer(options, servers, &setup); failed != 0) return failed;
  const gw::data::Dataset* train = &setup.train;
  const gw::data::Dataset* test = &setup.test;
  const int trainers = setup.trainers, trainer = setup.trainer;
  gw::param_server::Client& ps = *setup.ps;

  const int64_t dim = absl::GetFlag(FLAGS_dim);
  if (absl::Status s = gw::examples::CreatePixelTable(ps, dim, absl::GetFlag(FLAGS_seed), absl::GetFlag(FLAGS_embedding_lr));
      !s.ok()) {
    return Fail("cannot create the embedding table", s);
  }
  gw::Generator gen(absl::GetFlag(FLAGS_seed));
  auto head = gw::examples::PixelHead(dim, gen);
  const gw::nn::NamedTensors params = head->NamedParameters();
  const gw::optim::Sgd sgd{.lr = absl::GetFlag(FLAGS_lr), .momentum = absl::GetFlag(FLAGS_momentum)};
  std::vector<std::string> names;
  std::vector<Tensor> values;
  for (const auto& [name, p] : params) {
    if (absl::Status s = ps.CreateDense(name, p, sgd, gw::param_server::Consistency::kSync); !s.ok()) {
      return Fail("cannot create the dense tables", s);
    }
    names.push_back(name);
  }
  gw::Generator shuffle(absl::GetFlag(FLAGS_seed) + 1 + static_cast<uint64_t>(trainer));
  gw::data::DataLoader loader(*train, absl::GetFlag(FLAGS_batch_size), /*shuffle=*/true, shuffle);
  loader.Shard(trainer, trainers);
  // A job started on a checkpoint continues from its step, with the same data order.
  absl::StatusOr<gw::examples::Resumed> resumed = gw::examples::Resume(setup, loader, absl::GetFlag(FLAGS_epochs));
  if (!resumed.ok()) return Fail("cannot resume the checkpoint", resumed.status());
  int64_t clock = resumed->step;
  gw::param_server::SparseEmbedding embedding(ps, "pixels", clock);
  for (const std::string& name : names) {
    absl::StatusOr<Tensor> v = ps.Pull(name, clock).Get();
    if (!v.ok()) return Fail("pull", v.status());
    values.push_back(*v);
  }
  auto [test_ids, test_offsets] = gw::examples::PixelBags(test->images);
  const Tensor every_id = Tensor::Arange(0, static_cast<double>(gw::examples::kPixelIds));

  const bool show = trainer == 0;
  absl::StatusOr<gw::examples::Curves> curves = gw::examples::Curves::Open(absl::GetFlag(FLAGS_logdir), show, clock);
  if (!curves.ok()) return Fail("--logdir", curves.status());
  if (show) {
    std::printf("EmbeddingBag(%lld ids x %lld, mean) on %d servers -> %s\n%d trainers, batch %d per trainer\n",
                static_cast<long long>(gw::examples::kPixelIds), static_cast<long long>(dim), servers,
                head->ToString().c_str(), trainers, absl::GetFlag(FLAGS_batch_size));
  }
  const auto start = std::chrono::steady_clock::now();
  double test_acc = 0;
  for (int epoch = resumed->first_epoch; epoch <= absl::GetFlag(FLAGS_epochs); ++epoch) {
    gw::examples::EpochProgress progress(show, epoch, absl::GetFlag(FLAGS_epochs), loader.batches_per_epoch(), trainers, /*count_rows=*/true);
    progress.LogTo(&*curves);
    gw::data::Batch batch;
    loader.Reset();
    if (epoch == resumed->first_epoch) gw::examples::SkipBatches(loader, resumed->skip);
    while (loader.Next(&batch)) {
      auto [ids, offsets] = gw::examples::PixelBags(batch.inputs);
      // The rows this batch uses, as of this step (the servers answer once every
      // trainer's push of the previous step was applied); backward pushes their gradient.
      for (size_t i = 0; i < params.size(); ++i) gw::kernels::CopyInPlace(params[i].second, values[i]);
      head->ZeroGrad();
      absl::StatusOr<Tensor> bags = embedding.LookupBag(ids, offsets, gw::nn::BagMode::kMean);
      if (!bags.ok()) return Fail("pull rows", bags.status());
      Tensor logits = head->Forward(*bags);
      Tensor loss = gw::nn::CrossEntropyLoss(logits, batch.targets);
      gw::autograd::Backward({loss});
      std::vector<Tensor> grads;
      for (const auto& [name, p] : params) grads.push_back(p.grad());
      absl::StatusOr<std::vector<Tensor>> next = ps.PushPullMany(names, clock, grads).Get();
      if (!next.ok()) return Fail("push/pull", next.status());
      if (absl::Status s = embedding.Step(); !s.ok()) return Fail("push rows", s);
      values = *std::move(next);
      ++clock;
      progress.Step(loss, logits, batch.targets, embedding.rows_pulled());
    }
    // Evaluate with every row as the servers hold it after this epoch.
    absl::StatusOr<Tensor> table = ps.PullRows("pixels", embedding.clock(), every_id).Get();
    if (!table.ok()) return Fail("pull rows", table.status());
    for (size_t i = 0; i < params.size(); ++i) gw::kernels::CopyInPlace(params[i].second, values[i]);
    {
      gw::autograd::NoGradGuard no_grad;
      test_acc = gw::nn::Accuracy(
          head->Forward(gw::nn::EmbeddingBagLookup(*table, test_ids, test_offsets, gw::nn::BagMode::kMean)),
          test->labels);
    }
    progress.Finish(test_acc);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (show) std::printf("final test accuracy: %.4f (%.1f s)\n", test_acc, secs);
  if (absl::Status s = gw::examples::FinalCheckpoint(setup); !s.ok()) return Fail("final checkpoint", s);
  return gw::examples::Finish(*setup.agent, show, test_acc, absl::GetFlag(FLAGS_min_accuracy));
}

}  // namespace

int main(int argc, char** argv) {
  return gw::examples::Main(
      argc, argv,
      "Parameter-server training with a sparse EmbeddingBag layer on Fashion-MNIST; run under `gradwire launch -n N`.",
      Train);
}
