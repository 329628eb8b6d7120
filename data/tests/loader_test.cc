// Unit: DataLoader batching, shuffling, sharding; ProgressBar output.
#include "gradwire/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "gradwire/data/progress.h"

namespace gw::data {
namespace {

Dataset Numbers(int64_t n) {
  Dataset ds;
  // Row i is [i, i]: inputs can be matched to their labels.
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.insert(v.end(), {static_cast<float>(i), static_cast<float>(i)});
  ds.images = Tensor::FromVector<float>(v, {n, 2});
  ds.labels = Tensor::Arange(0, static_cast<double>(n));
  return ds;
}

std::vector<int64_t> Epoch(DataLoader& loader, int64_t* batches = nullptr) {
  std::vector<int64_t> seen;
  Batch b;
  int64_t count = 0;
  while (loader.Next(&b)) {
    ++count;
    EXPECT_EQ(b.inputs.size(0), b.targets.size(0));
    for (int64_t v : b.targets.ToVector<int64_t>()) seen.push_back(v);
  }
  if (batches) *batches = count;
  return seen;
}

TEST(DataLoaderTest, EveryExampleOncePerEpochAndReproducibleShuffle) {
  Dataset ds = Numbers(10);
  Generator g1(5), g2(5);
  DataLoader a(ds, 3, true, g1), b(ds, 3, true, g2);
  int64_t batches = 0;
  std::vector<int64_t> ea = Epoch(a, &batches);
  EXPECT_EQ(batches, 4);
  EXPECT_EQ(a.batches_per_epoch(), 4);
  EXPECT_EQ(ea, Epoch(b));
  std::vector<int64_t> sorted = ea;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Tensor::Arange(0, 10).ToVector<int64_t>());
  a.Reset();
  EXPECT_NE(Epoch(a), ea);  // reshuffled
}

TEST(DataLoaderTest, InputsFollowTheirLabels) {
  Dataset ds = Numbers(7);
  Generator gen(1);
  DataLoader l(ds, 4, true, gen);
  Batch b;
  ASSERT_TRUE(l.Next(&b));
  const auto in = b.inputs.ToVector<float>();
  const auto t = b.targets.ToVector<int64_t>();
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(in[i * 2], static_cast<float>(t[i]));
}

TEST(DataLoaderTest, ShardsAreDisjointAndDropLastDrops) {
  Dataset ds = Numbers(11);
  Generator gen(2);
  DataLoader s0(ds, 2, false, gen, /*drop_last=*/true), s1(ds, 2, false, gen);
  s0.Shard(0, 2);
  s1.Shard(1, 2);
  EXPECT_EQ(Epoch(s0), std::vector<int64_t>({0, 2, 4, 6, 8, 10}));  // 6 examples, 3 full batches
  EXPECT_EQ(Epoch(s1), std::vector<int64_t>({1, 3, 5, 7, 9}));
  DataLoader d(ds, 4, false, gen, /*drop_last=*/true);
  EXPECT_EQ(Epoch(d).size(), 8u);  // 11 examples: the partial batch of 3 is dropped
  EXPECT_EQ(d.batches_per_epoch(), 2);
  EXPECT_THROW(s0.Shard(2, 2), Error);
}

TEST(ProgressBarTest, WritesProgressAndFinalLine) {
  std::FILE* f = std::tmpfile();
  ProgressBar bar("epoch 1", 100, f);
  for (int i = 1; i <= 100; ++i) bar.Update(i, "loss=0.5");
  bar.Finish("loss=0.4 acc=0.9");
  std::rewind(f);
  char buf[4096] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const std::string out(buf, n);
  EXPECT_NE(out.find("epoch 1 [####"), std::string::npos) << out;
  EXPECT_NE(out.find("100/100 loss=0.4 acc=0.9"), std::string::npos) << out;
  EXPECT_LT(std::count(out.begin(), out.end(), '\n'), 13);  // not a line per step in logs
}

}  // namespace
}  // namespace gw::data
