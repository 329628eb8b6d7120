// The README's main job and its checkpoints, run as a user runs it (the launcher on one
// simulated host, testing::HostNetwork: a private network and a log of its output; needs
// root and iproute2, skipped otherwise; CI runs as root):
//   - a parameter server killed mid-run: under `gradwire launch --max-restarts 1`, server
//     worker1 is SIGKILLed once a checkpoint version holds the tables; the launcher starts
//     it again under the same name, it restores the version, the trainers reconnect to it
//     and the job ends with the accuracy it needs;
//   - the whole job killed mid-epoch and started again with the same command: it resumes
//     the newest version at its step and ends with the model, bit for bit, of a run that
//     was never interrupted; started once more, the finished job refuses to train on;
//   - its parameter server frozen mid-run (SIGSTOP; heartbeats off, so that the trainers
//     keep waiting): `gradwire debug` names it at the root of the trainers' waits.
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
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

// The step of the newest complete checkpoint version in `dir` (-1: none), read from its
// MANIFEST ("step": N).
int64_t NewestStep(const std::string& dir) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& version : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream manifest(version.path() / "MANIFEST");
    std::stringstream text;
    text << manifest.rdbuf();
    const std::string s = text.str();
    const size_t at = s.find("\"step\": ");
    int64_t step = 0;
    if (at != std::string::npos && absl::SimpleAtoi(s.substr(at + 8, s.find_first_of(",\n", at) - at - 8), &step)) {
      newest = std::max(newest, step);
    }
  }
  return newest;
}

