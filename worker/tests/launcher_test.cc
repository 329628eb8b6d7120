// Unit: Launch() with real processes (/bin/sh scripts): environment, prefixed output,
// failure propagation and cleanup, signals; the `gradwire` command line.
#include "gradwire/worker/launcher.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>
#include <thread>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gradwire/rpc/metrics_endpoint.h"
#include "gradwire/rpc/security.h"
#include "scoped_env.h"

#ifdef GRADWIRE_RPC_TEST_WORKER
#include "child_process.h"
#include "etcd_server.h"
#include "gradwire/rpc/store.h"
#endif

extern char** environ;

namespace gw::worker {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string ReadAll(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  return text;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Output files for Launch(); tmpfile()s are deleted when closed.
struct Capture {
  Capture() : out(std::tmpfile()), err(std::tmpfile()) {}
  ~Capture() {
    std::fclose(out);
    std::fclose(err);
  }
  std::string Out() { return ReadAll(out); }
  std::string Err() { return ReadAll(err); }
  std::FILE* out;
  std::FILE* err;
};

// A fresh directory for pid and marker files, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/gradwire_worker_test.XXXXXX";
    path_ = ::mkdtemp(name);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Read(const std::string& file) const {
    std::ifstream in(path_ + "/" + file);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string path_;
};

LaunchOptions Shell(int n, const std::string& script) {
  LaunchOptions options;
  options.num_workers = n;
  options.command = {"/bin/sh", "-c", script};
  return options;
}

// Gone means no such process: not running, and not a zombie either (Launch() reaps the
// orphans of its workers' process groups as a child subreaper).
bool IsGone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

std::vector<pid_t> Pids(const std::string& text) {
  std::vector<pid_t> pids;
  std::istringstream in(text);
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

TEST(LaunchTest, AllSucceedWithEnvironmentAndPrefixedOutput) {
  LaunchOptions options = Shell(
      3,
      "echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
      "addr=$MASTER_ADDR port=$MASTER_PORT name=$GRADWIRE_WORKER_NAME extra=$EXTRA\"; "
      "echo \"stderr of $RANK\" >&2; read line || echo \"stdin empty $RANK\"");
  options.extra_env["EXTRA"] = "x y";
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0);
  EXPECT_EQ(result->failed_worker, "");

  std::map<int, std::string> ports;
  int env_lines = 0;
  for (const std::string& line : Lines(cap.Out())) {
    ASSERT_EQ(line.rfind("[worker", 0), 0u) << line;
    const int rank = line[7] - '0';
    const std::string prefix = "[worker" + std::to_string(rank) + "] ";
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
    const std::string body = line.substr(prefix.size());
    if (body.rfind("stdin empty", 0) == 0) {
      EXPECT_EQ(body, "stdin empty " + std::to_string(rank));
      continue;
    }
    ++env_lines;
    const std::string r = std::to_string(rank);
    EXPECT_NE(body.find("rank=" + r + " local=" + r + " world=3 lws=3 addr=127.0.0.1 port="),
              std::string::npos)
        << body;
    EXPECT_NE(body.find(" name=worker" + r + " extra=x y"), std::string::npos) << body;
    const size_t p = body.find("port=") + 5;
    ports[rank] = body.substr(p, body.find(' ', p) - p);
  }
  EXPECT_EQ(env_lines, 3);
  ASSERT_EQ(ports.size(), 3u);
  EXPECT_EQ(ports[0], ports[1]);
  EXPECT_EQ(ports[0], ports[2]);
  EXPECT_GT(std::stoi(ports[0]), 0);

  const std::string err = cap.Err();
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = std::to_string(rank);
    EXPECT_NE(err.find("[worker" + r + "] stderr of " + r + "\n"), std::string::npos) << err;
  }
}

// --metrics-port P: worker k serves its metrics at P + k while the job runs (the test
// scrapes both workers of a running job over HTTP).
TEST(LaunchTest, MetricsPortGivesEachWorkerItsOwnEndpoint) {
  TempDir dir;
  absl::StatusOr<int> pair = rpc::testing::FreeLoopbackPortPair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  const int base = *pair;
  // Two FIFOs (launched_program.cc): each worker writes a byte to "ready" once it has
  // made its calls, then reads "go" until the test closes it. The test holds both open
  // read-write, so neither open blocks and "ready" never reads end-of-file meanwhile.
  const std::string ready = dir.path() + "/ready", go = dir.path() + "/go";
  ASSERT_EQ(::mkfifo(ready.c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo(go.c_str(), 0600), 0);
  const int ready_fd = ::open(ready.c_str(), O_RDWR | O_CLOEXEC);
  int go_fd = ::open(go.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(ready_fd, 0);
  ASSERT_GE(go_fd, 0);
  LaunchOptions options;
  options.num_workers = 2;
  options.metrics_port = base;
  options.command = {GRADWIRE_LAUNCHED_PROGRAM, "serve_metrics", dir.path()};
  std::string body0, body1;
  std::thread scraper([&] {
    int bytes = 0;
    for (pollfd p{ready_fd, POLLIN, 0}; bytes < 2 && ::poll(&p, 1, 60000) == 1;) {
      char c;
      if (::read(ready_fd, &c, 1) == 1) ++bytes;
    }
    absl::StatusOr<rpc::testing::HttpResponse> r0 = rpc::testing::HttpGet(base, "/metrics");
    absl::StatusOr<rpc::testing::HttpResponse> r1 = rpc::testing::HttpGet(base + 1, "/metrics");
    body0 = r0.ok() ? r0->body : std::string(r0.status().message());
    body1 = r1.ok() ? r1->body : std::string(r1.status().message());
    ::close(go_fd);  // the workers read end-of-file and shut down
    go_fd = -1;
  });
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  scraper.join();
  ::close(ready_fd);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0) << cap.Err();
  EXPECT_TRUE(absl::StrContains(body0, "gradwire_rpc_server_calls_total{function=\"ping\",peer=\"worker1\"} 3"))
      << body0;
  EXPECT_TRUE(absl::StrContains(body1, "gradwire_rpc_client_calls_total{function=\"ping\",peer=\"worker0\"} 3"))
      << body1;
  const std::string err = cap.Err();
  EXPECT_TRUE(absl::StrContains(
      err, absl::StrCat("[worker1] gradwire: worker1 serves its metrics at http://127.0.0.1:", base + 1, "/metrics")))
      << err;
}

TEST(LaunchTest, ExplicitPortAndPrefixAreUsed) {
  LaunchOptions options = Shell(2, "echo \"$MASTER_PORT $GRADWIRE_WORKER_NAME\"");
  options.master_port = 29555;
  options.name_prefix = "trainer";
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::string out = cap.Out();
  EXPECT_NE(out.find("[trainer0] 29555 trainer0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[trainer1] 29555 trainer1\n"), std::string::npos) << out;
}

// A job over several nodes: node 1 of 3 with 2 workers starts global ranks 2 and 3 of 6,
// named by their global rank.
TEST(LaunchTest, NodeRankGivesThisNodesShareOfTheGlobalRanks) {
  LaunchOptions options = Shell(2, "echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE node=$GROUP_RANK\"");
  options.nnodes = 3;
  options.node_rank = 1;
  options.master_port = 29556;
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0);
  const std::string out = cap.Out();
  EXPECT_NE(out.find("[worker2] rank=2 local=0 world=6 lws=2 node=1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[worker3] rank=3 local=1 world=6 lws=2 node=1\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("[worker0]"), std::string::npos) << out;

  // Several nodes need an explicit port; a node rank must be below nnodes.
  options.master_port = 0;
  absl::Status status = Launch(options, cap.out, cap.err).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("master_port"), absl::string_view::npos) << status;
  options.master_port = 29556;
  options.node_rank = 3;
  EXPECT_EQ(Launch(options, cap.out, cap.err).status().code(), absl::StatusCode::kInvalidArgument);
}

// The job secret (rpc security.h): without one in the environment, Launch makes a fresh
// one per job in a sealed memfd only this user may read (never a file on disk), and
// gives every worker its descriptor as GRADWIRE_SECRET_FILE=/proc/self/fd/N; a secret
// the user gave is passed through; a job over several machines must be given one (each
// launcher would make its own).
TEST(LaunchTest, EachJobGetsAFreshSecretOnlyItsUserMayRead) {
  gw::rpc::testing::ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  gw::rpc::testing::ScopedEnv no_file("GRADWIRE_SECRET_FILE", nullptr);
  std::vector<std::string> files, secrets;
  for (int job = 0; job < 2; ++job) {
    Capture cap;
    absl::StatusOr<LaunchResult> result =
        Launch(Shell(2, "echo \"file=$GRADWIRE_SECRET_FILE mode=$(stat -L -c %a \"$GRADWIRE_SECRET_FILE\") "
                        "secret=$(cat \"$GRADWIRE_SECRET_FILE\")\""),
               cap.out, cap.err);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->exit_code, 0) << cap.Err();
    const std::string out = cap.Out();
    // "[worker0] file=F mode=400 secret=S"
    const std::string first = out.substr(0, out.find('\n'));
    const size_t file = first.find("file="), mode = first.find(" mode=400 secret=");
    ASSERT_TRUE(file != std::string::npos && mode != std::string::npos) << out;
    files.push_back(first.substr(file + 5, mode - file - 5));
    secrets.push_back(first.substr(mode + 17));
    ASSERT_EQ(secrets.back().size(), 64u) << out;
    EXPECT_EQ(secrets.back().find_first_not_of("0123456789abcdef"), std::string::npos) << out;
    EXPECT_NE(out.find(absl::StrCat("secret=", secrets.back())), out.rfind(absl::StrCat("secret=", secrets.back())))
        << "both workers got the same secret: " << out;
    EXPECT_EQ(files.back().rfind("/proc/self/fd/", 0), 0u) << "an inherited descriptor, not a file: " << out;
  }
  EXPECT_NE(secrets[0], secrets[1]) << "a fresh secret per job";

  LaunchOptions several = Shell(1, "true");
  several.nnodes = 2;
  several.master_port = 29557;
  Capture cap;
  absl::Status refused = Launch(several, cap.out, cap.err).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("gradwire secret"), std::string::npos) << refused;

