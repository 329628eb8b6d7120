// End to end: the observability commands of the `gradwire` tool against real jobs:
// `gradwire trace merge/render` on the traces of a distributed backward pass, `gradwire
// debug` naming the culprit of planted hangs (a member that skips a collective, a
// frozen worker, a backward pass waiting for a gradient, a trainer stuck in its own
// code), and `gradwire top` under tmux.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent_group.h"
#include "child_process.h"
#include "gradwire/autograd/function.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/collectives/collectives.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_autograd/distributed_optimizer.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/store.h"
#include "gradwire/rpc/trace.h"
#include "gradwire/tensor/kernels.h"
#include "nlohmann/json.hpp"
#include "samples.h"
#include "scoped_temp_dir.h"

namespace gw::worker {
namespace {

using rpc::Agent;
using rpc::testing::AgentGroup;
using rpc::testing::ScopedTempDir;

struct CliRun {
  int exit_code;
  std::string out, err;
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `gradwire ARGS` through /bin/sh (the job's secret is in this process's environment).
CliRun RunCli(const std::string& args) {
  ScopedTempDir dir("gw-cli");
  const std::string command =
      std::string("'") + GRADWIRE_CLI_PATH + "' " + args + " >'" + dir.path() + "/out' 2>'" + dir.path() + "/err'";
  const int status = std::system(command.c_str());
  return CliRun{WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadText(dir.path() + "/out"),
                ReadText(dir.path() + "/err")};
}

// The address of the group's store as `gradwire debug` takes it.
std::string JobOf(const AgentGroup& group) {
  const std::string& a = group.store_address();
  const size_t colon = a.rfind(':');
  return absl::StrCat("--master-addr ", a.substr(0, colon), " --master-port ", a.substr(colon + 1));
}

rpc::AgentOptions Observed() {
  rpc::AgentOptions o;
  o.metrics_port = 0;  // each worker serves /waits; the store says where
  o.stall_report_after = absl::ZeroDuration();
  return o;
}

// `gradwire trace merge DIR -o DIR/merged.json`, parsed (discarded if it failed).
nlohmann::json MergeTraces(const std::string& dir, std::string* merged_path) {
  *merged_path = dir + "/merged.json";
  CliRun merge = RunCli(absl::StrCat("trace merge '", dir, "' -o '", *merged_path, "'"));
  EXPECT_EQ(merge.exit_code, 0) << merge.err;
  return nlohmann::json::parse(ReadText(*merged_path), nullptr, false);
}

TEST(TraceCliTest, MergedBackwardPassIsInCausalOrderAndRenders) {
  ScopedTempDir dir("gw-trace");
  rpc::AgentOptions o;
  o.trace_dir = dir.path();
  std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines(3);
  Generator gen(5);
  const Tensor w = Tensor::Randn({4, 4}, gen, DType::kFloat64).set_requires_grad(true);
  auto group = AgentGroup::Start(
      3,
      [&](Agent& a) -> absl::Status {
        if (absl::Status s = rpc::Assign(dist_autograd::DistAutograd::Install(a), engines[a.self().rank]); !s.ok()) {
          return s;
        }
        Agent* self = &a;
        (void)a.Register("stage", [w](Tensor x) { return Tanh(MatMul(x, w)); });
        (void)a.Register("stage_then", [w, self](Tensor x, std::string next) {
          return self->Sync<Tensor>(next, "stage", Tanh(MatMul(x, w)));
        });
        return absl::OkStatus();
      },
      o);
  ASSERT_NE(group, nullptr);
  std::string context;
  {
    auto optimizer =
        dist_autograd::DistributedOptimizer::Create((*group)[0], optim::Sgd{.lr = 0.1}, {(*group)[0].Own(w)});
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    dist_autograd::Context ctx(*engines[0]);
    context = ctx.id().ToString();
    Tensor x = Tensor::Randn({3, 4}, gen, DType::kFloat64).set_requires_grad(true);
    absl::StatusOr<Tensor> y = (*group)[0].Sync<Tensor>("worker1", "stage_then", x, std::string("worker2"));
    ASSERT_TRUE(y.ok()) << y.status();
    absl::Status pass = ctx.Backward({Sum(Mul(*y, *y))});
    ASSERT_TRUE(pass.ok()) << pass;
    ASSERT_TRUE((*optimizer)->Step(ctx).ok());
  }
  ASSERT_TRUE(group->ShutdownAll().ok());

  std::string merged_path;
  const nlohmann::json merged = MergeTraces(dir.path(), &merged_path);
  ASSERT_FALSE(merged.is_discarded());
  ASSERT_EQ(merged.at("gradwire").at("merged").size(), 3u);
  // Every flow ends after it starts, on the one clock; each worker's part of the backward
  // pass (its handler of the gradients) starts within the pass on worker0 (it may end a
  // moment after it: its reply can leave from another thread before the handler's
  // thread is done).
  std::map<std::string, double> starts, ends;
  double pass_begin = -1, pass_end = -1;
  std::map<int, std::pair<double, double>> grads;  // rank -> a "__dist.grad" handler
  std::set<std::string> functions;                 // "<pid> <send or recv function> <peer>"
  // The context's spans: "<pid> <category> <name>".
  std::set<std::string> in_context;
  for (const nlohmann::json& e : merged.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "s") starts[e.at("id")] = e.at("ts");
    if (ph == "f") ends[e.at("id")] = e.at("ts");
    if (ph != "X") continue;
    if (e.contains("args") && e.at("args").value("context", "") == context) {
      in_context.insert(absl::StrCat(e.at("pid").get<int>(), " ", e.at("cat").get<std::string>(), " ",
                                     e.at("name").get<std::string>()));
    }
    const double ts = e.at("ts"), dur = e.at("dur");
    if (e.at("name") == "backward pass" && e.at("pid") == 0) {
      pass_begin = ts;
      pass_end = ts + dur;
    }
    if (e.at("name") == "__dist.grad" && e.at("cat") == "rpc.handler") grads[e.at("pid")] = {ts, ts + dur};
    if (e.at("cat") == "dist_autograd" && absl::EndsWith(e.at("name").get<std::string>(), "Function")) {
      functions.insert(absl::StrCat(e.at("pid").get<int>(), " ", e.at("name").get<std::string>(), " ",
                                    e.at("args").at("peer").get<int>()));
      EXPECT_EQ(e.at("args").at("tensors"), 1) << e.dump();
    }
  }
  ASSERT_FALSE(starts.empty());
  for (const auto& [id, ts] : starts) {
    ASSERT_TRUE(ends.contains(id)) << "flow " << id;
    EXPECT_LE(ts, ends[id] + 50) << "flow " << id << " ends before it starts";  // us: clocks agree within 50 us
  }
  ASSERT_GE(pass_begin, 0) << "no backward pass on worker0";
  for (int rank : {1, 2}) {
    ASSERT_TRUE(grads.contains(rank)) << "worker" << rank << " handled no gradients";
    EXPECT_GE(grads[rank].first + 50, pass_begin) << "worker" << rank;
    EXPECT_LE(grads[rank].first, pass_end) << "worker" << rank;
  }

