// The README's main job survives a parameter server killed mid-run: under
// `gradwire launch --max-restarts 1`, server worker1 (checkpointing twice a second) is
// SIGKILLed once its checkpoint holds the tables; the launcher starts it again under the
// same name, it resumes from its checkpoint, the trainers reconnect to it and the job
// ends with the accuracy it needs. The launcher runs on one simulated host
// (testing::HostNetwork: a private network and a log of its output; needs root and
// iproute2, skipped otherwise; CI runs as root).
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "host_network.h"
#include "scoped_temp_dir.h"

namespace gw::examples {
namespace {

using testing::HostNetwork;
using testing::HostProcess;

// The process whose parent is `parent` and whose environment names it `name`
// (GRADWIRE_WORKER_NAME, set by the launcher); 0 if none.
pid_t FindWorker(pid_t parent, const std::string& name) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string stat_line;
    std::getline(stat, stat_line);
    const size_t close = stat_line.rfind(')');  // "pid (comm) state ppid ..."
    if (close == std::string::npos) continue;
    std::istringstream rest(stat_line.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream environ(entry.path() / "environ");
    std::stringstream vars;
    vars << environ.rdbuf();
    if (vars.str().find("GRADWIRE_WORKER_NAME=" + name + '\0') != std::string::npos) return pid;
  }
  return 0;
}

// Waits (inotify) until `dir/file` is renamed into place with at least `min_bytes`.
bool AwaitCheckpoint(const std::string& dir, const std::string& file, int64_t min_bytes, absl::Time deadline) {
  const int fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return false;
  ::inotify_add_watch(fd, dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE);
  const std::string path = dir + "/" + file;
  bool done = false;
  while (!done && absl::Now() < deadline) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && st.st_size >= min_bytes) {
      done = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()))));
    char events[4096];
    while (::read(fd, events, sizeof events) > 0) {
    }
  }
  ::close(fd);
  return done;
}

TEST(PsRestartTest, TheMainJobSurvivesAServerKilledMidRun) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(1);
  ASSERT_TRUE(network.ok()) << network.status();
  const gw::rpc::testing::ScopedTempDir checkpoints("gradwire_ps_restart");
  ASSERT_TRUE(checkpoints.ok());
  const std::string& dir = checkpoints.path();
  absl::StatusOr<HostProcess*> launcher = (*network)->Start(
      0,
      {GRADWIRE_CLI, "launch", "-n", "4", "--max-restarts", "1", PS_FASHION_MNIST, "--servers=2", "--epochs=2",
       "--min_accuracy=0.80", absl::StrCat("--checkpoint_dir=", dir), "--checkpoint_every_s=0.5",
       "--reconnect_timeout_s=60"},
      {{"OMP_NUM_THREADS", "1"}});
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  // worker1's half of the 784-256-128-10 model with its momentum is about 0.9 MB: a
  // checkpoint that large holds the tables (earlier ones may be empty).
  ASSERT_TRUE(AwaitCheckpoint(dir, "worker1.gwps", 500'000, absl::Now() + absl::Seconds(120)))
      << (*launcher)->output();
  const pid_t server = FindWorker((*launcher)->pid(), "worker1");
  ASSERT_NE(server, 0) << (*launcher)->output();
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  const std::vector<int> codes = HostNetwork::WaitAll({*launcher}, absl::Now() + absl::Seconds(300));
  const std::string out = (*launcher)->output();
  EXPECT_EQ(codes[0], 0) << out;
  EXPECT_NE(out.find("gradwire launch: worker1 was killed by signal 9 (SIGKILL)"), std::string::npos) << out;
  EXPECT_NE(out.find("gradwire launch: restarting worker1 (restart 1 of 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("tables restored from its checkpoint"), std::string::npos) << out;
}

}  // namespace
}  // namespace gw::examples
