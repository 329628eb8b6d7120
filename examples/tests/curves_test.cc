// The main job's training curves (--logdir): a short run under `gradwire launch` writes
// one TensorBoard event file whose scalars, read back with every CRC checked, sit at the
// steps the run trained; a log directory that cannot be made stops the job before it
// trains, naming the directory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gradwire/data/summary_writer.h"
#include "scoped_temp_dir.h"

namespace gw::examples {
namespace {

using rpc::testing::ScopedTempDir;

// Runs the main job (1 server, 2 trainers) for `steps` steps with `args`; its exit status.
int RunMainJob(const std::string& args, const std::string& log) {
  const std::string command = absl::StrCat("OMP_NUM_THREADS=1 '", GRADWIRE_CLI, "' launch -n 3 '", PS_FASHION_MNIST,
                                           "' --servers=1 --epochs=1 --min_accuracy=0 ", args, " >'", log, "' 2>&1");
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

TEST(CurvesTest, AShortMainJobWritesItsScalarsAtTheStepsItTrained) {
  ScopedTempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string logdir = dir.path() + "/curves", log = dir.path() + "/job.log";
  ASSERT_EQ(RunMainJob(absl::StrCat("--max_steps=45 --logdir=", logdir), log), 0) << Slurp(log);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(logdir)) files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u) << "only trainer 0 writes curves";
  EXPECT_TRUE(absl::StrContains(Slurp(log), absl::StrCat("training curves: ", files[0]))) << Slurp(log);

  absl::StatusOr<std::vector<data::ScalarEvent>> events = data::ReadScalarEvents(files[0]);
  ASSERT_TRUE(events.ok()) << events.status();
  std::map<std::string, std::vector<int64_t>> steps;
  std::map<std::string, float> last;
  for (const data::ScalarEvent& e : *events) {
    steps[e.tag].push_back(e.step);
    last[e.tag] = e.value;
    EXPECT_TRUE(std::isfinite(e.value)) << e.tag << " at " << e.step;
  }
  std::vector<int64_t> every(45);
  for (int64_t s = 0; s < 45; ++s) every[static_cast<size_t>(s)] = s;
  EXPECT_EQ(steps["train/loss"], every);
  EXPECT_EQ(steps["train/samples_per_s"], (std::vector<int64_t>{19, 39}));
  EXPECT_EQ(steps["train/step_seconds"], (std::vector<int64_t>{19, 39}));
  EXPECT_EQ(steps["train/accuracy"], (std::vector<int64_t>{44}));
  EXPECT_EQ(steps["test/accuracy"], (std::vector<int64_t>{44}));
  EXPECT_EQ(steps.size(), 5u);
  EXPECT_GT(last["train/samples_per_s"], 0);
  EXPECT_GT(last["train/step_seconds"], 0);
  // 45 steps of the MLP reach well above chance, and the curve reports what the job printed.
  EXPECT_GT(last["test/accuracy"], 0.5);
  EXPECT_LT(last["test/accuracy"], 1.0);
  EXPECT_TRUE(absl::StrContains(Slurp(log), absl::StrFormat("final test accuracy: %.4f", last["test/accuracy"])))
      << Slurp(log);
}

TEST(CurvesTest, ALogDirectoryThatCannotBeMadeStopsTheJobNamingIt) {
  ScopedTempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string file = dir.path() + "/a_file", log = dir.path() + "/job.log";
  std::ofstream(file) << "x";
  EXPECT_NE(RunMainJob(absl::StrCat("--max_steps=5 --logdir=", file, "/curves"), log), 0);
  EXPECT_TRUE(absl::StrContains(Slurp(log), file + "/curves")) << Slurp(log);
}

}  // namespace
}  // namespace gw::examples