  ::setenv("GRADWIRE_SECRET", "given by the user", 1);
  Capture given;
  ASSERT_TRUE(Launch(Shell(1, "echo \"secret=$GRADWIRE_SECRET file=$GRADWIRE_SECRET_FILE.\""), given.out, given.err).ok());
  EXPECT_NE(given.Out().find("secret=given by the user file=."), std::string::npos) << given.Out();
}

LaunchOptions SecretReaders(int n, std::vector<std::string> wrapper = {}) {
  LaunchOptions options;
  options.num_workers = n;
  options.command = std::move(wrapper);
  // The user's program in miniature (tests/launched_program.cc) reads it as every worker
  // does (the tests unset GRADWIRE_SECRET, so the launcher's memfd is what it reads).
  options.command.push_back(GRADWIRE_LAUNCHED_PROGRAM);
  options.command.push_back("read_secret");
  return options;
}

// Workers read the secret from the memfd they inherited, and keep it (the agent may read
// it again), but what they start does not inherit it.
TEST(LaunchTest, WorkersReadTheSecretButTheProgramsTheyStartDoNotInheritIt) {
  gw::rpc::testing::ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  gw::rpc::testing::ScopedEnv no_file("GRADWIRE_SECRET_FILE", nullptr);
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(SecretReaders(2), cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0) << cap.Err();
  const std::string out = cap.Out();
  for (const char* worker : {"[worker0] ", "[worker1] "}) {
    EXPECT_NE(out.find(absl::StrCat(worker, "secret of 64 bytes; descriptor open here, not inherited by a child\n")),
              std::string::npos)
        << out;
  }
}