// Waits (inotify on `dir`: a version's directory appears when it is cut) until a complete
// version of at least `min_step` is there.
bool AwaitVersion(const std::string& dir, int64_t min_step, absl::Time deadline) {
  const int fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return false;
  ::inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_MOVED_TO);
  bool done = false;
  while (!done && absl::Now() < deadline) {
    if (NewestStep(dir) >= min_step) {
      done = true;
      break;
    }
    // A manifest lands inside a version's directory, which this watch does not see: look
    // again at least every 50 ms.
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()), 0, 50)));
    char events[4096];
    while (::read(fd, events, sizeof events) > 0) {
    }
  }
  ::close(fd);
  return done;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
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
  // A version cut after the first steps holds the tables.
  ASSERT_TRUE(AwaitVersion(dir, 10, absl::Now() + absl::Seconds(120))) << (*launcher)->output();
  const pid_t server = FindWorker((*launcher)->pid(), "worker1");
  ASSERT_NE(server, 0) << (*launcher)->output();
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  const std::vector<int> codes = HostNetwork::WaitAll({*launcher}, absl::Now() + absl::Seconds(300));
  const std::string out = (*launcher)->output();
  EXPECT_EQ(codes[0], 0) << out;
  EXPECT_NE(out.find("gradwire launch: worker1 was killed by signal 9 (SIGKILL)"), std::string::npos) << out;
  EXPECT_NE(out.find("gradwire launch: restarting worker1 (restart 1 of 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("worker1: serving parameters (restored checkpoint version"), std::string::npos) << out;
}

TEST(PsRestartTest, AJobKilledMidEpochResumesToTheModelOfAnUninterruptedRun) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(1);
  ASSERT_TRUE(network.ok()) << network.status();
  const gw::rpc::testing::ScopedTempDir scratch("gradwire_ps_resume");
  ASSERT_TRUE(scratch.ok());
  const std::string dir = scratch.path() + "/ckpt";
  std::filesystem::create_directories(dir);
  auto launch = [&](const std::vector<std::string>& more) {
    std::vector<std::string> argv = {GRADWIRE_CLI, "launch", "-n", "4", PS_FASHION_MNIST, "--servers=2", "--epochs=1",
                                     "--min_accuracy=0.80"};
    argv.insert(argv.end(), more.begin(), more.end());
    absl::StatusOr<HostProcess*> p = (*network)->Start(0, argv, {{"OMP_NUM_THREADS", "1"}});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  };
  const absl::Duration kRun = absl::Seconds(300);
  // The run that is not interrupted (and cuts no checkpoints).
  HostProcess* straight = launch({absl::StrCat("--save=", scratch.path(), "/straight.gwt")});
  ASSERT_NE(straight, nullptr);
  ASSERT_EQ(HostNetwork::WaitAll({straight}, absl::Now() + kRun)[0], 0) << straight->output();
  // The same job cutting a version every 0.3 s, killed (the launcher, and with it every
  // worker) once a version past step 100 of the 469 of the epoch is complete.
  const std::vector<std::string> checkpointed = {absl::StrCat("--checkpoint_dir=", dir), "--checkpoint_every_s=0.3",
                                                 absl::StrCat("--save=", scratch.path(), "/resumed.gwt")};
  HostProcess* crashed = launch(checkpointed);
  ASSERT_NE(crashed, nullptr);
  ASSERT_TRUE(AwaitVersion(dir, 100, absl::Now() + kRun)) << crashed->output();
  crashed->Kill();
  const int64_t cut = NewestStep(dir);
  ASSERT_LT(cut, 469) << "killed mid-epoch";
  // The same command again: it resumes the newest version.
  HostProcess* resumed = launch(checkpointed);
  ASSERT_NE(resumed, nullptr);
  ASSERT_EQ(HostNetwork::WaitAll({resumed}, absl::Now() + kRun)[0], 0) << resumed->output();
  const std::string out = resumed->output();
  EXPECT_NE(out.find("restored checkpoint version"), std::string::npos) << out;
  EXPECT_NE(out.find("resuming checkpoint version"), std::string::npos) << out;
  EXPECT_NE(out.find("final checkpoint: version"), std::string::npos) << out;
  const std::string a = ReadAll(scratch.path() + "/straight.gwt"), b = ReadAll(scratch.path() + "/resumed.gwt");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the resumed job's model differs from the uninterrupted run's (resumed at step >= " << cut
                      << ")";
  EXPECT_EQ(NewestStep(dir), 469) << "the final checkpoint holds the last step";
  // Once more: the checkpoint holds every step of --epochs=1; the job refuses to train on.
  HostProcess* again = launch(checkpointed);
  ASSERT_NE(again, nullptr);
  EXPECT_NE(HostNetwork::WaitAll({again}, absl::Now() + kRun)[0], 0) << again->output();
  EXPECT_NE(again->output().find("already holds every step of --epochs=1"), std::string::npos) << again->output();
  EXPECT_NE(again->output().find("--fresh"), std::string::npos) << again->output();
}

TEST(PsRestartTest, GradwireDebugNamesAFrozenParameterServer) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(1);
  ASSERT_TRUE(network.ok()) << network.status();
  // worker0 serves the parameters, worker1 and worker2 train; worker k's metrics endpoint
  // (and its waits) on port 9400 + k.
  absl::StatusOr<HostProcess*> launcher = (*network)->Start(
      0, {GRADWIRE_CLI, "launch", "-n", "3", "--metrics-port", "9400", PS_FASHION_MNIST, "--servers=1", "--epochs=1"},
      {{"OMP_NUM_THREADS", "1"}, {"GRADWIRE_HEARTBEAT_INTERVAL", "0"}});
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  ASSERT_TRUE((*launcher)->AwaitText("1 servers, 2 trainers", absl::Now() + absl::Seconds(120)))
      << (*launcher)->output();
  const pid_t server = FindWorker((*launcher)->pid(), "worker0");
  ASSERT_NE(server, 0) << (*launcher)->output();
  ASSERT_EQ(::kill(server, SIGSTOP), 0);
  // The trainers' next push-pull waits on the frozen server: ask until both wait on it.
  std::string report;
  for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    absl::StatusOr<HostProcess*> debug = (*network)->Start(
        0, {GRADWIRE_CLI, "debug", "--metrics-port", "9400", "-n", "3", "--timeout", "1", "--min-wait", "0"}, {});
    ASSERT_TRUE(debug.ok()) << debug.status();
    EXPECT_EQ(HostNetwork::WaitAll({*debug}, absl::Now() + absl::Seconds(10))[0], 0) << (*debug)->output();
    report = (*debug)->output();
    if (report.find("worker1 waits on worker0") != std::string::npos &&
        report.find("worker2 waits on worker0") != std::string::npos) {
      break;
    }
  }
  ::kill(server, SIGCONT);
  (*launcher)->Kill();
  std::fputs(report.c_str(), stdout);
  EXPECT_NE(report.find("At the root: worker0"), std::string::npos) << report;
  EXPECT_NE(report.find("worker0 did not answer ("), std::string::npos) << report;
  EXPECT_NE(report.find("it is frozen"), std::string::npos) << report;
  EXPECT_NE(report.find("worker1 waits on worker0 for call '__ps."), std::string::npos) << report;
  EXPECT_NE(report.find("worker2 waits on worker0 for call '__ps."), std::string::npos) << report;
}

}  // namespace
}  // namespace gw::examples
