// Unit: what a worker says about its own work beyond counters: its trace (trace.h), read
// back as JSON with flows joined across workers, and its waits (waits.h), gathered over
// the job's connections and over its metrics endpoint, with the report that names who
// waits on whom and the one a stalled worker logs by itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/metrics_endpoint.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/rpc/waits.h"
#include "nlohmann/json.hpp"
#include "observe/trace_clock.h"
#include "samples.h"
#include "scoped_temp_dir.h"
#include "test_support.h"

namespace gw::rpc {
namespace {

using testing::AgentGroup;
using testing::ScopedTempDir;

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

// worker0 calls "relay" on worker1, which calls "echo" on worker2 from its handler.
void RegisterRelay(Agent& agent) {
  ASSERT_TRUE(agent.Register("echo", [](int64_t x) { return x; }).ok());
  ASSERT_TRUE(agent.Register("mirror", [](Tensor t) { return t; }).ok());
  ASSERT_TRUE(agent
                  .Register("relay",
                            [&agent](int64_t x) -> absl::StatusOr<int64_t> {
                              return agent.Sync<int64_t>("worker2", "echo", x + 1);
                            })
                  .ok());
}

TEST(TraceTest, EveryWorkerWritesValidJsonWhoseFlowsJoinAcrossWorkers) {
  ScopedTempDir dir("gw-trace");
  AgentOptions base;
  base.trace_dir = dir.path();
  auto group = AgentGroup::Start(3, RegisterRelay, base);
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE((*group)[0].tracer().enabled());
  constexpr int kCalls = 5;
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<int64_t> r = (*group)[0].Sync<int64_t>("worker1", "relay", int64_t{i});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, i + 1);
  }
  // A message of 128 KiB each way: its decoding is a span where it arrives.
  ASSERT_TRUE((*group)[0].Sync<Tensor>("worker1", "mirror", Tensor::Ones({32768})).ok());
  ASSERT_TRUE(group->ShutdownAll().ok());

  // Every flow that starts ("s") ends ("f") exactly once, in any worker's file, at or
  // after its start once the clocks are aligned (one host: the offsets are tiny).
  std::map<std::string, double> starts, ends;
  std::map<int, std::vector<nlohmann::json>> slices;  // by rank: the "X" events
  for (int rank = 0; rank < 3; ++rank) {
    nlohmann::json trace = ReadJson(absl::StrCat(dir.path(), "/worker", rank, ".trace.json"));
    ASSERT_FALSE(trace.is_discarded()) << "worker" << rank << "'s trace is not valid JSON";
    const nlohmann::json& meta = trace.at("gradwire");
    EXPECT_EQ(meta.at("rank"), rank);
    EXPECT_EQ(meta.at("worker"), absl::StrCat("worker", rank));
    EXPECT_EQ(meta.at("dropped_spans"), 0);
    if (rank > 0) {
      // Measured against rank 0 over the job's connection.
      ASSERT_TRUE(meta.at("clock_offsets_us").contains("0")) << meta.dump();
      EXPECT_LT(std::abs(meta.at("clock_offsets_us").at("0").at("offset").get<int64_t>()), 50000);
    }
    const double origin = meta.at("clock_origin_us").get<double>();
    bool named_process = false;
    for (const nlohmann::json& e : trace.at("traceEvents")) {
      const std::string ph = e.at("ph");
      if (ph == "M") {
        named_process |= e.at("name") == "process_name" && e.at("args").at("name") == absl::StrCat("worker", rank);
        continue;
      }
      EXPECT_EQ(e.at("pid"), rank);
      const double ts = origin + e.at("ts").get<double>();
      if (ph == "s") {
        EXPECT_TRUE(starts.emplace(e.at("id"), ts).second) << "flow started twice: " << e.dump();
      }
      if (ph == "f") {
        EXPECT_TRUE(ends.emplace(e.at("id"), ts).second) << "flow ended twice: " << e.dump();
      }
      if (ph == "X") slices[rank].push_back(e);
    }
    EXPECT_TRUE(named_process);
  }
  // Requests and replies of relay (0 -> 1) and echo (1 -> 2): four flows a round.
  EXPECT_GE(starts.size(), 4u * kCalls);
  for (const auto& [id, ts] : starts) {
    auto it = ends.find(id);
    ASSERT_NE(it, ends.end()) << "flow " << id << " has no end";
    EXPECT_LE(ts, it->second + 1000) << "flow " << id << " ends before it starts";
  }
  EXPECT_EQ(starts.size(), ends.size());