// A wrapper between the launcher and the worker that closes inherited descriptors
// (Python's subprocess does unless given pass_fds): the worker says what happened to the
// descriptor and how to keep it, instead of reading whatever has its number now.
TEST(LaunchTest, AWrapperThatClosesTheSecretsDescriptorIsNamedInTheWorkersError) {
  if (std::system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 to wrap the worker";
  gw::rpc::testing::ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  gw::rpc::testing::ScopedEnv no_file("GRADWIRE_SECRET_FILE", nullptr);
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(
      SecretReaders(1, {"python3", "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"}), cap.out,
      cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::string out = cap.Out();
  const size_t refused = out.find("[worker0] secret refused: GRADWIRE_SECRET_FILE=/proc/self/fd/");
  ASSERT_NE(refused, std::string::npos) << out << cap.Err();
  const std::string line = out.substr(refused, out.find('\n', refused) - refused);
  EXPECT_NE(line.find("that `gradwire launch` passed to its workers (the job secret's memfd) was closed by something "
                      "between the launcher and this process"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("Python's subprocess closes inherited descriptors unless given pass_fds=("), std::string::npos)
      << line;
}

// -n is bounded (1024 unless GRADWIRE_LAUNCH_MAX_WORKERS says otherwise), checked before
// anything starts; so is a job that others may join without a secret they can have.
TEST(LaunchTest, TooManyWorkersAndUnjoinableElasticJobsAreRefusedBeforeAnyStarts) {
  Capture cap;
  absl::Status many = Launch(Shell(100000, "true"), cap.out, cap.err).status();
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument) << many;
  EXPECT_NE(many.message().find("100000 is more than the 1024 workers"), std::string::npos) << many;
  EXPECT_NE(many.message().find("GRADWIRE_LAUNCH_MAX_WORKERS=100000"), std::string::npos) << many;
  {
    gw::rpc::testing::ScopedEnv most("GRADWIRE_LAUNCH_MAX_WORKERS", "2");
    absl::Status three = Launch(Shell(3, "true"), cap.out, cap.err).status();
    EXPECT_NE(three.message().find("more than the 2 workers"), std::string::npos) << three;
    absl::StatusOr<LaunchResult> two = Launch(Shell(2, "true"), cap.out, cap.err);
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ(two->exit_code, 0);
  }
  {
    gw::rpc::testing::ScopedEnv bad("GRADWIRE_LAUNCH_MAX_WORKERS", "lots");
    EXPECT_EQ(Launch(Shell(1, "true"), cap.out, cap.err).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(cap.Out(), "");
  gw::rpc::testing::ScopedEnv no_secret("GRADWIRE_SECRET", nullptr);
  gw::rpc::testing::ScopedEnv no_file("GRADWIRE_SECRET_FILE", nullptr);
  LaunchOptions elastic = Shell(1, "true");
  elastic.max_workers = 2;
  absl::Status unjoinable = Launch(elastic, cap.out, cap.err).status();
  EXPECT_EQ(unjoinable.code(), absl::StatusCode::kFailedPrecondition) << unjoinable;
  EXPECT_NE(unjoinable.message().find("gradwire secret > job.secret"), std::string::npos) << unjoinable;
  EXPECT_EQ(CheckLaunchOptions(elastic), unjoinable);
  elastic.extra_env["GRADWIRE_SECRET"] = "shared with the workers that join";
  EXPECT_TRUE(CheckLaunchOptions(elastic).ok());
}

// Like torchrun: without OMP_NUM_THREADS, workers get an equal share of the cores; a
// value the user set is kept.
TEST(LaunchTest, OpenMpThreadsAreSharedUnlessSet) {
  gw::rpc::testing::ScopedEnv unset("OMP_NUM_THREADS", nullptr);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int n : {1, 2, 64}) {
    Capture cap;
    absl::StatusOr<LaunchResult> result = Launch(Shell(n, "echo \"omp=$OMP_NUM_THREADS\""), cap.out, cap.err);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_NE(cap.Out().find("[worker0] omp=" + std::to_string(std::max(1, cores / n)) + "\n"), std::string::npos)
        << n << " workers: " << cap.Out();
  }
  ::setenv("OMP_NUM_THREADS", "3", 1);
  Capture cap;
  ASSERT_TRUE(Launch(Shell(2, "echo \"omp=$OMP_NUM_THREADS\""), cap.out, cap.err).ok());
  EXPECT_NE(cap.Out().find("[worker1] omp=3\n"), std::string::npos) << cap.Out();
}

TEST(LaunchTest, OneFailureStopsTheOthers) {
  TempDir dir;
  // Ranks 0 and 2 record their shell's pid and a background sleep's pid, then wait; rank 1
  // fails once both have done so.
  LaunchOptions options = Shell(
      3,
      "cd \"$DIR\"; if [ \"$RANK\" = 1 ]; then\n"
      "  while [ ! -s pid0 ] || [ ! -s pid2 ]; do sleep 0.02; done\n"
      "  echo failing >&2; exit 3\n"
      "fi\n"
      "sleep 30 & echo \"$$ $!\" > tmp$RANK && mv tmp$RANK pid$RANK; wait");
  options.extra_env["DIR"] = dir.path();
  Capture cap;
  const Clock::time_point start = Clock::now();
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  const double elapsed = SecondsSince(start);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 3);
  EXPECT_EQ(result->failed_worker, "worker1");
  EXPECT_EQ(result->reason, "exited with status 3");
  EXPECT_LT(elapsed, 4.0);
  EXPECT_NE(cap.Err().find("[worker1] failing\n"), std::string::npos);
  for (const char* file : {"pid0", "pid2"}) {
    const std::vector<pid_t> pids = Pids(dir.Read(file));
    ASSERT_EQ(pids.size(), 2u) << file;
    for (pid_t pid : pids) EXPECT_TRUE(IsGone(pid)) << file << " pid " << pid;
  }
}

TEST(LaunchTest, WorkerIgnoringSigtermIsKilledAfterGrace) {
  TempDir dir;
  LaunchOptions options = Shell(
      2,
      "cd \"$DIR\"; if [ \"$RANK\" = 1 ]; then\n"
      "  while [ ! -s pid0 ]; do sleep 0.02; done; exit 1\n"
      "fi\n"
      "trap '' TERM; echo $$ > tmp0 && mv tmp0 pid0; sleep 30");
  options.extra_env["DIR"] = dir.path();
  options.kill_grace = absl::Milliseconds(300);
  Capture cap;
  const Clock::time_point start = Clock::now();
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  const double elapsed = SecondsSince(start);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1);
  EXPECT_EQ(result->failed_worker, "worker1");
  EXPECT_GE(elapsed, 0.3);
  EXPECT_LT(elapsed, 3.0);
  const std::vector<pid_t> pids = Pids(dir.Read("pid0"));
  ASSERT_EQ(pids.size(), 1u);
  EXPECT_TRUE(IsGone(pids[0]));
}

TEST(LaunchTest, KilledBySignalGives128PlusSignal) {
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(Shell(1, "kill -9 $$"), cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 128 + 9);
  EXPECT_EQ(result->failed_worker, "worker0");
  EXPECT_EQ(result->reason, "was killed by signal 9 (SIGKILL)");
}

TEST(LaunchTest, MissingProgramIsNotFound) {
  Capture cap;
  LaunchOptions options;
  options.num_workers = 2;
  options.command = {"gradwire-no-such-program", "--flag"};
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(result.status().message().find("'gradwire-no-such-program' not found in PATH"),
            absl::string_view::npos)
      << result.status();

  options.command = {"/nonexistent/program"};
  result = Launch(options, cap.out, cap.err);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(result.status().message().find("'/nonexistent/program' not found"),
            absl::string_view::npos)
      << result.status();

  TempDir dir;
  const std::string not_executable = dir.path() + "/data.txt";
  std::ofstream(not_executable) << "not a program\n";
  std::filesystem::permissions(not_executable, std::filesystem::perms::owner_read |
                                                   std::filesystem::perms::owner_write);
  options.command = {not_executable};
  result = Launch(options, cap.out, cap.err);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kPermissionDenied) << result.status();
}

