// Follower and ServeCheckpoint (follower.h): a served model following a running
// parameter-server job, over real agents on loopback (servers, a trainer and a serving
// worker in one group).
#include "gradwire/serve/follower.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent_group.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"
#include "gradwire/serve/router.h"
#include "serve_testing.h"

namespace gw::serve {
namespace {

using testing::BitEqual;
using testing::Mlp;

// Ranks 0-1 parameter servers (checkpoints in a fresh directory), rank 2 the trainer,
// rank 3 serves "mnist" (an Mlp(99) until it follows the job); Serving on every rank.
struct TrainAndServe {
  std::string dir = absl::StrCat(::testing::TempDir(), "/follow_", ::getpid());
  std::unique_ptr<rpc::testing::AgentGroup> group;
  std::vector<std::shared_ptr<Serving>> serving{4};
  std::unique_ptr<param_server::Client> trainer;
  nn::NamedTensors initial = Mlp(1)->NamedParameters();
  Generator gen{7};

  TrainAndServe() {
    std::filesystem::remove_all(dir);
    absl::Mutex mu;
    group = rpc::testing::AgentGroup::Start(4, [&](rpc::Agent& a) -> absl::Status {
      if (a.self().rank < 2) {
        if (auto ps = param_server::ParameterServer::Install(a, {dir}); !ps.ok()) return ps.status();
      }
      absl::StatusOr<std::shared_ptr<Serving>> s = Serving::Install(a);
      if (!s.ok()) return s.status();
      absl::MutexLock lock(&mu);
      serving[static_cast<size_t>(a.self().rank)] = *s;
      return absl::OkStatus();
    });
    if (!group) return;
    trainer = std::make_unique<param_server::Client>((*group)[2], std::vector<std::string>{"worker0", "worker1"}, 0, 1);
    for (const auto& [name, p] : initial) {
      EXPECT_TRUE(trainer->CreateDense(name, p, optim::Sgd{.lr = 0.01}, param_server::Consistency::kSync).ok());
    }
    EXPECT_TRUE(serving[3]
                    ->Serve({.name = "mnist", .input_shape = {784}, .factory = [] { return Mlp(99); }}, Mlp(99), "init")
                    .ok());
  }
  ~TrainAndServe() {
    serving.clear();
    trainer.reset();
    if (group) (void)group->ShutdownAll();
    std::filesystem::remove_all(dir);
  }

  // One synchronous step of random gradients for every table; returns the parameters
  // after it, as the trainer pulls them.
  nn::NamedTensors Step(int64_t clock) {
    std::vector<std::string> names;
    std::vector<Tensor> grads;
    for (const auto& [name, p] : initial) {
      names.push_back(name);
      grads.push_back(Tensor::Randn(p.sizes(), gen));
    }
    absl::StatusOr<std::vector<Tensor>> next = trainer->PushPullMany(names, clock, grads).Get();
    EXPECT_TRUE(next.ok()) << next.status();
    nn::NamedTensors out;
    for (size_t i = 0; next.ok() && i < names.size(); ++i) out.emplace_back(names[i], (*next)[i]);
    return out;
  }
};

// The local model with `params`, on `x`.
Tensor Expected(const nn::NamedTensors& params, const Tensor& x) {
  std::shared_ptr<nn::Module> m = Mlp(5);
  EXPECT_TRUE(m->LoadStateDict(params).ok());
  autograd::NoGradGuard no_grad;
  return m->Forward(x);
}

FollowOptions Options(std::map<std::string, std::string> tables = {}) {
  return {.servers = {"worker0", "worker1"}, .tables = std::move(tables)};
}

// Refreshing every step while the job trains and a client predicts: every answer is the
// model of exactly one step, whole (its output equals the local model with that step's
// parameters, bit for bit), versions never go back, and the last step is served once
// training stops.
TEST(FollowerTest, ServesEveryStepWholeWhileTheJobTrains) {
  TrainAndServe job;
  ASSERT_NE(job.group, nullptr);
  FollowOptions options = Options();
  options.every_steps = 1;
  options.poll = absl::Milliseconds(1);
  absl::StatusOr<std::unique_ptr<Follower>> follower = Follower::Start(job.serving[3], "mnist", options);
  ASSERT_TRUE(follower.ok()) << follower.status();
  absl::StatusOr<Router> router = Router::Create(job.serving[3], "mnist");
  ASSERT_TRUE(router.ok()) << router.status();

  constexpr int kSteps = 30;
  std::map<int64_t, nn::NamedTensors> at_step{{0, job.initial}};
  const Tensor x = Tensor::Randn({1, 784}, job.gen);
  std::atomic<bool> training{true};
  std::vector<Prediction> seen;
  std::thread client([&] {
    while (training) {
      absl::StatusOr<Prediction> p = router->PredictSync(x);
      ASSERT_TRUE(p.ok()) << p.status();
      seen.push_back(*p);
    }
  });
  for (int64_t step = 0; step < kSteps; ++step) at_step[step + 1] = job.Step(step);
  training = false;
  client.join();

  ASSERT_TRUE((*follower)->Refresh().ok());
  const FollowStatus status = (*follower)->Status();
  EXPECT_EQ(status.version, absl::StrCat("step-", kSteps)) << status.ToString();
  EXPECT_EQ(status.served_step, kSteps);
  EXPECT_EQ(status.steps_behind, 0);
  EXPECT_GE(status.refreshes, 1);
  absl::StatusOr<Prediction> last = router->PredictSync(x);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->version, status.version);
  seen.push_back(*last);

