// A hybrid job (PyTorch's "combining DDP with the distributed RPC framework"): the dense
// layers 64-128-10 are replicated on the trainers with DistributedDataParallel, the
// embedding table in front of them (an EmbeddingBag, mean, over 6,272 pixel-intensity ids:
// pixel_bags.h) is held on parameter servers. Each step, in one distributed-autograd
// context, a trainer pulls the rows its batch uses, runs the replica, and runs one
// backward pass that both allreduces the dense gradients (DDP buckets) and pushes the
// rows' gradients to the servers (param_server::SparseEmbedding); then one step: the
// DistributedOptimizer applies the averaged dense gradients (SGD with momentum) while
// the servers apply the rows' (Adagrad, synchronous: averaged over the trainers).
//
//   gradwire launch -n 4 hybrid_fashion_mnist [--servers=2] [--epochs=3] [--dim=64]
//
// The first --servers ranks serve the table, the others are DDP replicas. Three epochs
// reach about 85% test accuracy. Trainer 0 shows the progress; exit status 1 when the
// final test accuracy is below --min_accuracy.
#include <chrono>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "epoch_progress.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "logdir_flag.h"
#include "pixel_bags.h"
#include "ps_job.h"

ABSL_FLAG(int, epochs, 3, "passes over the training set");
ABSL_FLAG(double, min_accuracy, 0.84, "exit with status 1 if the test accuracy ends below this");
ABSL_FLAG(int64_t, dim, 64, "embedding width");
ABSL_FLAG(double, lr, 0.1, "learning rate of the dense layers (SGD)");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum of the dense layers");
ABSL_FLAG(double, embedding_lr, 0.3, "learning rate of the embedding rows (Adagrad)");

