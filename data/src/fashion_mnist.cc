#include "gradwire/data/fashion_mnist.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace gw::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr size_t kMaxFileBytes = size_t{1} << 31;

// Reads a whole file, transparently gunzipping it (zlib passes plain files through).
absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      return absl::DataLossError(absl::StrCat("cannot read '", path, "': ", msg));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxFileBytes) {
      gzclose(f);
      return absl::ResourceExhaustedError(absl::StrCat("'", path, "' is larger than 2 GiB"));
    }
  }
  gzclose(f);
  return out;
}

uint32_t BigEndian32(const std::string& s, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + at);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

absl::StatusOr<Tensor> ReadIdxImages(const std::string& path) {
  absl::StatusOr<std::string> data = ReadMaybeGzip(path);
  if (!data.ok()) return data.status();
  if (data->size() < 16 || BigEndian32(*data, 0) != kImagesMagic) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not an IDX image file"));
  }
  const uint64_t n = BigEndian32(*data, 4), rows = BigEndian32(*data, 8), cols = BigEndian32(*data, 12);
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096 || data->size() - 16 != n * rows * cols) {
    return absl::DataLossError(absl::StrCat("'", path, "' header says ", n, " images of ", rows,
                                            "x", cols, " but holds ", data->size() - 16,
                                            " pixel bytes"));
  }
  Tensor images = Tensor::Empty({static_cast<int64_t>(n), static_cast<int64_t>(rows * cols)});
  float* p = images.data<float>();
  const auto* src = reinterpret_cast<const unsigned char*>(data->data() + 16);
  for (uint64_t i = 0; i < n * rows * cols; ++i) p[i] = static_cast<float>(src[i]) / 255.0f;
  return images;
}

absl::StatusOr<Tensor> ReadIdxLabels(const std::string& path) {
  absl::StatusOr<std::string> data = ReadMaybeGzip(path);
  if (!data.ok()) return data.status();
  if (data->size() < 8 || BigEndian32(*data, 0) != kLabelsMagic) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not an IDX label file"));
  }
  const uint64_t n = BigEndian32(*data, 4);
  if (data->size() - 8 != n) {
    return absl::DataLossError(absl::StrCat("'", path, "' header says ", n, " labels but holds ",
                                            data->size() - 8));
  }
  Tensor labels = Tensor::Empty({static_cast<int64_t>(n)}, DType::kInt64);
  int64_t* p = labels.data<int64_t>();
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>((*data)[8 + i]);
  return labels;
}

absl::StatusOr<Dataset> LoadFashionMnist(Split split, const std::string& dir) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  auto find = [&](const std::string& stem) {
    for (const std::string& name : {stem + ".gz", stem}) {
      const std::string path = dir + "/" + name;
      if (std::filesystem::exists(path)) return path;
    }
    return std::string();
  };
  const std::string images_path = find(prefix + "-images-idx3-ubyte");
  const std::string labels_path = find(prefix + "-labels-idx1-ubyte");
  if (images_path.empty() || labels_path.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "Fashion-MNIST ", prefix, " files not found in ", dir,
        "; install the Debian package dataset-fashion-mnist (apt-get install "
        "dataset-fashion-mnist) or pass the directory holding ", prefix,
        "-images-idx3-ubyte[.gz] and ", prefix, "-labels-idx1-ubyte[.gz]"));
  }
  Dataset ds;
  absl::StatusOr<Tensor> images = ReadIdxImages(images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<Tensor> labels = ReadIdxLabels(labels_path);
  if (!labels.ok()) return labels.status();
  if (images->size(0) != labels->size(0)) {
    return absl::DataLossError(absl::StrCat(images_path, " has ", images->size(0), " images but ",
                                            labels_path, " has ", labels->size(0), " labels"));
  }
  ds.images = *images;
  ds.labels = *labels;
  return ds;
}

}  // namespace gw::data