  int64_t previous = -1;
  std::set<int64_t> versions;
  for (const Prediction& p : seen) {
    if (p.version == "init") {
      ASSERT_EQ(previous, -1) << "the initial version came back";
      continue;
    }
    ASSERT_EQ(p.version.rfind("step-", 0), 0u) << p.version;
    const int64_t step = std::stoll(p.version.substr(5));
    ASSERT_GE(step, previous) << "versions went back";
    previous = step;
    versions.insert(step);
    ASSERT_TRUE(at_step.contains(step)) << p.version;
    ASSERT_TRUE(BitEqual(p.output, Expected(at_step[step], x))) << "a torn or wrong model at " << p.version;
  }
  EXPECT_TRUE(versions.contains(kSteps));
  std::printf("%zu predictions while training saw %zu versions; %s\n", seen.size(), versions.size(),
              status.ToString().c_str());
}

// Refreshing every 10 steps: after 5 the model is still the first version and the status
// says it is 5 updates behind; after 10 it moves on.
TEST(FollowerTest, ReportsStalenessAndRefreshesEveryNSteps) {
  TrainAndServe job;
  ASSERT_NE(job.group, nullptr);
  FollowOptions options = Options();
  options.every_steps = 10;
  options.poll = absl::Milliseconds(1);
  absl::StatusOr<std::unique_ptr<Follower>> follower = Follower::Start(job.serving[3], "mnist", options);
  ASSERT_TRUE(follower.ok()) << follower.status();
  // Waits on the follower's own status changes (bounded).
  auto wait_for = [&](const std::function<bool(const FollowStatus&)>& done) {
    EXPECT_TRUE((*follower)->AwaitStatus(done, absl::Now() + absl::Seconds(20))) << (*follower)->Status().ToString();
    return (*follower)->Status();
  };
  FollowStatus s = wait_for([](const FollowStatus& s) { return s.served_step == 0; });
  ASSERT_EQ(s.version, "step-0") << s.ToString();
  for (int64_t step = 0; step < 5; ++step) job.Step(step);
  s = wait_for([](const FollowStatus& s) { return s.latest_step == 5; });
  EXPECT_EQ(s.served_step, 0) << s.ToString();
  EXPECT_EQ(s.steps_behind, 5) << s.ToString();
  EXPECT_GT(s.age, absl::ZeroDuration());
  // The staleness in the serving worker's statistics too.
  bool found = false;
  for (const rpc::Sample& sample : (*job.group)[3].statistics().Collect()) {
    if (sample.name == "gradwire_serve_follow_steps_behind" && sample.labels.at("model") == "mnist") {
      EXPECT_EQ(sample.value, 5.0);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  for (int64_t step = 5; step < 10; ++step) job.Step(step);
  s = wait_for([](const FollowStatus& s) { return s.served_step == 10; });
  EXPECT_EQ(s.version, "step-10") << s.ToString();
  EXPECT_EQ(s.refreshes, 2) << s.ToString();
  EXPECT_EQ(s.failures, 0) << s.ToString();
}

// A refresh that cannot read its tables fails, is reported, and the served version stays.
TEST(FollowerTest, AFailedRefreshKeepsTheServedVersionAndSaysWhy) {
  TrainAndServe job;
  ASSERT_NE(job.group, nullptr);
  EXPECT_EQ(Follower::Start(job.serving[3], "mnist", Options({{"no.such.parameter", "x"}})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Follower::Start(job.serving[3], "other", Options()).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::unique_ptr<Follower>> follower =
      Follower::Start(job.serving[3], "mnist", Options({{"0.weight", "missing_table"}}));
  ASSERT_TRUE(follower.ok()) << follower.status();
  absl::Status refreshed = (*follower)->Refresh();
  EXPECT_EQ(refreshed.code(), absl::StatusCode::kNotFound) << refreshed;
  EXPECT_NE(refreshed.message().find("missing_table"), std::string::npos) << refreshed;
  EXPECT_NE(refreshed.message().find("keeps serving"), std::string::npos) << refreshed;
  const FollowStatus s = (*follower)->Status();
  EXPECT_GE(s.failures, 1);
  EXPECT_EQ(s.last_error.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.served_step, -1);
  absl::StatusOr<Router> router = Router::Create(job.serving[3], "mnist");
  ASSERT_TRUE(router.ok());
  absl::StatusOr<Prediction> p = router->PredictSync(Tensor::Zeros({1, 784}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->version, "init");
}

// A parameter-server checkpoint swapped in as a version; a checkpoint that does not load
// leaves the served version.
TEST(FollowerTest, ServesAParameterServerCheckpoint) {
  TrainAndServe job;
  ASSERT_NE(job.group, nullptr);
  nn::NamedTensors params;
  for (int64_t step = 0; step < 3; ++step) params = job.Step(step);
  absl::StatusOr<param_server::CheckpointInfo> written = job.trainer->Checkpoint().Get();
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_TRUE(ServeCheckpoint(*job.serving[3], "mnist", job.dir, "ckpt-3").ok());
  absl::StatusOr<Router> router = Router::Create(job.serving[3], "mnist");
  ASSERT_TRUE(router.ok());
  const Tensor x = Tensor::Randn({1, 784}, job.gen);
  absl::StatusOr<Prediction> p = router->PredictSync(x);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->version, "ckpt-3");
  EXPECT_TRUE(BitEqual(p->output, Expected(params, x)));

  absl::Status bad = ServeCheckpoint(*job.serving[3], "mnist", job.dir + "/v00000009", "absent");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("keeps its current version"), std::string::npos) << bad;
  p = router->PredictSync(x);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->version, "ckpt-3");
}

}  // namespace
}  // namespace gw::serve
