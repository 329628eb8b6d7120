// Unit: IDX readers and the Fashion-MNIST loader, on the real Debian dataset files.
#include "gradwire/data/fashion_mnist.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gradwire/tensor/kernels.h"

namespace gw::data {
namespace {

TEST(FashionMnistTest, LoadsTheDebianDataset) {
  auto train = LoadFashionMnist(Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->images.sizes(), Shape({60000, 784}));
  EXPECT_EQ(train->labels.sizes(), Shape({60000}));
  auto test = LoadFashionMnist(Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(kernels::MaxAll(test->labels).item<int64_t>(), 9);
  EXPECT_EQ(kernels::MaxAll(kernels::Neg(test->labels)).item<int64_t>(), 0);
  EXPECT_LE(kernels::MaxAll(train->images).item(), 1.0);
  EXPECT_GE(kernels::MaxAll(kernels::Neg(train->images)).item(), -0.0);
  // Known statistic of Fashion-MNIST: mean pixel intensity about 0.286.
  EXPECT_NEAR(kernels::Mean(train->images).item(), 0.286, 0.002);
  // Balanced classes: 6000 of each in train.
  Tensor counts = kernels::IndexAdd(Tensor::Zeros({10}, DType::kInt64), 0, train->labels,
                                    Tensor::Ones({60000}, DType::kInt64));
  EXPECT_EQ(counts.ToVector<int64_t>(), std::vector<int64_t>(10, 6000));
}

TEST(FashionMnistTest, MissingDirectoryNamesThePackage) {
  auto r = LoadFashionMnist(Split::kTrain, "/nonexistent");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("dataset-fashion-mnist"), std::string::npos) << r.status();
}

TEST(FashionMnistTest, ReadsPlainIdxAndRejectsCorruptHeaders) {
  // Removed at the end, however the test ends.
  struct RemovedAtEnd {
    std::string path;
    ~RemovedAtEnd() { std::remove(path.c_str()); }
  } const file{::testing::TempDir() + "gw_idx_" + std::to_string(::getpid())};
  const std::string& path = file.path;
  auto write = [&](std::string bytes) { std::ofstream(path, std::ios::binary) << bytes; };
  // 2 images of 2x3.
  write(std::string("\0\0\x08\x03\0\0\0\x02\0\0\0\x02\0\0\0\x03", 16) +
        std::string("\x00\xff\x80\x01\x02\x03\x04\x05\x06\x07\x08\x09", 12));
  auto images = ReadIdxImages(path);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->sizes(), Shape({2, 6}));
  EXPECT_FLOAT_EQ(images->ToVector<float>()[1], 1.0f);
  write(std::string("\0\0\x08\x03\0\0\0\x09\0\0\0\x02\0\0\0\x03", 16) + "abc");  // truncated
  EXPECT_EQ(ReadIdxImages(path).status().code(), absl::StatusCode::kDataLoss);
  write(std::string("\0\0\x08\x01\0\0\0\x02\x05\x07", 10));
  EXPECT_EQ(ReadIdxLabels(path)->ToVector<int64_t>(), std::vector<int64_t>({5, 7}));
  EXPECT_FALSE(ReadIdxImages(path).ok());  // label file is not an image file
}

}  // namespace
}  // namespace gw::data