TEST(LaunchTest, PartialLastLinesAreFlushedWithPrefix) {
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(
      Shell(1, "printf 'first\\nno newline'; printf 'err partial' >&2"), cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0);
  EXPECT_EQ(cap.Out(), "[worker0] first\n[worker0] no newline\n");
  EXPECT_EQ(cap.Err(), "[worker0] err partial\n");
}

TEST(LaunchTest, VeryLongLinesAreSplit) {
  Capture cap;
  absl::StatusOr<LaunchResult> result =
      Launch(Shell(1, "head -c 150000 /dev/zero | tr '\\0' a; echo; echo next"), cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<std::string> lines = Lines(cap.Out());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "[worker0] " + std::string(65536, 'a'));
  EXPECT_EQ(lines[1], "[worker0] " + std::string(65536, 'a'));
  EXPECT_EQ(lines[2], "[worker0] " + std::string(150000 - 2 * 65536, 'a'));
  EXPECT_EQ(lines[3], "[worker0] next");
}

TEST(LaunchTest, LeftoverBackgroundProcessesAreStopped) {
  TempDir dir;
  // One leftover holds the worker's stdout, the other does not.
  LaunchOptions options = Shell(
      1, "sleep 30 & echo $! > \"$DIR/pid\"; sleep 30 >/dev/null 2>&1 & echo $! >> \"$DIR/pid\"; "
         "echo done");
  options.extra_env["DIR"] = dir.path();
  Capture cap;
  const Clock::time_point start = Clock::now();
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0);
  EXPECT_LT(SecondsSince(start), 3.0);
  EXPECT_EQ(cap.Out(), "[worker0] done\n");
  const std::vector<pid_t> pids = Pids(dir.Read("pid"));
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t pid : pids) EXPECT_TRUE(IsGone(pid)) << pid;
}