namespace {

using gw::Tensor;
using gw::examples::Fail;

int Train(gw::rpc::AgentOptions options, int servers) {
  std::shared_ptr<gw::collectives::Collectives> collectives;
  std::shared_ptr<gw::dist_autograd::DistAutograd> engine;
  gw::examples::TrainerSetup setup;
  if (int failed = gw::examples::StartTrainer(options, servers, &setup,
                                              [&](gw::rpc::Agent& a) -> absl::Status {
                                                if (absl::Status s = gw::rpc::Assign(
                                                        gw::collectives::Collectives::Install(a), collectives);
                                                    !s.ok()) {
                                                  return s;
                                                }
                                                return gw::rpc::Assign(gw::dist_autograd::DistAutograd::Install(a),
                                                                       engine);
                                              });
      failed != 0) {
    return failed;
  }
  const int trainers = setup.trainers, trainer = setup.trainer;
  gw::rpc::Agent& agent = *setup.agent;
  gw::param_server::Client& ps = *setup.ps;

  // The table, on the servers.
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  if (absl::Status s = gw::examples::CreatePixelTable(ps, dim, absl::GetFlag(FLAGS_seed), absl::GetFlag(FLAGS_embedding_lr));
      !s.ok()) {
    return Fail("cannot create the embedding table", s);
  }
  // Its dense layers live on the trainers (DDP), which the servers' checkpoints do not
  // hold: a job started on a checkpoint would pair restored rows with new layers.
  if (absl::StatusOr<gw::param_server::ResumePoint> point = ps.Resume(); !point.ok() || point->version > 0) {
    return Fail("cannot resume",
                point.ok() ? absl::FailedPreconditionError(absl::StrCat(
                                 "the servers restored checkpoint version ", point->version, " at step ", point->step,
                                 ", but this example keeps its dense layers on the trainers (DDP) and checkpoints "
                                 "hold only the servers' tables: start it with --fresh (or without --checkpoint_dir)"))
                           : point.status());
  }
  gw::param_server::SparseEmbedding embedding(ps, "pixels");

  // The dense layers, one replica per trainer (the process group of the trainers only).
  std::vector<int> trainer_ranks;
  for (int t = 0; t < trainers; ++t) trainer_ranks.push_back(servers + t);
  auto group = collectives->NewGroup(trainer_ranks);
  if (!group.ok()) return Fail("cannot make the trainers' process group", group.status());
  gw::Generator gen(absl::GetFlag(FLAGS_seed) + static_cast<uint64_t>(trainer));  // trainer 0's wins
  auto head = gw::examples::PixelHead(dim, gen);
  auto ddp = gw::parallel::DistributedDataParallel::Create(head, *group);
  if (!ddp.ok()) return Fail("cannot replicate the dense layers", ddp.status());
  std::vector<gw::rpc::RRef<Tensor>> params;
  for (const Tensor& p : (*ddp)->Parameters()) params.push_back(agent.Own(p));
  auto opt = gw::dist_autograd::DistributedOptimizer::Create(
      agent, gw::optim::Sgd{.lr = absl::GetFlag(FLAGS_lr), .momentum = absl::GetFlag(FLAGS_momentum)}, params);
  if (!opt.ok()) return Fail("cannot create the optimizer", opt.status());

  auto [test_ids, test_offsets] = gw::examples::PixelBags(setup.test.images);
  gw::Generator shuffle(absl::GetFlag(FLAGS_seed) + 1 + static_cast<uint64_t>(trainer));
  gw::data::DataLoader loader(setup.train, absl::GetFlag(FLAGS_batch_size), /*shuffle=*/true, shuffle);
  loader.Shard(trainer, trainers);
  const bool show = trainer == 0;
  absl::StatusOr<gw::examples::Curves> curves = gw::examples::Curves::Open(absl::GetFlag(FLAGS_logdir), show);
  if (!curves.ok()) return Fail("--logdir", curves.status());
  if (show) {
    std::printf("EmbeddingBag(%lld ids x %lld, mean) on %d servers -> DDP %s on %d trainers, batch %d per trainer\n",
                static_cast<long long>(gw::examples::kPixelIds), static_cast<long long>(dim), servers,
                head->ToString().c_str(), trainers, absl::GetFlag(FLAGS_batch_size));
    std::fflush(stdout);
  }
  const auto start = std::chrono::steady_clock::now();
  double test_acc = 0;
  for (int epoch = 1; epoch <= absl::GetFlag(FLAGS_epochs); ++epoch) {
    gw::examples::EpochProgress progress(show, epoch, absl::GetFlag(FLAGS_epochs), loader.batches_per_epoch(), trainers, /*count_rows=*/true);
    progress.LogTo(&*curves);
    gw::data::Batch batch;
    loader.Reset();
    while (loader.Next(&batch)) {
      auto [ids, offsets] = gw::examples::PixelBags(batch.inputs);
      Tensor logits, loss;
      {
        gw::dist_autograd::Context ctx(*engine);
        absl::StatusOr<Tensor> bags = embedding.LookupBag(ids, offsets, gw::nn::BagMode::kMean);
        if (!bags.ok()) return Fail("pull rows", bags.status());
        logits = (*ddp)->Forward(*bags);
        loss = gw::nn::CrossEntropyLoss(logits, batch.targets);
        // One backward: DDP's allreduces and the rows' push happen inside it.
        if (absl::Status s = ctx.Backward({loss}); !s.ok()) return Fail("backward", s);
        // One step: the dense layers here, the rows on the servers.
        if (absl::Status s = (*opt)->Step(ctx); !s.ok()) return Fail("optimizer step", s);
        if (absl::Status s = embedding.Step(); !s.ok()) return Fail("push rows", s);
      }
      progress.Step(loss, logits, batch.targets, embedding.rows_pulled());
    }
    {
      gw::autograd::NoGradGuard no_grad;  // every test row as the servers hold it now
      absl::StatusOr<Tensor> bags = embedding.LookupBag(test_ids, test_offsets, gw::nn::BagMode::kMean);
      if (!bags.ok()) return Fail("pull rows", bags.status());
      test_acc = gw::nn::Accuracy((*ddp)->Forward(*bags), setup.test.labels);
    }
    progress.Finish(test_acc);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (show) std::printf("final test accuracy: %.4f (%.1f s)\n", test_acc, secs);
  return gw::examples::Finish(agent, show, test_acc, absl::GetFlag(FLAGS_min_accuracy));
}

}  // namespace

int main(int argc, char** argv) {
  return gw::examples::Main(
      argc, argv,
      "Hybrid training on Fashion-MNIST: DDP replicas of the dense layers, an embedding table on parameter servers; "
      "run under `gradwire launch -n N`.",
      Train);
}