  // One context, followed across the workers: its forward calls on both sides (the nested
  // one from worker1's handler too), each worker's part of its backward pass and the
  // gradients' messages, and its optimizer step where it was asked for and where it ran.
  for (const char* want :
       {"0 rpc.send stage_then", "1 rpc.handler stage_then", "1 rpc.send stage", "2 rpc.handler stage",
        "0 rpc.reply stage_then", "0 dist_autograd backward pass", "1 rpc.handler __dist.grad",
        "1 dist_autograd backward", "2 rpc.handler __dist.grad", "2 dist_autograd backward",

        "0 rpc.send __dist.opt_step", "0 dist_autograd optimizer step"}) {
    EXPECT_TRUE(in_context.contains(want)) << want << " is not in context " << context;
  }

  // Each message of the forward, and each reply, has its send function where it left and
  // its recv function where it arrived; the backward pass ran every one of them: the
  // gradients went from worker0's recv (of worker1's reply) to worker1's send, and so on
  // down to worker2 and back to worker0's send (of its request).
  EXPECT_EQ(functions,
            (std::set<std::string>{"0 RecvFunction 1", "1 SendFunction 0", "1 RecvFunction 2", "2 SendFunction 1",
                                   "2 RecvFunction 1", "1 SendFunction 2", "1 RecvFunction 0", "0 SendFunction 1"}));