TEST(LaunchTest, LauncherSignalsAreForwarded) {
  TempDir dir;
  // Rank 0 reports the SIGINT it gets; rank 1 sends SIGINT to the launcher (this process).
  LaunchOptions options = Shell(
      2,
      "cd \"$DIR\"; if [ \"$RANK\" = 1 ]; then\n"
      "  trap 'exit 0' INT; while [ ! -e ready ]; do sleep 0.02; done; kill -INT $PPID\n"
      "else\n"
      "  trap 'echo got INT; exit 0' INT; touch ready\n"
      "fi\n"
      // The shell runs a trap between commands, so wait in short steps: a SIGINT that
      // lands between two commands would otherwise be noticed only after a long one.
      "while :; do sleep 0.05; done");
  options.extra_env["DIR"] = dir.path();
  options.kill_grace = absl::Seconds(2);
  struct sigaction before {};
  ::sigaction(SIGINT, nullptr, &before);
  Capture cap;
  const Clock::time_point start = Clock::now();
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 128 + SIGINT);
  EXPECT_EQ(result->failed_worker, "");
  EXPECT_EQ(result->reason, "received SIGINT; forwarded it to the workers");
  EXPECT_LT(SecondsSince(start), 1.9);  // nobody needed the SIGKILL
  EXPECT_EQ(cap.Out(), "[worker0] got INT\n");
  // The launcher's previous SIGINT disposition is back.
  struct sigaction after {};
  ::sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST(LaunchTest, AFailedWorkerIsRestartedUnderItsRankAndTheJobGoesOn) {
  TempDir dir;
  // Rank 1 fails on its first two starts and succeeds on the third; rank 2 waits for that.
  LaunchOptions options = Shell(
      3,
      "cd \"$DIR\"; echo \"$RANK:$GRADWIRE_WORKER_NAME:$GRADWIRE_RESTART_COUNT\" >> starts\n"
      "if [ \"$RANK\" = 1 ]; then\n"
      "  if [ \"$GRADWIRE_RESTART_COUNT\" -lt 2 ]; then echo \"failing $GRADWIRE_RESTART_COUNT\" >&2; exit 3; fi\n"
      "  touch done1\n"
      "fi\n"
      "if [ \"$RANK\" = 2 ]; then while [ ! -e done1 ]; do sleep 0.02; done; fi");
  options.extra_env["DIR"] = dir.path();
  options.max_restarts = 2;
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0) << result->failed_worker << " " << result->reason << "\n" << cap.Err();
  const std::string err = cap.Err();
  EXPECT_NE(err.find("gradwire launch: worker1 exited with status 3\n"), std::string::npos) << err;
  EXPECT_NE(err.find("gradwire launch: restarting worker1 (restart 1 of 2)\n"), std::string::npos) << err;
  EXPECT_NE(err.find("gradwire launch: restarting worker1 (restart 2 of 2)\n"), std::string::npos) << err;
  EXPECT_NE(err.find("[worker1] failing 1\n"), std::string::npos) << err;
  std::vector<std::string> starts = Lines(dir.Read("starts"));
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(starts, (std::vector<std::string>{"0:worker0:0", "1:worker1:0", "1:worker1:1", "1:worker1:2",
                                              "2:worker2:0"}));
}

TEST(LaunchTest, AWorkerFailingMoreThanMaxRestartsStopsTheJobAndRankZeroIsNeverRestarted) {
  TempDir dir;
  LaunchOptions options = Shell(2, "cd \"$DIR\"; echo \"$RANK:$GRADWIRE_RESTART_COUNT\" >> starts; "
                                   "if [ \"$RANK\" = 1 ]; then exit 4; fi; sleep 30");
  options.extra_env["DIR"] = dir.path();
  options.max_restarts = 1;
  options.kill_grace = absl::Seconds(1);
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 4);
  EXPECT_EQ(result->failed_worker, "worker1");
  EXPECT_EQ(result->reason, "exited with status 4 (after 1 restart(s))");
  std::vector<std::string> starts = Lines(dir.Read("starts"));
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(starts, (std::vector<std::string>{"0:0", "1:0", "1:1"}));

  // Rank 0 hosts the rendezvous store: its failure stops the job at once.
  options = Shell(2, "if [ \"$RANK\" = 0 ]; then exit 5; fi; sleep 30");
  options.max_restarts = 3;
  options.kill_grace = absl::Seconds(1);
  Capture cap0;
  result = Launch(options, cap0.out, cap0.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 5);
  EXPECT_EQ(result->failed_worker, "worker0");
  EXPECT_EQ(cap0.Err().find("restarting"), std::string::npos) << cap0.Err();
}