  // worker1 ran "relay" (a handler slice) and sent "echo" within it, on the same thread.
  int nested = 0;
  for (const nlohmann::json& relay : slices[1]) {
    if (relay.at("name") != "relay" || relay.at("cat") != "rpc.handler") continue;
    EXPECT_EQ(relay.at("args").at("peer"), 0);
    for (const nlohmann::json& echo : slices[1]) {
      if (echo.at("name") == "echo" && echo.at("cat") == "rpc.send" && echo.at("tid") == relay.at("tid") &&
          echo.at("ts").get<double>() >= relay.at("ts").get<double>() &&
          echo.at("ts").get<double>() + echo.at("dur").get<double>() <=
              relay.at("ts").get<double>() + relay.at("dur").get<double>()) {
        ++nested;
      }
    }
  }
  EXPECT_EQ(nested, kCalls);

  // Only the large messages are "rpc.receive" slices: the request on worker1, the reply on
  // worker0.
  std::vector<std::string> received;
  for (int rank = 0; rank < 3; ++rank) {
    for (const nlohmann::json& e : slices[rank]) {
      if (e.at("cat") != "rpc.receive") continue;
      received.push_back(absl::StrCat(rank, " ", e.at("name").get<std::string>()));
      EXPECT_GE(e.at("args").at("bytes"), 131072) << e.dump();
    }
  }
  std::sort(received.begin(), received.end());
  EXPECT_EQ(received, (std::vector<std::string>{"0 (reply)", "1 mirror"}));
}

TEST(TraceTest, AnUnwritableDirectoryIsReportedOnceAndTheJobGoesOn) {
  AgentOptions base;
  base.trace_dir = "/proc/gradwire-cannot-be-here";
  ::testing::internal::CaptureStderr();
  auto group = AgentGroup::Start(2, testing::RegisterTestFunctions, base);
  ASSERT_NE(group, nullptr);
  EXPECT_FALSE((*group)[0].tracer().enabled());
  absl::StatusOr<int64_t> r = (*group)[0].Sync<int64_t>("worker1", "noop");
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(group->ShutdownAll().ok());
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (const char* worker : {"worker0", "worker1"}) {
    const std::string line = absl::StrCat(worker, " cannot write its trace into /proc/gradwire-cannot-be-here");
    const size_t first = err.find(line);
    ASSERT_NE(first, std::string::npos) << err;
    EXPECT_EQ(err.find(line, first + 1), std::string::npos) << "reported twice:\n" << err;
  }
  EXPECT_TRUE(absl::StrContains(err, "it goes on without a trace")) << err;
}

TEST(TracerTest, KeepsSpansOfThreadsAndClosesIntoValidJson) {
  ScopedTempDir dir("gw-tracer");
  std::unique_ptr<Tracer> tracer = Tracer::Open(dir.path() + "/nested/dir", "solo", 0);
  ASSERT_TRUE(tracer->enabled());
  const Tracer::Name cat = tracer->Intern("test"), step = tracer->Intern("step \"quoted\"\n");
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      // 20 chunks of spans each: more than the writer has made before they begin.
      for (int i = 0; i < 20000; ++i) Tracer::Scope scope(*tracer, cat, step);
    });
  }
  for (auto& t : threads) t.join();
  const std::string path = tracer->path();
  ASSERT_TRUE(tracer->Close().ok());
  tracer->Record({.category = cat, .name = step});  // after Close: dropped, no crash
  nlohmann::json trace = ReadJson(path);
  ASSERT_FALSE(trace.is_discarded());
  int spans = 0;
  std::set<int> tids;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++spans;
    tids.insert(e.at("tid").get<int>());
    EXPECT_EQ(e.at("name"), "step \"quoted\"\n");
  }
  EXPECT_EQ(spans, 60000);
  EXPECT_EQ(tids.size(), 3u);
}

