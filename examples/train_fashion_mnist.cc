// Trains an MLP 784-256-128-10 on Fashion-MNIST in one process with SGD + momentum and
// reports the test accuracy. The local baseline of the parameter-server job.
//
//   train_fashion_mnist [--epochs=10] [--batch_size=64] [--lr=0.05] [--momentum=0.9]
//                       [--seed=0] [--data_dir=/usr/share/datasets/fashion-mnist]
//                       [--min_accuracy=0.85] [--save=PATH]
//
// Exit status: 0 when the final test accuracy reaches --min_accuracy, 1 when it does not,
// 2 when the data cannot be loaded.
#include <chrono>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "flags.h"
#include "gradwire/gradwire.h"
#include "example_util.h"
#include "fashion_mnist_mlp.h"

ABSL_FLAG(int, epochs, 10, "passes over the training set");
ABSL_FLAG(int, batch_size, 64, "examples per step");
ABSL_FLAG(double, lr, 0.05, "learning rate");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum");
ABSL_FLAG(uint64_t, seed, 0, "seed for initialisation and shuffling");
ABSL_FLAG(std::string, data_dir, gw::data::kFashionMnistDir, "directory with the IDX files");
ABSL_FLAG(double, min_accuracy, 0.85, "exit with status 1 if the test accuracy ends below this");
ABSL_FLAG(std::string, save, "", "write the trained model's state dict to this file");

namespace {

double Evaluate(gw::nn::Module& model, const gw::data::Dataset& test) {
  gw::autograd::NoGradGuard no_grad;
  model.Eval();
  gw::Tensor logits = model.Forward(test.images);
  model.Train();
  return gw::nn::Accuracy(logits, test.labels);
}

}  // namespace

int main(int argc, char** argv) {
  gw::examples::ParseFlags(argc, argv, "Trains an MLP on Fashion-MNIST locally with gradwire.");
  gw::examples::CheckWritable("save", absl::GetFlag(FLAGS_save));
  absl::StatusOr<gw::examples::FashionMnist> data =
      gw::examples::LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), /*show=*/true);
  if (!data.ok()) return gw::examples::Fail("Fashion-MNIST", data.status());
  const gw::data::Dataset* train = &data->train;
  const gw::data::Dataset* test = &data->test;

  gw::Generator gen(absl::GetFlag(FLAGS_seed));
  auto model = gw::examples::FashionMnistMlp(gen);
  gw::optim::Optimizer opt(model->Parameters(),
                           gw::optim::Sgd{.lr = absl::GetFlag(FLAGS_lr),
                                          .momentum = absl::GetFlag(FLAGS_momentum)});
  gw::data::DataLoader loader(*train, absl::GetFlag(FLAGS_batch_size), /*shuffle=*/true, gen);

  std::printf("%s\n%lld parameters, %lld training and %lld test images\n",
              model->ToString().c_str(), static_cast<long long>(model->NumParameters()),
              static_cast<long long>(train->size()), static_cast<long long>(test->size()));
  const auto start = std::chrono::steady_clock::now();
  double test_acc = 0;
  for (int epoch = 1; epoch <= absl::GetFlag(FLAGS_epochs); ++epoch) {
    gw::data::ProgressBar bar(absl::StrFormat("epoch %d/%d", epoch, absl::GetFlag(FLAGS_epochs)),
                              loader.batches_per_epoch());
    const auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0, correct = 0;
    int64_t seen = 0, step = 0;
    gw::data::Batch batch;
    loader.Reset();
    auto fields = [&] {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      return absl::StrFormat("loss=%.4f acc=%.4f %.0f samples/s", loss_sum / std::max<int64_t>(step, 1),
                             correct / std::max<int64_t>(seen, 1), seen / std::max(secs, 1e-9));
    };
    while (loader.Next(&batch)) {
      gw::Tensor logits = model->Forward(batch.inputs);
      gw::Tensor loss = gw::nn::CrossEntropyLoss(logits, batch.targets);
      opt.ZeroGrad();
      gw::autograd::Backward({loss});
      opt.Step();
      loss_sum += loss.item();
      correct += gw::nn::Accuracy(logits, batch.targets) * static_cast<double>(batch.targets.size(0));
      seen += batch.targets.size(0);
      bar.Update(++step, fields());
    }
    test_acc = Evaluate(*model, *test);
    bar.Finish(fields() + absl::StrFormat(" test_acc=%.4f", test_acc));
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("final test accuracy: %.4f (%.1f s, %.0f samples/s)\n", test_acc, secs,
              absl::GetFlag(FLAGS_epochs) * train->size() / secs);
  if (const std::string path = absl::GetFlag(FLAGS_save); !path.empty()) {
    if (absl::Status s = model->Save(path); !s.ok()) {
      std::fprintf(stderr, "error: cannot save the model: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    std::printf("saved the model to %s\n", path.c_str());
  }
  if (test_acc < absl::GetFlag(FLAGS_min_accuracy)) {
    std::fprintf(stderr, "test accuracy %.4f is below the required %.4f\n", test_acc,
                 absl::GetFlag(FLAGS_min_accuracy));
    return 1;
  }
  return 0;
}