TEST(LaunchTest, InvalidOptionsAreRejected) {
  Capture cap;
  LaunchOptions options = Shell(0, "true");
  EXPECT_EQ(Launch(options, cap.out, cap.err).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Shell(1, "true");
  options.extra_env["RANK"] = "5";
  absl::Status status = Launch(options, cap.out, cap.err).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("RANK"), absl::string_view::npos);
  options = Shell(1, "true");
  options.command.clear();
  EXPECT_EQ(Launch(options, cap.out, cap.err).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Shell(1, "true");
  options.master_port = 70000;
  EXPECT_EQ(Launch(options, cap.out, cap.err).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Shell(1, "true");
  options.max_restarts = -1;
  EXPECT_EQ(Launch(options, cap.out, cap.err).status().code(), absl::StatusCode::kInvalidArgument);
}

// --rdzv: the workers get GRADWIRE_RDZV instead of MASTER_ADDR / MASTER_PORT (no port is
// picked, and several nodes need none); the launcher's own GRADWIRE_RDZV never leaks.
TEST(LaunchTest, RdzvReplacesTheMasterVariables) {
  ::setenv("GRADWIRE_RDZV", "etcd://launchers.own:1/env", 1);
  LaunchOptions options = Shell(2, "echo \"$RANK ${GRADWIRE_RDZV-unset} ${MASTER_ADDR-unset} ${MASTER_PORT-unset}\"");
  options.rdzv = "etcd://127.0.0.1:2379/my-job";
  options.nnodes = 2;
  options.node_rank = 1;
  Capture cap;
  absl::StatusOr<LaunchResult> result = Launch(options, cap.out, cap.err);
  ASSERT_TRUE(result.ok()) << result.status();
  std::string out = cap.Out();
  EXPECT_NE(out.find("[worker2] 2 etcd://127.0.0.1:2379/my-job unset unset\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[worker3] 3 etcd://127.0.0.1:2379/my-job unset unset\n"), std::string::npos) << out;
  Capture plain;
  result = Launch(Shell(1, "echo \"${GRADWIRE_RDZV-unset}\""), plain.out, plain.err);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(plain.Out(), "[worker0] unset\n");
  ::unsetenv("GRADWIRE_RDZV");
  for (const char* bad : {"127.0.0.1:2379", "etcd://127.0.0.1:2379", "etcd://127.0.0.1:2379/"}) {
    options.rdzv = bad;
    absl::Status status = Launch(options, cap.out, cap.err).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("must be etcd://HOST:PORT/JOB"), std::string::npos) << status;
  }
}

TEST(PickFreePortTest, ReturnsABindablePort) {
  absl::StatusOr<int> port = PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_GT(*port, 0);
  EXPECT_LE(*port, 65535);
  EXPECT_FALSE(PickFreePort("no-such-host.invalid").ok());
}

#ifdef GRADWIRE_CLI_PATH
struct CliRun {
  int exit_code;
  std::string out, err;
};

// Runs `gradwire ARGS` through /bin/sh; `args` is shell text, `prefix` too (e.g. env ...).
CliRun RunCli(const std::string& args, const std::string& prefix = "") {
  TempDir dir;
  const std::string command = prefix + std::string("'") + GRADWIRE_CLI_PATH + "' " + args + " >'" +
                              dir.path() + "/out' 2>'" + dir.path() + "/err'";
  const int status = std::system(command.c_str());
  return CliRun{WIFEXITED(status) ? WEXITSTATUS(status) : -1, dir.Read("out"), dir.Read("err")};
}

TEST(CliTest, HelpAndUsageErrors) {
  CliRun help = RunCli("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.out.rfind("usage: gradwire launch", 0), 0u) << help.out;
  EXPECT_EQ(RunCli("launch --help").exit_code, 0);

  for (const char* bad : {"", "frobnicate", "launch", "launch -n", "launch -n zero /bin/true",
                          "launch --bogus /bin/true", "launch --master-port 70000 /bin/true",
                          "launch --metrics-port 0 /bin/true", "launch --metrics-port x /bin/true"}) {
    CliRun run = RunCli(bad);
    EXPECT_EQ(run.exit_code, 2) << bad;
    EXPECT_NE(run.err.find("\n\nusage: gradwire launch"), std::string::npos) << bad << run.err;
  }
  EXPECT_EQ(RunCli("launch -n zero /bin/true").err.rfind(
                "gradwire launch: -n expects a positive number of workers, got 'zero'\n", 0),
            0u);
  // Worker k takes P + k: the last worker's port must exist.
  CliRun high = RunCli("launch -n 3 --metrics-port 65534 /bin/true");
  EXPECT_EQ(high.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(high.err, "the ports up to 65536 must exist; give a port in 1-65533")) << high.err;
}

TEST(CliTest, SecretPrintsTheJobsMetricsToken) {
  CliRun token = RunCli("secret --metrics-token", "GRADWIRE_SECRET=abc ");
  EXPECT_EQ(token.exit_code, 0) << token.err;
  EXPECT_EQ(token.out, rpc::MetricsToken("abc") + "\n");
  CliRun none = RunCli("secret --metrics-token", "env -u GRADWIRE_SECRET -u GRADWIRE_SECRET_FILE ");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(none.err, "no job secret: set GRADWIRE_SECRET_FILE")) << none.err;
}

TEST(CliTest, LaunchPassesArgumentsThroughAndReportsFailure) {
  CliRun ok = RunCli("launch --nproc-per-node 2 /bin/sh -c 'echo \"$RANK $*\"' sh -n --foo");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("[worker0] 0 -n --foo\n"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("[worker1] 1 -n --foo\n"), std::string::npos) << ok.out;
  EXPECT_EQ(ok.err.rfind("gradwire launch: starting 2 workers (MASTER_ADDR=127.0.0.1, MASTER_PORT=",
                         0),
            0u)
      << ok.err;

  CliRun failed =
      RunCli("launch -n 3 /bin/sh -c 'if [ $RANK = 1 ]; then exit 3; fi; sleep 30'");
  EXPECT_EQ(failed.exit_code, 3);
  EXPECT_NE(failed.err.find(
                "gradwire launch: worker1 exited with status 3; stopped the other workers\n"),
            std::string::npos)
      << failed.err;

  CliRun missing = RunCli("launch gradwire-no-such-program");
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_NE(missing.err.find("'gradwire-no-such-program' not found"), std::string::npos);
}

TEST(CliTest, RdzvUsageErrorsSayWhatToDo) {
  CliRun both = RunCli("launch --rdzv etcd://127.0.0.1:2379/j --master-port 29500 /bin/true");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--rdzv replaces --master-addr and --master-port"), std::string::npos) << both.err;
  CliRun bad = RunCli("launch --rdzv 127.0.0.1:2379 /bin/true");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("must be etcd://HOST:PORT/JOB"), std::string::npos) << bad.err;
  CliRun nodes = RunCli("launch --nnodes 2 /bin/true");
  EXPECT_EQ(nodes.exit_code, 2);
  EXPECT_NE(nodes.err.find("--rdzv etcd://HOST:PORT/JOB"), std::string::npos) << nodes.err;
  CliRun ok = RunCli("launch --rdzv etcd://127.0.0.1:2379/j -n 1 /bin/sh -c 'echo $GRADWIRE_RDZV'");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "[worker0] etcd://127.0.0.1:2379/j\n");
  EXPECT_EQ(ok.err.rfind("gradwire launch: starting 1 worker (GRADWIRE_RDZV=etcd://127.0.0.1:2379/j)\n", 0), 0u)
      << ok.err;
  EXPECT_NE(RunCli("launch --help").out.find("--rdzv etcd://HOST:PORT/JOB"), std::string::npos);
}

