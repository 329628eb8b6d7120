// A group at scale on one host: 8 and 32 worker processes (this process is rank 0 and
// hosts the store; the others are this binary in the "scale" role, test_main.cc) meet,
// call every other worker once (all-to-all), and shut down gracefully. Each worker then
// reports its threads and sockets: threads must not grow with the group, sockets by at
// most one connection per peer and direction. Times are printed (W15 in BENCHMARKS.md
// measures them), not asserted.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent_group.h"
#include "gradwire/rpc/agent.h"
#include "test_support.h"

namespace gw::rpc {
namespace {

struct Footprint {
  int64_t threads = 0;
  int64_t fds = 0;
  int64_t sockets = 0;
};

struct ScaleRun {
  absl::Duration rendezvous, all_to_all, shutdown;
  Footprint most;  // the largest of any worker but rank 0 (which also hosts the store)
  bool ok = false;
};

ScaleRun RunGroup(int world) {
  ScaleRun run;
  auto server = StoreServer::Start("127.0.0.1", 0);  // a free port, then let rank 0 host it
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return run;
  const int port = (*server)->port();
  (*server)->Shutdown();
  std::vector<pid_t> children;
  const absl::Time start = absl::Now();
  for (int r = 1; r < world; ++r) {
    children.push_back(testing::SpawnSelf(
        "scale", {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)},
                  {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}}));
  }
  AgentOptions o;
  o.world_size = world;
  o.rendezvous = absl::StrCat("127.0.0.1:", port);
  o.start_timeout = absl::Seconds(60);
  o.shutdown_timeout = absl::Seconds(60);
  auto agent = Agent::Start(o, testing::RegisterTestFunctions);
  EXPECT_TRUE(agent.ok()) << agent.status();
  if (!agent.ok()) return run;
  run.rendezvous = absl::Now() - start;
  const absl::Time calls = absl::Now();
  EXPECT_TRUE(testing::CallEveryOtherWorker(**agent).ok());
  std::vector<std::string> keys;
  for (int r = 1; r < world; ++r) keys.push_back(absl::StrCat("scale/", r));
  EXPECT_TRUE((*agent)->store().Wait(keys, absl::Seconds(60)).ok());
  run.all_to_all = absl::Now() - calls;
  bool reports_ok = true;
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> report = (*agent)->store().Get(key, absl::Seconds(1));
    std::vector<std::string> fields = report.ok() ? absl::StrSplit(*report, ' ') : std::vector<std::string>{};
    Footprint f;
    if (fields.size() != 3 || !absl::SimpleAtoi(fields[0], &f.threads) || !absl::SimpleAtoi(fields[1], &f.fds) ||
        !absl::SimpleAtoi(fields[2], &f.sockets)) {
      ADD_FAILURE() << key << ": " << (report.ok() ? *report : report.status().ToString());
      reports_ok = false;
      continue;
    }
    run.most.threads = std::max(run.most.threads, f.threads);
    run.most.fds = std::max(run.most.fds, f.fds);
    run.most.sockets = std::max(run.most.sockets, f.sockets);
  }
  const absl::Time stop = absl::Now();
  absl::Status s = (*agent)->Shutdown(/*graceful=*/true);
  EXPECT_TRUE(s.ok()) << s;
  bool exited = true;
  for (pid_t c : children) exited = testing::WaitForExit(c) == 0 && exited;
  run.shutdown = absl::Now() - stop;
  EXPECT_TRUE(exited) << "a worker of " << world << " did not exit 0";
  run.ok = s.ok() && exited && reports_ok;
  std::printf("%d workers: rendezvous %s, all-to-all %s, graceful shutdown %s; per worker at most %lld threads, "
              "%lld fds of which %lld sockets\n",
              world, absl::FormatDuration(run.rendezvous).c_str(), absl::FormatDuration(run.all_to_all).c_str(),
              absl::FormatDuration(run.shutdown).c_str(), static_cast<long long>(run.most.threads),
              static_cast<long long>(run.most.fds), static_cast<long long>(run.most.sockets));
  return run;
}

TEST(ScaleTest, ThirtyTwoWorkersMeetCallEachOtherAndShutDownWithoutMoreThreadsPerWorker) {
  const ScaleRun small = RunGroup(8);
  ASSERT_TRUE(small.ok);
  const ScaleRun large = RunGroup(32);
  ASSERT_TRUE(large.ok);
  // Threads do not depend on the number of peers (gRPC's store client starts an executor
  // thread or two on demand, whatever the group's size).
  EXPECT_LE(large.most.threads, small.most.threads + 2);
  // Sockets: at most one connection per peer and direction (two workers that call each
  // other at the same moment each dial), plus the store client's.
  EXPECT_LE(large.most.sockets, 2 * 31 + 4);
  EXPECT_LE(large.most.fds - large.most.sockets, small.most.fds - small.most.sockets);
}

}  // namespace
}  // namespace gw::rpc
