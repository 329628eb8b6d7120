// Fashion-MNIST (and MNIST-format) datasets read from IDX files.
//
// Contract
//   - ReadIdx* read the IDX format, plain or gzip-compressed (zlib), validating the magic
//     number and that the header's counts match the bytes present.
//   - Images become float32 [N, rows*cols] scaled to [0, 1]; labels become int64 [N].
//   - LoadFashionMnist reads the four files of the Debian package dataset-fashion-mnist
//     (default directory kFashionMnistDir). When they are missing the error names the
//     directory and the package to install.
#ifndef GRADWIRE_DATA_FASHION_MNIST_H_
#define GRADWIRE_DATA_FASHION_MNIST_H_

#include <string>

#include "absl/status/statusor.h"
#include "gradwire/tensor/tensor.h"

namespace gw::data {

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFashionMnistClasses[] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

struct Dataset {
  Tensor images;  // float32 [N, features]
  Tensor labels;  // int64 [N]
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

enum class Split { kTrain, kTest };

absl::StatusOr<Tensor> ReadIdxImages(const std::string& path);
absl::StatusOr<Tensor> ReadIdxLabels(const std::string& path);
absl::StatusOr<Dataset> LoadFashionMnist(Split split, const std::string& dir = kFashionMnistDir);

}  // namespace gw::data

#endif  // GRADWIRE_DATA_FASHION_MNIST_H_