// The tracer's clock reads the CPU's counter: it must stay on the real-time clock, which
// the merge aligns workers by, and not go back on a thread (the trace format nests a
// thread's slices by their times).
TEST(TraceClockTest, FollowsTheRealTimeClockAndDoesNotGoBackOnAThread) {
  internal::TraceClock clock;
  std::atomic<bool> done{false};
  std::atomic<int64_t> reads{0}, backwards{0}, off{0}, worst_off_us{0};
  std::thread reader([&] {
    int64_t last = 0;
    while (!done.load()) {
      const int64_t before = internal::TraceClock::RealtimeNs() / 1000;
      const int64_t now = clock.Now();
      const int64_t after = internal::TraceClock::RealtimeNs() / 1000;
      ++reads;
      // Under a microsecond back where it starts reading the counter (the contract).
      if (now < last - 1) ++backwards;
      last = std::max(last, now);
      // Within 200 us of the real-time clock: a preempted read widens the bracket.
      const int64_t gap = now < before ? before - now : now > after ? now - after : 0;
      if (gap > 200) ++off;
      worst_off_us = std::max(worst_off_us.load(), gap);
    }
  });
  // Time passing is what is tested here (the writer calibrates every 100 ms; a
  // calibration needs 10 ms of baseline): the sleeps space the calibrations, they wait
  // for no event.
  for (int i = 0; i < 10; ++i) {
    absl::SleepFor(absl::Milliseconds(40));
    clock.Calibrate();
  }
  absl::SleepFor(absl::Milliseconds(40));
  done = true;
  reader.join();
  EXPECT_GT(reads.load(), 1000);
  EXPECT_EQ(backwards.load(), 0);
  EXPECT_EQ(off.load(), 0) << "worst gap to the real-time clock: " << worst_off_us.load() << " us";
  // Where the counter is invariant, the clock reads it after its first calibration.
  EXPECT_EQ(clock.reads_counter(), internal::TraceClock::InvariantCounter());
}

// "block" notifies `started` (when given) as it runs, and answers once the test releases it.
absl::Status RegisterBlock(Agent& agent, absl::Notification& release, absl::Notification* started = nullptr) {
  return agent.Register("block", [&release, started] {
    if (started != nullptr && !started->HasBeenNotified()) started->Notify();
    release.WaitForNotification();
    return int64_t{1};
  });
}