  CliRun render = RunCli(absl::StrCat("trace render '", merged_path, "' -o '", dir.path(), "/m.svg' --width 1000"));
  ASSERT_EQ(render.exit_code, 0) << render.err;
  const std::string svg = ReadText(dir.path() + "/m.svg");
  EXPECT_TRUE(absl::StartsWith(svg, "<svg")) << svg.substr(0, 200);
  for (const char* want : {"worker0 ", "worker1 ", "worker2 ", "marker-end", " ms</text>", "dist_autograd"}) {
    EXPECT_TRUE(absl::StrContains(svg, want)) << want;
  }
  EXPECT_EQ(RunCli(absl::StrCat("trace render '", merged_path, "' --from 1e9 -o /dev/null")).exit_code, 1);
}

TEST(TraceCliTest, MergeReadsTheSpillOfAKilledWorkerAndRefusesWhatIsNotATrace) {
  ScopedTempDir dir("gw-trace");
  {
    auto tracer = rpc::Tracer::Open(dir.path(), "worker0", 0);
    for (int i = 0; i < 10; ++i) rpc::Tracer::Scope s(*tracer, tracer->Intern("test"), tracer->Intern("step"));
    ASSERT_TRUE(tracer->Close().ok());
    EXPECT_FALSE(std::filesystem::exists(dir.path() + "/worker0.trace.spill"));  // turned into the JSON
  }
  {
    // worker1 "was killed": it never closed its trace, and its spill ends in the middle
    // of its last batch of spans.
    auto tracer = rpc::Tracer::Open(dir.path() + "/live", "worker1", 1);
    for (int i = 0; i < 3; ++i) rpc::Tracer::Scope s(*tracer, tracer->Intern("test"), tracer->Intern("step"));
    tracer->Flush();
    for (int i = 0; i < 5; ++i) rpc::Tracer::Scope s(*tracer, tracer->Intern("test"), tracer->Intern("late"));
    tracer->Flush();
    const std::string spill = ReadText(dir.path() + "/live/worker1.trace.spill");
    std::ofstream(dir.path() + "/worker1.trace.spill", std::ios::binary) << spill.substr(0, spill.size() - 10);
  }
  CliRun merge = RunCli(absl::StrCat("trace merge '", dir.path(), "'"));
  ASSERT_EQ(merge.exit_code, 0) << merge.err;
  EXPECT_TRUE(absl::StrContains(merge.err, "worker1.trace.spill was not closed")) << merge.err;
  nlohmann::json merged = nlohmann::json::parse(ReadText(dir.path() + "/merged.trace.json"), nullptr, false);
  ASSERT_FALSE(merged.is_discarded());
  std::map<std::string, int> from_killed;
  for (const nlohmann::json& e : merged.at("traceEvents")) {
    if (e.at("ph") == "X" && e.at("pid") == 1) ++from_killed[e.at("name").get<std::string>()];
  }
  // What was spilled before the cut, whole; the batch it cut, not at all.
  EXPECT_EQ(from_killed["step"], 3);
  EXPECT_LT(from_killed["late"], 5);
  nlohmann::json killed = nlohmann::json::parse(ReadText(dir.path() + "/worker1.trace.json"), nullptr, false);
  ASSERT_FALSE(killed.is_discarded());
  EXPECT_EQ(killed.at("gradwire").at("closed"), false);

  std::ofstream(dir.path() + "/junk.trace.spill") << "not a spill";
  CliRun junk = RunCli(absl::StrCat("trace merge '", dir.path(), "/junk.trace.spill'"));
  EXPECT_EQ(junk.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(junk.err, "junk.trace.spill is not a trace spill written by gradwire")) << junk.err;

  std::ofstream(dir.path() + "/other.json") << "{\"hello\": 1}";
  CliRun bad = RunCli(absl::StrCat("trace merge '", dir.path(), "/other.json'"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(bad.err, "other.json is not a trace written by gradwire")) << bad.err;
  EXPECT_EQ(RunCli("trace merge /no/such/dir").exit_code, 1);
  EXPECT_EQ(RunCli("trace frobnicate").exit_code, 2);
}

TEST(TraceCliTest, ParameterServerPushesAndPullsAreSpans) {
  ScopedTempDir dir("gw-trace");
  rpc::AgentOptions o;
  o.trace_dir = dir.path();
  auto group = AgentGroup::Start(
      3,
      [](Agent& a) {
        if (a.self().rank == 0) (void)*param_server::ParameterServer::Install(a, {});
      },
      o);
  ASSERT_NE(group, nullptr);
  {
    param_server::Client c0((*group)[1], {"worker0"}, 0, 2), c1((*group)[2], {"worker0"}, 1, 2);
    const optim::Sgd sgd{.lr = 1};
    ASSERT_TRUE(c0.CreateDense("w", Tensor::Ones({4}), sgd, param_server::Consistency::kSync).ok());
    ASSERT_TRUE(c1.CreateDense("w", Tensor::Ones({4}), sgd, param_server::Consistency::kSync).ok());
    for (int64_t step = 0; step < 3; ++step) {
      Future<Tensor> first = c0.PushPull("w", step, Tensor::Ones({4}));
      ASSERT_TRUE(c1.PushPull("w", step, Tensor::Ones({4})).Get().ok());
      ASSERT_TRUE(first.Get().ok());
    }
  }
  ASSERT_TRUE(group->ShutdownAll().ok());
  std::string merged_path;
  const nlohmann::json merged = MergeTraces(dir.path(), &merged_path);
  ASSERT_FALSE(merged.is_discarded());
  // Each trainer's pushes (clocks 0, 1, 2) and pulls (1, 2, 3) are async spans that end
  // after they begin; a pull of a synchronous table ends after the push of its step.
  std::map<std::string, std::string> key_of;               // "<pid> <id>" -> "<pid> <name> <clock>"
  std::map<std::string, std::pair<double, double>> spans;  // "<pid> <name> <clock>" -> [begin, end]
  for (const nlohmann::json& e : merged.at("traceEvents")) {
    if ((e.at("ph") != "b" && e.at("ph") != "e") || e.at("cat") != "param_server") continue;
    const std::string id = absl::StrCat(e.at("pid").get<int>(), " ", e.at("id").get<std::string>());
    if (e.at("ph") == "b") {
      key_of[id] = absl::StrCat(e.at("pid").get<int>(), " ", e.at("name").get<std::string>(), " ",
                                e.at("args").at("clock").get<int64_t>());
      spans[key_of[id]] = {e.at("ts"), -1};
    } else if (key_of.contains(id)) {
      spans[key_of[id]].second = e.at("ts");
    }
  }
  for (int pid : {1, 2}) {
    for (int64_t step = 0; step < 3; ++step) {
      const std::string push = absl::StrCat(pid, " push w ", step), pull = absl::StrCat(pid, " pull w ", step + 1);
      ASSERT_TRUE(spans.contains(push)) << push;
      ASSERT_TRUE(spans.contains(pull)) << pull;
      EXPECT_GE(spans[push].second, spans[push].first) << push;
      EXPECT_GE(spans[pull].second, spans[pull].first) << pull;
      EXPECT_GE(spans[pull].second, spans[push].first) << pull;
    }
  }
  CliRun render = RunCli(absl::StrCat("trace render '", merged_path, "' -o '", dir.path(), "/ps.svg'"));
  ASSERT_EQ(render.exit_code, 0) << render.err;
  EXPECT_TRUE(absl::StrContains(ReadText(dir.path() + "/ps.svg"), "param_server (async)"));
}

TEST(DebugCliTest, NamesTheMemberThatSkippedACollective) {
  std::vector<std::shared_ptr<collectives::Collectives>> colls(3);
  auto group = AgentGroup::Start(
      3, [&](Agent& a) { return rpc::Assign(collectives::Collectives::Install(a), colls[a.self().rank]); }, Observed());
  ASSERT_NE(group, nullptr);
  std::vector<std::shared_ptr<collectives::ProcessGroup>> pgs(3);
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<std::shared_ptr<collectives::ProcessGroup>> pg =
        colls[r]->NewGroup({0, 1, 2}, collectives::GroupOptions{.name = "ddp"});
    ASSERT_TRUE(pg.ok()) << pg.status();
    pgs[r] = *pg;
  }
  // Ranks 0 and 2 issue allreduce #0; worker1 is busy in its own code and does not.
  std::vector<Tensor> data(3);
  std::vector<Future<Tensor>> done;
  for (int r : {0, 2}) {
    data[r] = Tensor::Ones({8}, DType::kFloat32);
    done.push_back(pgs[r]->AllReduce(data[r]));
  }
  // By default waits shorter than a second are left out: a healthy job has many.
  CliRun brief = RunCli(absl::StrCat("debug ", JobOf(*group)));
  EXPECT_TRUE(absl::StrContains(brief.out, "left out (--min-wait)")) << brief.out;
  EXPECT_TRUE(absl::StrContains(brief.out, "No worker waits on another.")) << brief.out;
  CliRun debug = RunCli(absl::StrCat("debug --min-wait 0 ", JobOf(*group)));
  std::fputs(debug.out.c_str(), stdout);  // the report, in the test's log
  EXPECT_EQ(debug.exit_code, 0) << debug.err;
  EXPECT_TRUE(absl::StrContains(debug.out, "At the root: worker1")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker0 waits on worker1 for allreduce #0 of group 'ddp'")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker1 waits on no one and runs no handler")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker1's last: no collective of group 'ddp' yet")) << debug.out;
  data[1] = Tensor::Ones({8}, DType::kFloat32);
  done.push_back(pgs[1]->AllReduce(data[1]));
  for (auto& f : done) EXPECT_TRUE(f.Get(absl::Seconds(20)).ok());
  pgs.clear();
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(DebugCliTest, NamesABackwardPassWaitingForAGradient) {
  absl::Notification release, entered;
  std::vector<std::shared_ptr<dist_autograd::DistAutograd>> engines(3);
  auto group = AgentGroup::Start(
      3,
      [&](Agent& a) -> absl::Status {
        if (absl::Status s = rpc::Assign(dist_autograd::DistAutograd::Install(a), engines[a.self().rank]); !s.ok()) {
          return s;
        }
        Agent* self = &a;
        (void)a.Register("relay", [self](Tensor x) { return self->Sync<Tensor>("worker2", "slow_backward", x); });
        // Its backward says it started, then waits until the test releases it.
        (void)a.Register("slow_backward", [&release, &entered](Tensor x) {
          return autograd::Record("SlowBackward", {x}, kernels::MulScalar(x, 2.0),
                                  [&release, &entered](const Tensor& g) -> std::vector<Tensor> {
                                    entered.Notify();
                                    release.WaitForNotification();
                                    return {kernels::MulScalar(g, 2.0)};
                                  });
        });
        return absl::OkStatus();
      },
      Observed());
  ASSERT_NE(group, nullptr);
  std::thread trainer([&] {
    dist_autograd::Context ctx(*engines[0]);
    Tensor x = Tensor::Ones({2, 2}, DType::kFloat64).set_requires_grad(true);
    absl::StatusOr<Tensor> y = (*group)[0].Sync<Tensor>("worker1", "relay", x);
    ASSERT_TRUE(y.ok()) << y.status();
    absl::Status pass = ctx.Backward({Sum(*y)});
    EXPECT_TRUE(pass.ok()) << pass;
  });
  // Once the pass runs worker2's backward function, every wait of the chain is in place.
  EXPECT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(20)));
  CliRun debug = RunCli(absl::StrCat("debug --min-wait 0 ", JobOf(*group)));
  release.Notify();
  trainer.join();
  std::fputs(debug.out.c_str(), stdout);
  EXPECT_EQ(debug.exit_code, 0) << debug.err;
  EXPECT_TRUE(absl::StrContains(debug.out, "At the root: worker2")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker0 waits on worker1 for backward pass 1 of context")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker2 runs '__dist.grad' for worker1")) << debug.out;
  EXPECT_TRUE(group->ShutdownAll().ok());
}

TEST(DebugCliTest, NamesATrainerStuckInItsOwnCode) {
  using param_server::Client;
  auto group = AgentGroup::Start(
      3,
      [](Agent& a) {
        if (a.self().rank == 0) (void)*param_server::ParameterServer::Install(a, {});
      },
      Observed());
  ASSERT_NE(group, nullptr);
  Client c0((*group)[1], {"worker0"}, 0, 2), c1((*group)[2], {"worker0"}, 1, 2);
  const optim::Sgd sgd{.lr = 1};
  ASSERT_TRUE(c0.CreateDense("w", Tensor::Ones({4}), sgd, param_server::Consistency::kSync).ok());
  ASSERT_TRUE(c1.CreateDense("w", Tensor::Ones({4}), sgd, param_server::Consistency::kSync).ok());
  Future<Tensor> step0 = c0.PushPull("w", 0, Tensor::Ones({4}));
  ASSERT_TRUE(c1.PushPull("w", 0, Tensor::Ones({4})).Get().ok());
  ASSERT_TRUE(step0.Get().ok());
  // Step 1: trainer 0 (worker1) pushes and waits; trainer 1 (worker2) never comes.
  Future<Tensor> step1 = c0.PushPull("w", 1, Tensor::Ones({4}));
  // Once the server holds trainer 0's push of step 1 (its statistics say so), it waits.
  EXPECT_EQ(rpc::testing::AwaitSampleValue([&] { return (*group)[0].statistics().Collect(); },
                                           "gradwire_ps_table_step_pushed", {{"table", "w"}}, 1),
            1);
  CliRun debug = RunCli(absl::StrCat("debug --min-wait 0 ", JobOf(*group)));
  std::fputs(debug.out.c_str(), stdout);
  EXPECT_EQ(debug.exit_code, 0) << debug.err;
  EXPECT_TRUE(absl::StrContains(debug.out, "At the root: worker2")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker0 waits on worker2 for step 1 of table 'w'")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "done by worker1")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker2 waits on no one and runs no handler")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker2's last: trainer 1's push of clock 0")) << debug.out;
  ASSERT_TRUE(c1.PushPull("w", 1, Tensor::Ones({4})).Get().ok());
  EXPECT_TRUE(step1.Get().ok());
  EXPECT_TRUE(group->ShutdownAll().ok());
}

#ifdef GRADWIRE_RPC_TEST_WORKER
TEST(DebugCliTest, NamesAFrozenWorkerAndAnswersWithinItsTimeout) {
  // worker1 is a process of its own (the rpc tests' "worker" role), frozen with SIGSTOP;
  // heartbeats are off, so that worker0 keeps waiting instead of declaring it dead.
  absl::StatusOr<rpc::Security> security = rpc::Security::FromEnv();
  ASSERT_TRUE(security.ok());
  absl::StatusOr<std::unique_ptr<rpc::StoreServer>> store = rpc::StoreServer::Start("127.0.0.1", 0, *security);
  ASSERT_TRUE(store.ok()) << store.status();
  ScopedTempDir dir("gw-frozen");
  rpc::testing::ChildProcess child;
  ASSERT_TRUE(child
                  .Start({"/usr/bin/env", "GW_TEST_ROLE=worker", "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                          absl::StrCat("MASTER_PORT=", (*store)->port()), "GRADWIRE_METRICS_PORT=0",
                          "GRADWIRE_HEARTBEAT_INTERVAL=0", GRADWIRE_RPC_TEST_WORKER},
                         dir.path() + "/worker1.log")
                  .ok());
  rpc::AgentOptions o = Observed();
  o.world_size = 2;
  o.rendezvous = (*store)->address();
  o.host_store = false;
  o.heartbeat_interval = absl::ZeroDuration();
  absl::StatusOr<std::shared_ptr<Agent>> agent = Agent::Start(o);
  ASSERT_TRUE(agent.ok()) << agent.status() << rpc::testing::FileTail(dir.path() + "/worker1.log");
  absl::StatusOr<rpc::WorkerInfo> frozen = (*agent)->Worker("worker1");
  ASSERT_TRUE(frozen.ok());
  ASSERT_TRUE((*agent)->Sync<int64_t>("worker1", "noop").ok());  // connected before it freezes
  ASSERT_EQ(::kill(static_cast<pid_t>(frozen->pid), SIGSTOP), 0);
  // Stopped before the call is sent: else it may still answer it.
  ASSERT_TRUE(rpc::testing::AwaitStopped(static_cast<pid_t>(frozen->pid), absl::Seconds(10)));
  Future<int64_t> pending = (*agent)->Async<int64_t>("worker1", "noop");
  const std::string job = absl::StrCat("--master-addr 127.0.0.1 --master-port ", (*store)->port());
  const absl::Time start = absl::Now();
  CliRun debug = RunCli(absl::StrCat("debug ", job, " --timeout 1 --min-wait 0"));
  const absl::Duration took = absl::Now() - start;
  ::kill(static_cast<pid_t>(frozen->pid), SIGCONT);
  std::fputs(debug.out.c_str(), stdout);
  EXPECT_EQ(debug.exit_code, 0) << debug.err;
  EXPECT_TRUE(absl::StrContains(debug.out, "At the root: worker1")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker0 waits on worker1 for call 'noop'")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "worker1 did not answer (")) << debug.out;
  EXPECT_TRUE(absl::StrContains(debug.out, "it is frozen")) << debug.out;
  EXPECT_LT(took, absl::Seconds(5)) << "one frozen worker costs the timeout, not more";
  absl::StatusOr<int64_t> answer = pending.Get(absl::Seconds(20));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(*answer, 0);
  EXPECT_TRUE((*agent)->Shutdown().ok());
}
#endif

TEST(TopCliTest, ShowsARunningJobUnderTmux) {
  if (std::system("command -v tmux >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "tmux is not installed (apt-get install tmux)";
  auto group = AgentGroup::Start(
      2, [](Agent& a) { return a.Register("add", [](int64_t x, int64_t y) { return x + y; }); }, Observed());
  ASSERT_NE(group, nullptr);
  std::atomic<bool> stop{false};
  std::thread load([&] {
    while (!stop) (void)(*group)[0].Sync<int64_t>("worker1", "add", int64_t{1}, int64_t{2});
  });
  ScopedTempDir dir("gw-top");
  const std::string session = absl::StrCat("gwtop", ::getpid());
  const std::string screen = dir.path() + "/screen";
  // top in a detached tmux window of 120 columns; two refreshes, then the pane is captured.
  // top in a detached tmux window of 120 columns: two refreshes, then it signals the
  // channel the test waits on (tmux wait-for), and the pane is captured.
  const std::string top = absl::StrCat("'", GRADWIRE_CLI_PATH, "' top ", JobOf(*group),
                                       " --interval 0.5 --iterations 2; tmux wait-for -S ", session, "; sleep 30");
  ASSERT_EQ(std::system(absl::StrCat("tmux new-session -d -s ", session, " -x 120 -y 20 \"", top, "\"").c_str()), 0);
  EXPECT_EQ(std::system(absl::StrCat("timeout 30 tmux wait-for ", session).c_str()), 0);
  (void)std::system(absl::StrCat("tmux capture-pane -p -t ", session, " > '", screen, "'").c_str());
  const std::string captured = ReadText(screen);
  (void)std::system(absl::StrCat("tmux kill-session -t ", session, " 2>/dev/null").c_str());
  stop = true;
  load.join();
  EXPECT_TRUE(absl::StrContains(captured, "gradwire top: 2 workers")) << captured;
  EXPECT_TRUE(absl::StrContains(captured, "calls/s")) << captured;
  // worker0 calls worker1 without pause: its calls/s is well above zero, worker1 serves them.
  std::istringstream lines(captured);
  std::string line;
  double calls0 = -1, served1 = -1;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string name;
    double calls = 0, served = 0;
    fields >> name >> calls >> served;
    if (name == "worker0") calls0 = calls;
    if (name == "worker1") served1 = served;
  }
  EXPECT_GT(calls0, 10) << captured;
  EXPECT_GT(served1, 10) << captured;
  EXPECT_TRUE(group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::worker