// `gradwire ARGS` started here with its stdout and stderr on pipes, read as the launcher
// writes them (not only when it exits). `env` adds NAME=VALUE entries to this process's
// environment, `unset` removes variables.
class Spawned {
 public:
  Spawned(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
          const std::vector<std::string>& unset = {}) {
    std::vector<std::string> argv_s = {GRADWIRE_CLI_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string var(*e), name = var.substr(0, var.find('='));
      if (std::find(unset.begin(), unset.end(), name) == unset.end()) env_s.push_back(var);
    }
    env_s.insert(env_s.end(), env.begin(), env.end());
    std::vector<char*> argv, envp;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
  }
  ~Spawned() {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return text_[0]; }
  const std::string& err() const { return text_[1]; }

  // Reads until every one of `needles` is in stdout or stderr (true), or both closed
  // or `limit` passed (false: the test fails; the limit only keeps a broken launcher
  // from hanging the suite).
  bool ReadUntil(const std::vector<std::string>& needles, absl::Duration limit = absl::Seconds(60)) {
    const absl::Time end = absl::Now() + limit;
    auto found = [&] {
      return std::all_of(needles.begin(), needles.end(), [&](const std::string& n) {
        return absl::StrContains(text_[0], n) || absl::StrContains(text_[1], n);
      });
    };
    while (!found()) {
      if (!ReadSome(end)) return found();
    }
    return true;
  }
  // Reads both pipes to their end and reaps the launcher: its wait status.
  int Finish(absl::Duration limit = absl::Seconds(120)) {
    const absl::Time end = absl::Now() + limit;
    while (ReadSome(end)) {
    }
    int status = -1;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

 private:
  // One poll and read; false once both pipes are closed or `end` passed.
  bool ReadSome(absl::Time end) {
    pollfd p[2];
    nfds_t n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (fds_[i] < 0) continue;
      p[n] = {fds_[i], POLLIN, 0};
      which[n++] = i;
    }
    const int64_t ms = absl::ToInt64Milliseconds(end - absl::Now());
    if (n == 0 || ms <= 0 || ::poll(p, n, static_cast<int>(ms)) <= 0) return false;
    for (nfds_t k = 0; k < n; ++k) {
      if (p[k].revents == 0) continue;
      char buf[4096];
      const ssize_t got = ::read(fds_[which[k]], buf, sizeof buf);
      if (got > 0) {
        text_[which[k]].append(buf, static_cast<size_t>(got));
      } else {
        ::close(fds_[which[k]]);
        fds_[which[k]] = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int fds_[2] = {-1, -1};
  std::string text_[2];
};

// The pids of the processes whose environment holds `entry` (NAME=VALUE).
std::vector<pid_t> ProcessesWithEnv(const std::string& entry) {
  std::vector<pid_t> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* d = ::readdir(proc)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(d->d_name, &pid)) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
    std::string var;
    while (std::getline(in, var, '\0')) {
      if (var == entry) {
        pids.push_back(pid);
        break;
      }
    }
  }
  ::closedir(proc);
  return pids;
}

// Blocks until process `pid` (not a child of this one) has ended: a pidfd becomes
// readable then. False if it still runs after `limit`.
bool AwaitEnd(pid_t pid, absl::Duration limit = absl::Seconds(60)) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  const bool ended = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(limit))) == 1;
  ::close(fd);
  return ended;
}

// Entries of /tmp whose name starts with `prefix`.
std::vector<std::string> TmpEntries(const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator("/tmp")) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

#ifdef GRADWIRE_LAUNCHED_PROGRAM
// A worker's stdout is a pipe to the launcher; without GRADWIRE_LINE_BUFFERED (and the rpc
// library acting on it) what it prints with printf or std::cout would arrive when it
// exits, here never: it waits until the launcher is stopped.
TEST(CliTest, AWorkersLinesArriveAsItPrintsThem) {
  Spawned cli({"launch", "-n", "2", GRADWIRE_LAUNCHED_PROGRAM, "print_then_wait"});
  ASSERT_TRUE(cli.ReadUntil({"[worker0] printf line of worker0 (options ok)\n", "[worker1] printf line of worker1 (options ok)\n",
                             "[worker0] cout line\n", "[worker1] cout line\n"}))
      << cli.out() << cli.err();
  ASSERT_EQ(::kill(cli.pid(), SIGTERM), 0);
  const int status = cli.Finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << status << cli.err();
}
#endif  // GRADWIRE_LAUNCHED_PROGRAM

TEST(CliTest, TooManyWorkersAreRefusedAtOnceSayingTheLimit) {
  CliRun many = RunCli("launch -n 100000 /bin/true");
  EXPECT_EQ(many.exit_code, 2) << many.err;
  EXPECT_EQ(many.err.rfind("gradwire launch: num_workers (-n) 100000 is more than the 1024 workers one launcher "
                           "starts on a machine; if you mean it, set GRADWIRE_LAUNCH_MAX_WORKERS=100000",
                           0),
            0u)
      << many.err;
  EXPECT_EQ(many.out, "");
}

// SIGTERM while the launcher starts hundreds of workers: it stops starting them, the
// ones started get it, and it exits 128 + SIGTERM leaving no process of the job behind.
TEST(CliTest, SigtermWhileStartingManyWorkersStopsThemAll) {
  const std::string token = absl::StrCat("GW_LAUNCH_TEST_TOKEN=sigterm-", ::getpid());
  Spawned cli({"launch", "-n", "600", "/bin/sh", "-c", "echo up; exec sleep 600"}, {token});
  ASSERT_TRUE(cli.ReadUntil({"] up\n"})) << cli.out() << cli.err();
  ASSERT_EQ(::kill(cli.pid(), SIGTERM), 0);
  const int status = cli.Finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << status << cli.err();
  EXPECT_NE(cli.err().find("gradwire launch: received SIGTERM; forwarded it to the workers"), std::string::npos)
      << cli.err();
  // The launcher returns once every worker is reaped.
  EXPECT_EQ(ProcessesWithEnv(token), std::vector<pid_t>{});
}