TEST(WaitsTest, ACallerWaitsOnABusyHandlerAndTheReportNamesIt) {
  absl::Notification release, started;
  auto group = AgentGroup::Start(2, [&](Agent& agent) { return RegisterBlock(agent, release, &started); });
  ASSERT_NE(group, nullptr);
  Future<int64_t> pending = (*group)[0].Async<int64_t>("worker1", "block");
  // Once worker1's handler thread runs it, its record says so.
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::StatusOr<std::vector<Wait>> read = (*group)[0].Send("worker1", WaitsQuery{}).Get(absl::Seconds(5));
  ASSERT_TRUE(read.ok()) << read.status();
  const std::vector<Wait> theirs = *read;
  std::vector<Wait> mine = (*group)[0].waits().Collect();
  auto waits_on_1 = [](const Wait& w) {
    return w.layer == "rpc" && w.state == "waits" && w.what == "call 'block'" && w.on == std::vector<int>{1};
  };
  ASSERT_TRUE(std::any_of(mine.begin(), mine.end(), waits_on_1));
  auto runs = std::find_if(theirs.begin(), theirs.end(), [](const Wait& w) { return w.state == "runs"; });
  ASSERT_NE(runs, theirs.end());
  EXPECT_EQ(runs->layer, "handler");
  EXPECT_EQ(runs->what, "'block' for worker0");
  EXPECT_TRUE(absl::StartsWith(runs->note, "thread gw-worker")) << runs->note;

  const std::string report = WhoWaitsOnWhom({{.worker = "worker0", .rank = 0, .answered = true, .waits = mine},
                                             {.worker = "worker1", .rank = 1, .answered = true, .waits = theirs}});
  EXPECT_TRUE(absl::StrContains(report, "worker0 waits on worker1 for call 'block'")) << report;
  EXPECT_TRUE(absl::StrContains(report, "At the root: worker1 (1 worker waits on it: worker0)")) << report;
  EXPECT_TRUE(absl::StrContains(report, "worker1 runs 'block' for worker0")) << report;

  // A worker that does not answer is the root of what waits on it.
  const std::string frozen = WhoWaitsOnWhom({{.worker = "worker0", .rank = 0, .answered = true, .waits = mine},
                                             {.worker = "worker1", .rank = 1, .error = "no answer within 1s"}});
  EXPECT_TRUE(absl::StrContains(frozen, "worker1 did not answer (no answer within 1s): it is frozen")) << frozen;
  release.Notify();
  EXPECT_TRUE(pending.Get(absl::Seconds(10)).ok());
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(WaitsTest, AStalledWorkerLogsWhoWaitsOnWhomOnce) {
  absl::Notification release;
  AgentOptions base;
  base.stall_report_after = absl::Milliseconds(300);
  ::testing::internal::CaptureStderr();
  auto group = AgentGroup::Start(
      2, [&release](Agent& agent) { return RegisterBlock(agent, release); }, base);
  ASSERT_NE(group, nullptr);
  Future<int64_t> pending = (*group)[0].Async<int64_t>("worker1", "block");
  const double reports = testing::AwaitSampleValue([&] { return (*group)[0].statistics().Collect(); },
                                                   "gradwire_stall_reports_total", {}, 1);
  release.Notify();
  EXPECT_TRUE(pending.Get(absl::Seconds(10)).ok());
  EXPECT_TRUE(group->ShutdownAll().ok());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(reports, 1);
  EXPECT_TRUE(absl::StrContains(err, "gradwire: worker0: call 'block' has waited")) << err;
  EXPECT_TRUE(absl::StrContains(err, "worker1 runs 'block' for worker0")) << err;
  EXPECT_EQ(testing::SampleValue((*group)[0].statistics().Collect(), "gradwire_stall_reports_total"), 1);
}

TEST(WaitsTest, TheMetricsEndpointServesThemAsJsonWhereTheStoreSays) {
  AgentOptions base;
  base.metrics_port = 0;  // any free port: the store says which
  auto group = AgentGroup::Start(2, testing::RegisterTestFunctions, base);
  ASSERT_NE(group, nullptr);
  absl::StatusOr<std::string> address = (*group)[1].store().Get("gradwire/metrics/1", absl::Seconds(5));
  ASSERT_TRUE(address.ok()) << address.status();
  absl::StatusOr<std::string> body = ReadEndpoint(*address, "/waits", "", absl::Seconds(5));
  ASSERT_TRUE(body.ok()) << body.status();
  absl::StatusOr<WorkerWaits> waits = WaitsFromJson(*body);
  ASSERT_TRUE(waits.ok()) << waits.status() << "\n" << *body;
  EXPECT_EQ(waits->worker, "worker1");
  EXPECT_EQ(waits->rank, 1);
  EXPECT_TRUE(ReadEndpoint(*address, "/metrics", "", absl::Seconds(5)).ok());
  EXPECT_FALSE(WaitsFromJson("{\"worker\": 3}").ok());
  absl::StatusOr<std::string> missing = ReadEndpoint(*address, "/nothing", "", absl::Seconds(5));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnknown) << missing.status();
  EXPECT_TRUE(group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::rpc
