// Unit: SummaryWriter, TensorBoard event files written and read back with every record's
// CRCs checked; corrupt and cut files are named with the offset; unwritable places fail
// naming the path.
#include "gradwire/data/summary_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "gradwire/nn/crc32c.h"
#include "scoped_temp_dir.h"

namespace gw::data {
namespace {

using rpc::testing::ScopedTempDir;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

void Spill(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(SummaryWriterTest, ScalarsReadBackWithTheirTagsStepsValuesAndTimes) {
  ScopedTempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string logdir = dir.path() + "/run1";  // made by Open
  absl::StatusOr<std::unique_ptr<SummaryWriter>> w = SummaryWriter::Open(logdir);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string path = (*w)->path();
  EXPECT_TRUE(absl::StartsWith(path, logdir + "/events.out.tfevents.")) << path;
  const absl::Time t0 = absl::FromUnixSeconds(1800000000);
  for (int64_t step = 0; step < 100; ++step) {
    ASSERT_TRUE(
        (*w)->AddScalar("train/loss", 2.0 / static_cast<double>(step + 1), step, t0 + absl::Seconds(step)).ok());
  }
  ASSERT_TRUE((*w)->AddScalar("test/accuracy", 0.8811, 99, t0 + absl::Seconds(100)).ok());
  ASSERT_TRUE((*w)->Close().ok());

  absl::StatusOr<std::vector<ScalarEvent>> events = ReadScalarEvents(path);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 101u);
  for (int64_t step = 0; step < 100; ++step) {
    const ScalarEvent& e = (*events)[static_cast<size_t>(step)];
    EXPECT_EQ(e.tag, "train/loss");
    EXPECT_EQ(e.step, step);
    EXPECT_EQ(e.value, static_cast<float>(2.0 / static_cast<double>(step + 1)));
    EXPECT_EQ(e.wall_time, 1800000000.0 + static_cast<double>(step));
  }
  EXPECT_EQ(events->back().tag, "test/accuracy");
  EXPECT_EQ(events->back().value, 0.8811f);

  // The framing, byte for byte: the first record's length, little-endian, and TFRecord's
  // masked CRC-32C of those 8 bytes.
  const std::string bytes = Slurp(path);
  ASSERT_GT(bytes.size(), 12u);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_LT(length, 64u);  // the file-version event
  const uint32_t crc = nn::Crc32c(bytes.data(), 8);
  const uint32_t masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) stored |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  EXPECT_EQ(stored, masked);
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
}

TEST(SummaryWriterTest, TwoWritersOfOneDirectoryWriteTwoFiles) {
  ScopedTempDir dir;
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<std::unique_ptr<SummaryWriter>> a = SummaryWriter::Open(dir.path());
  absl::StatusOr<std::unique_ptr<SummaryWriter>> b = SummaryWriter::Open(dir.path());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->path(), (*b)->path());
  ASSERT_TRUE((*a)->AddScalar("x", 1, 0).ok());
  ASSERT_TRUE((*b)->AddScalar("x", 2, 0).ok());
  ASSERT_TRUE((*a)->Flush().ok());  // readable while the writer is open
  absl::StatusOr<std::vector<ScalarEvent>> read = ReadScalarEvents((*a)->path());
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 1u);
  EXPECT_EQ(read->front().value, 1.0f);
}

TEST(SummaryWriterTest, CorruptAndCutFilesAreNamedWithTheOffset) {
  ScopedTempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string path;
  {
    absl::StatusOr<std::unique_ptr<SummaryWriter>> w = SummaryWriter::Open(dir.path());
    ASSERT_TRUE(w.ok());
    path = (*w)->path();
    for (int step = 0; step < 3; ++step) ASSERT_TRUE((*w)->AddScalar("loss", step, step).ok());
  }  // closed by the destructor
  const std::string good = Slurp(path);
  ASSERT_TRUE(ReadScalarEvents(path).ok());

  std::string flipped = good;
  flipped[flipped.size() - 6] ^= 0x01;  // inside the last record's event
  Spill(path, flipped);
  absl::StatusOr<std::vector<ScalarEvent>> r = ReadScalarEvents(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), path)) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "CRC does not match")) << r.status();

  Spill(path, good.substr(0, good.size() - 3));
  r = ReadScalarEvents(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "is cut short")) << r.status();

  Spill(path, "not an event file at all");
  EXPECT_EQ(ReadScalarEvents(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadScalarEvents(dir.path() + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(SummaryWriterTest, AnUnwritableLogDirectoryFailsNamingIt) {
  ScopedTempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string file = dir.path() + "/a_file";
  Spill(file, "x");
  absl::StatusOr<std::unique_ptr<SummaryWriter>> w = SummaryWriter::Open(file + "/logs");
  ASSERT_FALSE(w.ok());
  EXPECT_TRUE(absl::StrContains(w.status().message(), file + "/logs")) << w.status();
}

}  // namespace
}  // namespace gw::data