// The job secret lives in a memfd the workers inherit: a launcher killed with SIGKILL
// (no cleanup at all) leaves nothing of it in /tmp, and its workers die with it.
TEST(CliTest, SigkillOfTheLauncherLeavesNoSecretBehind) {
  const std::vector<std::string> before = TmpEntries("gradwire");
  const std::string token = absl::StrCat("GW_LAUNCH_TEST_TOKEN=sigkill-", ::getpid());
  Spawned cli({"launch", "-n", "2", "/bin/sh", "-c",
               "test -s \"$GRADWIRE_SECRET_FILE\" && echo \"pid $$ reads $GRADWIRE_SECRET_FILE\"; exec sleep 600"},
              {token}, {"GRADWIRE_SECRET", "GRADWIRE_SECRET_FILE"});
  ASSERT_TRUE(cli.ReadUntil({"[worker0] pid ", "[worker1] pid "})) << cli.out() << cli.err();
  EXPECT_EQ(cli.out().find("reads /tmp"), std::string::npos) << cli.out();
  EXPECT_NE(cli.out().find(" reads /proc/self/fd/"), std::string::npos) << cli.out();
  ASSERT_EQ(::kill(cli.pid(), SIGKILL), 0);
  cli.Finish();
  for (const std::string& line : Lines(cli.out())) {  // "[workerN] pid P reads ..."
    pid_t worker = 0;
    const size_t at = line.find("] pid ");
    ASSERT_TRUE(at != std::string::npos && absl::SimpleAtoi(line.substr(at + 6, line.find(' ', at + 6) - at - 6), &worker))
        << line;
    EXPECT_TRUE(AwaitEnd(worker)) << worker;  // PR_SET_PDEATHSIG
  }
  EXPECT_EQ(ProcessesWithEnv(token), std::vector<pid_t>{});
  EXPECT_EQ(TmpEntries("gradwire"), before);
}

// A job that others join needs a secret they can have: the launcher refuses to make one
// of its own, and passes a given one through untouched, to the job and to the joiners.
TEST(CliTest, AJobOthersJoinUsesTheSecretTheUserGives) {
  CliRun refused = RunCli("launch -n 1 --max-workers 2 /bin/true", "env -u GRADWIRE_SECRET -u GRADWIRE_SECRET_FILE ");
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_NE(refused.err.find("a job that others may join (max_workers, --max-workers) needs one secret"),
            std::string::npos)
      << refused.err;
  CliRun joiner = RunCli("launch --join --master-port 1 /bin/true", "env -u GRADWIRE_SECRET -u GRADWIRE_SECRET_FILE ");
  EXPECT_EQ(joiner.exit_code, 1) << joiner.err;
  EXPECT_NE(joiner.err.find("GRADWIRE_SECRET_FILE=job.secret for every launcher, the one that started the job too"),
            std::string::npos)
      << joiner.err;

  TempDir dir;
  const std::string file = dir.path() + "/job.secret";
  ASSERT_EQ(std::system(absl::StrCat("'", GRADWIRE_CLI_PATH, "' secret > '", file, "'").c_str()), 0);
  const std::string env = absl::StrCat("env -u GRADWIRE_SECRET GRADWIRE_SECRET_FILE='", file, "' ");
  CliRun main_job = RunCli("launch -n 1 --max-workers 2 /bin/sh -c 'echo \"file=$GRADWIRE_SECRET_FILE\"'", env);
  EXPECT_EQ(main_job.exit_code, 0) << main_job.err;
  EXPECT_EQ(main_job.out, absl::StrCat("[worker0] file=", file, "\n"));
}

#ifdef GRADWIRE_RPC_TEST_WORKER
// End to end with a real etcd: agents (the rpc test binary's "worker" role: it joins,
// writes ready/<name> in the store and shuts down gracefully) started by `gradwire launch
// --rdzv`, first on one node, then as two nodes whose launchers start in either order.
TEST(CliTest, LaunchedWorkersMeetThroughEtcd) {
  using gw::rpc::testing::EtcdServer;
  if (!EtcdServer::Available()) GTEST_SKIP() << EtcdServer::kMissing;
  absl::StatusOr<std::unique_ptr<EtcdServer>> etcd = EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string worker = std::string("GW_TEST_ROLE=worker '") + GRADWIRE_RPC_TEST_WORKER + "'";
  const std::string one = (*etcd)->Url("one-node");
  CliRun run = RunCli("launch --rdzv " + one + " -n 2 /usr/bin/env " + worker);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  const std::string two = (*etcd)->Url("two-nodes");
  CliRun node1;
  std::thread later([&] { node1 = RunCli("launch --nnodes 2 --node-rank 1 --rdzv " + two + " -n 1 /usr/bin/env " + worker); });
  CliRun node0 = RunCli("launch --nnodes 2 --node-rank 0 --rdzv " + two + " -n 1 /usr/bin/env " + worker);
  later.join();
  EXPECT_EQ(node0.exit_code, 0) << node0.err;
  EXPECT_EQ(node1.exit_code, 0) << node1.err;
  EXPECT_NE(node1.err.find("node 1 of 2: starting ranks 1-1 of 2 (GRADWIRE_RDZV=" + two + ")"), std::string::npos)
      << node1.err;
  for (const std::string& url : {one, two}) {
    absl::StatusOr<std::unique_ptr<gw::rpc::Store>> store = gw::rpc::ConnectStore(url, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->Wait({"ready/worker0", "ready/worker1"}, absl::ZeroDuration()).ok()) << url;
  }
}
#endif  // GRADWIRE_RPC_TEST_WORKER
#endif  // GRADWIRE_CLI_PATH

}  // namespace
}  // namespace gw::worker
