// Checkpoints and failures with real processes: a server killed with SIGKILL and started
// again from its checkpoint loses no acknowledged push, and the trainers' next calls
// reach it; a trainer killed mid-step makes the synchronous step fail naming it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <tuple>
#include <fstream>

#include "absl/strings/str_format.h"
#include "agent_group.h"
#include "rank_zero.h"
#include "scoped_temp_dir.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/reader.h"
#include "gradwire/param_server/server.h"
#include "gradwire/tensor/kernels.h"

namespace gw::param_server {
namespace {

using rpc::testing::ScopedTempDir;  // the checkpoints' directory, removed at the end of each test

using testing::StartRankZero;  // rank_zero.h

Tensor Ids(const std::vector<int64_t>& ids) { return Tensor::FromVector(ids, {static_cast<int64_t>(ids.size())}); }

void ExpectEqual(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  const Tensor x = kernels::Contiguous(a), y = kernels::Contiguous(b);
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.data<float>()[i], y.data<float>()[i]) << what << " at " << i;
}

// In one process: a checkpoint of dense and sparse tables, with optimizer state and an
// open synchronous step, loads into a fresh server that continues exactly as the first
// one would have.
TEST(CheckpointTest, AFreshServerContinuesFromTheCheckpointExactly) {
  const ScopedTempDir scoped_dir("ckpt_inproc");
  const std::string dir = scoped_dir.path();
  auto deploy = [&](std::vector<std::shared_ptr<ParameterServer>>& servers) {
    servers.assign(2, nullptr);
    return rpc::testing::AgentGroup::Start(3, [&](rpc::Agent& a) {
      if (a.self().rank < 2) servers[static_cast<size_t>(a.self().rank)] = *ParameterServer::Install(a, {dir});
    });
  };
  const optim::Sgd momentum{.lr = 0.1, .momentum = 0.9};
  const optim::Adam adam{.lr = 0.05};
  Generator gen(2);
  std::vector<Tensor> grads;
  for (int i = 0; i < 8; ++i) grads.push_back(Tensor::Randn({7}, gen));
  const Tensor ids = Ids({5, 6, 7, 123456789});
  auto run = [&](Client& c, int from, int to) {
    for (int step = from; step < to; ++step) {
      ASSERT_TRUE(c.Push("w", step, grads[static_cast<size_t>(step)]).Get().ok());
      ASSERT_TRUE(c.PushRows("emb", step, ids, kernels::Reshape(kernels::Narrow(grads[static_cast<size_t>(step)], 0, 0, 4), {4, 1})).Get().ok());
    }
  };
  auto create = [&](Client& c) {
    ASSERT_TRUE(c.CreateDense("w", Tensor::Ones({7}), momentum, Consistency::kAsync).ok());
    ASSERT_TRUE(c.CreateSparse("emb", 1, {RowInit{RowInit::Kind::kNormal, 0, 1, 3}}, adam, Consistency::kAsync).ok());
  };
  Tensor w_straight, emb_straight;
  {  // reference: 8 steps on one server pair without a restart (no checkpoint dir reuse)
    std::vector<std::shared_ptr<ParameterServer>> servers(2);
    auto g = rpc::testing::AgentGroup::Start(3, [&](rpc::Agent& a) {
      if (a.self().rank < 2) servers[static_cast<size_t>(a.self().rank)] = *ParameterServer::Install(a);
    });
    ASSERT_NE(g, nullptr);
    Client c((*g)[2], {"worker0", "worker1"}, 0, 1);
    create(c);
    run(c, 0, 8);
    w_straight = *c.Pull("w", 8).Get();
    emb_straight = *c.PullRows("emb", 8, ids).Get();
  }
  {
    std::vector<std::shared_ptr<ParameterServer>> servers;
    auto g = deploy(servers);
    ASSERT_NE(g, nullptr);
    Client c((*g)[2], {"worker0", "worker1"}, 0, 1);
    create(c);
    run(c, 0, 4);
    absl::StatusOr<CheckpointInfo> written = c.Checkpoint().Get();
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(written->version, 1);
    ASSERT_EQ(written->files, (std::vector<std::string>{"worker0.gwps", "worker1.gwps"}));
    for (const char* f : {"worker0.gwps", "worker1.gwps", "MANIFEST"}) {
      EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/v00000001/", f))) << f;
    }
    run(c, 4, 6);  // lost with the servers: not in the checkpoint
  }
  std::vector<std::shared_ptr<ParameterServer>> servers;
  auto g = deploy(servers);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(servers[0]->num_shards(), 2u) << "tables come back before any trainer creates them";
  Client c((*g)[2], {"worker0", "worker1"}, 0, 1);
  create(c);  // idempotent: the restored tables stay
  run(c, 4, 8);
  ExpectEqual(*c.Pull("w", 8).Get(), w_straight, "dense table with momentum");
  ExpectEqual(*c.PullRows("emb", 8, ids).Get(), emb_straight, "sparse table with Adam state");
  EXPECT_EQ(servers[0]->sparse_stats("emb")->rows + servers[1]->sparse_stats("emb")->rows, 4);
}

// A checkpoint, then steps the restart of the server (alone) loses: the trainers' next
// pushes move the restored table to their step, and training goes on from the
// checkpoint's values. A bounded sparse table whose capacity is not a multiple of the
// stripes restores too. A checkpoint asked for in the middle of a synchronous step is as
// of that step's start.
TEST(CheckpointTest, RestoredSynchronousTableJoinsTrainersThatAreAhead) {
  const ScopedTempDir scoped_dir("ckpt_ahead");
  const std::string dir = scoped_dir.path();
  auto deploy = [&]() {
    return rpc::testing::AgentGroup::Start(3, [&](rpc::Agent& a) {
      if (a.self().rank == 0) (void)*ParameterServer::Install(a, {dir});
    });
  };
  const optim::Sgd sgd{.lr = 1};
  const Tensor init = Tensor::Full({4}, 10.0);
  {
    auto g = deploy();
    ASSERT_NE(g, nullptr);
    Client c0((*g)[1], {"worker0"}, 0, 2), c1((*g)[2], {"worker0"}, 1, 2);
    ASSERT_TRUE(c0.CreateDense("w", init, sgd, Consistency::kSync).ok());
    ASSERT_TRUE(c1.CreateDense("w", init, sgd, Consistency::kSync).ok());
    ASSERT_TRUE(c0.CreateSparse("emb", 2, {RowInit{RowInit::Kind::kZeros}, /*capacity=*/13}, sgd, Consistency::kAsync).ok());
    std::vector<int64_t> many;
    for (int64_t id = 0; id < 40; ++id) many.push_back(id);
    ASSERT_TRUE(c0.PullRows("emb", 0, Ids(many)).Get().ok());  // fills the 13 rows
    ASSERT_TRUE(c0.Checkpoint().Get().ok());  // at step 0
    ASSERT_TRUE(c0.Push("w", 0, Tensor::Ones({4})).Get().ok());
    // Step 0 open, trainer 0's push in it: the cut is as of the step's start.
    absl::StatusOr<CheckpointInfo> second = c0.Checkpoint().Get();
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(second->step, 0);
    ASSERT_TRUE(c1.Push("w", 0, Tensor::Ones({4})).Get().ok());
    EXPECT_EQ(second->version, 2);
    for (int step = 1; step < 3; ++step) {
      Future<Tensor> a = c0.PushPull("w", step, Tensor::Ones({4}));
      ASSERT_TRUE(c1.PushPull("w", step, Tensor::Ones({4})).Get().ok());
      ASSERT_TRUE(a.Get().ok());
    }
  }
  std::filesystem::remove_all(dir + "/v00000002");  // the first version is restored
  auto g = deploy();
  ASSERT_NE(g, nullptr) << "the checkpoint (a sparse table of capacity 13 on 8 stripes) loads";
  Client c0((*g)[1], {"worker0"}, 0, 2), c1((*g)[2], {"worker0"}, 1, 2);
  ASSERT_TRUE(c0.CreateDense("w", init, sgd, Consistency::kSync).ok());
  ASSERT_TRUE(c1.CreateDense("w", init, sgd, Consistency::kSync).ok());
  EXPECT_EQ(c0.CreateDense("w", init, sgd, Consistency::kAsync).code(), absl::StatusCode::kAlreadyExists)
      << "another consistency for an existing table is refused";
  Future<Tensor> a = c0.PushPull("w", 3, Tensor::Full({4}, 2.0));
  absl::StatusOr<Tensor> b = c1.PushPull("w", 3, Tensor::Full({4}, 4.0)).Get();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(a.Get().ok()) << a.Get().status();
  // The checkpoint's values (no step applied yet) minus the mean of step 3's pushes.
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(b->data<float>()[i], 10.0f - 3.0f) << i;
  absl::StatusOr<CheckpointInfo> again = c0.Checkpoint().Get();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->step, 4);
  EXPECT_EQ(again->version, 2) << "numbered after the newest version in the directory";
}

TEST(CheckpointTest, WithoutADirectoryCheckpointsAreRefusedWithTheReason) {
  std::vector<std::shared_ptr<ParameterServer>> servers(1);
  auto g = rpc::testing::AgentGroup::Start(2, [&](rpc::Agent& a) {
    if (a.self().rank == 0) servers[0] = *ParameterServer::Install(a);
  });
  ASSERT_NE(g, nullptr);
  Client c((*g)[1], {"worker0"}, 0, 1);
  absl::StatusOr<CheckpointInfo> written = c.Checkpoint().Get();
  EXPECT_EQ(written.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(written.status().message().find("checkpoint_dir"), std::string::npos) << written.status();
}

// A trainer's client cuts a version every period while it pushes; the servers keep the
// newest `checkpoint_keep`. A damaged newest version is passed over (named) for the one
// before; when none is usable the server does not start, naming each and the way out.
TEST(CheckpointTest, PeriodicVersionsAreKeptAndADamagedOneIsPassedOver) {
  const ScopedTempDir scoped_dir("ckpt_periodic");
  const std::string dir = scoped_dir.path();
  {
    std::vector<std::shared_ptr<ParameterServer>> servers(1);
    auto g = rpc::testing::AgentGroup::Start(2, [&](rpc::Agent& a) {
      if (a.self().rank == 0) servers[0] = *ParameterServer::Install(a, {.checkpoint_dir = dir, .checkpoint_keep = 2});
    });
    ASSERT_NE(g, nullptr);
    Client c((*g)[1], {"worker0"}, 0, 1, ClientOptions{.checkpoint_every = absl::Milliseconds(50)});
    ASSERT_TRUE(c.CreateDense("w", Tensor::Ones({3}), optim::Sgd{.lr = 1}, Consistency::kSync).ok());
    int64_t step = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (servers[0]->checkpoint_stats().written < 4 && absl::Now() < deadline) {
      ASSERT_TRUE(c.PushPull("w", step, Tensor::Ones({3})).Get().ok());
      ++step;
    }
    const CheckpointStats stats = servers[0]->checkpoint_stats();
    EXPECT_GE(stats.written, 4);
    EXPECT_EQ(stats.failed, 0);
    EXPECT_GT(stats.last_bytes, 0);
    // The same in the agent's statistics.
    bool seen = false;
    for (const rpc::Sample& s : (*g)[0].statistics().Collect()) {
      if (s.name == "gradwire_ps_checkpoint_versions_written_total") {
        seen = true;
        EXPECT_GE(s.value, 4.0);
      }
    }
    EXPECT_TRUE(seen) << rpc::ToText((*g)[0].statistics().Collect());
    (void)c.LastCheckpoint().Get();  // a cut under way completes (or fails) before the directory is read
  }
  std::vector<int64_t> complete;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (std::filesystem::exists(e.path() / "MANIFEST")) complete.push_back(std::stoll(e.path().filename().string().substr(1)));
  }
  std::sort(complete.rbegin(), complete.rend());
  ASSERT_EQ(complete.size(), 2u) << "checkpoint_keep = 2";
  auto file_of = [&](int64_t v) { return absl::StrFormat("%s/v%08d/worker0.gwps", dir, v); };
  std::filesystem::resize_file(file_of(complete[0]), 40);  // the newest, truncated
  {
    std::vector<std::shared_ptr<ParameterServer>> servers(1);
    auto g = rpc::testing::AgentGroup::Start(2, [&](rpc::Agent& a) {
      if (a.self().rank == 0) servers[0] = *ParameterServer::Install(a, {.checkpoint_dir = dir});
    });
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(servers[0]->restored().version, complete[1]);
    ASSERT_EQ(servers[0]->restored().skipped.size(), 1u);
    EXPECT_NE(servers[0]->restored().skipped[0].find(file_of(complete[0])), std::string::npos)
        << servers[0]->restored().skipped[0];
    Client c((*g)[1], {"worker0"}, 0, 1);
    ASSERT_TRUE(c.CreateDense("w", Tensor::Ones({3}), optim::Sgd{.lr = 1}, Consistency::kSync).ok());
    absl::StatusOr<ResumePoint> resume = c.Resume();
    ASSERT_TRUE(resume.ok()) << resume.status();
    EXPECT_EQ(resume->version, complete[1]);
    EXPECT_GT(resume->step, 0);
  }
  std::filesystem::resize_file(file_of(complete[1]), 40);
  absl::Status installed;
  auto g = rpc::testing::AgentGroup::Start(2, [&](rpc::Agent& a) {
    if (a.self().rank == 0) installed = ParameterServer::Install(a, {.checkpoint_dir = dir}).status();
  });
  EXPECT_EQ(installed.code(), absl::StatusCode::kFailedPrecondition) << installed;
  EXPECT_NE(installed.message().find(file_of(complete[0])), std::string::npos) << installed;
  EXPECT_NE(installed.message().find(file_of(complete[1])), std::string::npos) << installed;
  EXPECT_NE(installed.message().find("start fresh"), std::string::npos) << installed;
}

// Servers with a directory each (one per host): each writes its own file and the manifest
// into its own directory, which says the directory was not shared; each restores the
// version from its own file; a reader of one directory misses the other server's file.
TEST(CheckpointTest, ServersWithADirectoryEachRestoreOneVersionFromTheirOwnFiles) {
  const ScopedTempDir dir0("ckpt_host0"), dir1("ckpt_host1");
  auto deploy = [&](std::vector<std::shared_ptr<ParameterServer>>& servers) {
    servers.assign(2, nullptr);
    return rpc::testing::AgentGroup::Start(3, [&](rpc::Agent& a) {
      const int rank = a.self().rank;
      if (rank < 2) {
        servers[static_cast<size_t>(rank)] =
            *ParameterServer::Install(a, {.checkpoint_dir = rank == 0 ? dir0.path() : dir1.path()});
      }
    });
  };
  Tensor saved;
  {
    std::vector<std::shared_ptr<ParameterServer>> servers;
    auto g = deploy(servers);
    ASSERT_NE(g, nullptr);
    Client c((*g)[2], {"worker0", "worker1"}, 0, 1);
    ASSERT_TRUE(c.CreateDense("w", Tensor::Ones({6}), optim::Sgd{.lr = 0.5, .momentum = 0.9}, Consistency::kSync).ok());
    for (int64_t step = 0; step < 3; ++step) {
      ASSERT_TRUE(c.Push("w", step, Tensor::Full({6}, static_cast<double>(step + 1))).Get().ok());
      if (step == 1) {
        ASSERT_TRUE(c.Checkpoint().Get().ok());
      }
    }
    absl::StatusOr<CheckpointInfo> v2 = c.Checkpoint().Get();
    ASSERT_TRUE(v2.ok()) << v2.status();
    EXPECT_EQ(v2->version, 2);
    EXPECT_EQ(v2->step, 3);
    saved = *c.Pull("w", 3).Get();
  }
  for (const auto& [dir, own, other] : {std::tuple{dir0.path(), "worker0.gwps", "worker1.gwps"},
                                        std::tuple{dir1.path(), "worker1.gwps", "worker0.gwps"}}) {
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/v00000002/", own))) << dir;
    EXPECT_FALSE(std::filesystem::exists(absl::StrCat(dir, "/v00000002/", other))) << dir;
    std::ifstream manifest(absl::StrCat(dir, "/v00000002/MANIFEST"));
    const std::string text((std::istreambuf_iterator<char>(manifest)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"shared_directory\": false"), std::string::npos) << text;
  }
  absl::StatusOr<TablesSnapshot> read = Reader::LoadCheckpoint(dir0.path(), {"w"}, {{6}});
  EXPECT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("worker1.gwps"), std::string::npos) << read.status();
  std::vector<std::shared_ptr<ParameterServer>> servers;
  auto g = deploy(servers);
  ASSERT_NE(g, nullptr);
  for (const auto& server : servers) {
    EXPECT_EQ(server->restored().version, 2);
    EXPECT_EQ(server->restored().step, 3);
  }
  Client c((*g)[2], {"worker0", "worker1"}, 0, 1);
  ASSERT_TRUE(c.CreateDense("w", Tensor::Ones({6}), optim::Sgd{.lr = 0.5, .momentum = 0.9}, Consistency::kSync).ok());
  absl::StatusOr<ResumePoint> resume = c.Resume();
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_EQ(resume->version, 2);
  EXPECT_EQ(resume->step, 3);
  ExpectEqual(*c.Pull("w", 3).Get(), saved, "restored from each server's own directory");
}

// This process is rank 0 (store, both trainers' clients); ranks 1 and 2 are server
// processes. Server 1 is killed with SIGKILL after a checkpoint that follows an
// acknowledged push of an open synchronous step, and started again.
TEST(CheckpointTest, ServerKilledAndRestartedLosesNoAcknowledgedPush) {
  const ScopedTempDir scoped_dir("ckpt_kill");
  const std::string dir = scoped_dir.path();
  auto free_port = rpc::StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(free_port.ok());
  const int port = (*free_port)->port();
  (*free_port)->Shutdown();
  auto env = [&](int rank) {
    return std::map<std::string, std::string>{{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "3"},
                                              {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                                              {"GW_PS_CHECKPOINT_DIR", dir}};
  };
  std::vector<pid_t> servers = {rpc::testing::SpawnSelf("ps_server", env(1)), rpc::testing::SpawnSelf("ps_server", env(2))};
  std::shared_ptr<rpc::Agent> agent = StartRankZero(3, port);
  ASSERT_NE(agent, nullptr);
  const ClientOptions options{.sync_timeout = absl::Seconds(30), .reconnect_timeout = absl::Seconds(30)};
  Client c0(*agent, {"worker1", "worker2"}, 0, 2, options), c1(*agent, {"worker1", "worker2"}, 1, 2, options);
  const optim::Sgd sgd{.lr = 0.1, .momentum = 0.9};
  ASSERT_TRUE(c0.CreateDense("w", Tensor::Zeros({9}), sgd, Consistency::kSync).ok());
  ASSERT_TRUE(c0.CreateSparse("emb", 2, {RowInit{RowInit::Kind::kZeros}}, optim::Sgd{.lr = 1}, Consistency::kSync).ok());
  for (Client* c : {&c0, &c1}) {
    ASSERT_TRUE(c->CreateDense("w", Tensor::Zeros({9}), sgd, Consistency::kSync).ok());
    ASSERT_TRUE(c->CreateSparse("emb", 2, {RowInit{RowInit::Kind::kZeros}}, optim::Sgd{.lr = 1}, Consistency::kSync).ok());
  }
  // Reference: the same steps applied locally.
  Tensor w = Tensor::Zeros({9});
  optim::ParamState state;
  Generator gen(6);
  const Tensor ids = Ids({1, 2, 3, 4, 5, 6});
  std::vector<float> emb(12, 0.0f);
  auto step_both = [&](int step, bool check) {
    Tensor g0 = Tensor::Randn({9}, gen), g1 = Tensor::Randn({9}, gen);
    Future<Tensor> a = c0.PushPull("w", step, g0);
    Future<Tensor> b = c1.PushPull("w", step, g1);
    ASSERT_TRUE(c0.PushRows("emb", step, ids, Tensor::Ones({6, 2})).Get().ok());
    ASSERT_TRUE(c1.PushRows("emb", step, ids, Tensor::Ones({6, 2})).Get().ok());
    optim::Update(sgd, w, kernels::MulScalar(kernels::Add(g0, g1), 0.5), state);
    for (float& v : emb) v -= 1.0f;
    absl::StatusOr<Tensor> ra = a.Get(), rb = b.Get();
    ASSERT_TRUE(ra.ok()) << ra.status();
    ASSERT_TRUE(rb.ok()) << rb.status();
    if (check) ExpectEqual(*ra, w, absl::StrCat("step ", step));
  };
  for (int step = 0; step < 3; ++step) step_both(step, true);

  // A checkpoint at the start of step 3, then worker1 is killed.
  absl::StatusOr<CheckpointInfo> cut = c0.Checkpoint().Get();
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->step, 3);
  ::kill(servers[0], SIGKILL);
  EXPECT_EQ(rpc::testing::WaitForExit(servers[0]), 128 + SIGKILL);
  // Trainer 1's pushes of step 3 wait (retrying) until worker1 is back, restored.
  Tensor g0 = Tensor::Randn({9}, gen), g1 = Tensor::Randn({9}, gen);
  Future<Tensor> next = c1.PushPull("w", 3, g1);
  Future<bool> rows_pushed = c1.PushRows("emb", 3, ids, Tensor::Zeros({6, 2}));
  absl::SleepFor(absl::Milliseconds(500));
  servers[0] = rpc::testing::SpawnSelf("ps_server", env(1));
  ASSERT_TRUE(c0.Push("w", 3, g0).Get().ok());
  ASSERT_TRUE(c0.PushRows("emb", 3, ids, Tensor::Full({6, 2}, 2.0)).Get().ok());
  absl::StatusOr<Tensor> after = next.Get();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_TRUE(rows_pushed.Get().ok());
  optim::Update(sgd, w, kernels::MulScalar(kernels::Add(g0, g1), 0.5), state);
  for (float& v : emb) v -= 1.0f;  // mean of 2 and 0
  ExpectEqual(*after, w, "step 3 completed by the restarted server from the checkpoint's values");
  absl::StatusOr<Tensor> rows = c0.PullRows("emb", 4, ids).Get();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ExpectEqual(*rows, Tensor::FromVector(emb, {6, 2}), "sparse rows after the restart");
  for (int step = 4; step < 6; ++step) step_both(step, true);  // the job continues

  // Step 6: trainer 0's push is acknowledged after the last checkpoint and dies with the
  // server. Its pull, retried, sends the push again, so the step still completes.
  Tensor h0 = Tensor::Randn({9}, gen), h1 = Tensor::Randn({9}, gen);
  ASSERT_TRUE(c0.Push("w", 6, h0).Get().ok());
  ::kill(servers[0], SIGKILL);
  EXPECT_EQ(rpc::testing::WaitForExit(servers[0]), 128 + SIGKILL);
  Future<Tensor> pulled0 = c0.Pull("w", 7);
  Future<bool> pushed1 = c1.Push("w", 6, h1);
  absl::SleepFor(absl::Milliseconds(300));
  servers[0] = rpc::testing::SpawnSelf("ps_server", env(1));
  ASSERT_TRUE(pushed1.Get().ok()) << pushed1.Get().status();
  absl::StatusOr<Tensor> step7 = pulled0.Get();
  ASSERT_TRUE(step7.ok()) << step7.status();
  EXPECT_EQ(step7->numel(), 9);

  ASSERT_TRUE(agent->Shutdown().ok());
  for (pid_t p : servers) EXPECT_EQ(rpc::testing::WaitForExit(p), 0);
}

// A trainer process pushes half of a synchronous step and is killed: the other trainer's
// pull fails after the step timeout naming it, instead of hanging.
TEST(CheckpointTest, ATrainerKilledMidStepFailsTheStepAtOnceNamingIt) {
  auto free_port = rpc::StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(free_port.ok());
  const int port = (*free_port)->port();
  (*free_port)->Shutdown();
  auto env = [&](int rank, const std::string& trainer) {
    return std::map<std::string, std::string>{{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "3"},
                                              {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                                              {"GW_PS_TRAINER", trainer}};
  };
  const pid_t server = rpc::testing::SpawnSelf("ps_server", env(1, ""));
  const pid_t trainer1 = rpc::testing::SpawnSelf("ps_trainer", env(2, "1"));
  std::shared_ptr<rpc::Agent> agent = StartRankZero(3, port);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->store().Wait({"pushed/1"}, absl::Seconds(30)).ok());
  // Trainer 1 pushed step 0; trainer 0 (here) completes step 0, then waits in step 1 for
  // trainer 1, which is killed. The table's sync_timeout is a minute: only the server's
  // learning of the death can end the wait sooner.
  Client c0(*agent, {"worker1"}, 0, 2, absl::Seconds(60));
  ASSERT_TRUE(c0.CreateDense("w", Tensor::Zeros({8}), optim::Sgd{.lr = 1}, Consistency::kSync).ok());
  absl::StatusOr<Tensor> step1 = c0.PushPull("w", 0, Tensor::Ones({8})).Get();
  ASSERT_TRUE(step1.ok()) << "step 0 had both pushes: " << step1.status();
  EXPECT_EQ(step1->data<float>()[0], -1.0f);
  Future<Tensor> waiting = c0.PushPull("w", 1, Tensor::Ones({8}));
  ::kill(trainer1, SIGKILL);
  EXPECT_EQ(rpc::testing::WaitForExit(trainer1), 128 + SIGKILL);
  absl::StatusOr<Tensor> step2 = waiting.Get(absl::Seconds(50));
  EXPECT_EQ(step2.status().code(), absl::StatusCode::kUnavailable) << step2.status();
  EXPECT_NE(step2.status().message().find("synchronous step 1 of table 'w' on worker1 cannot complete: trainer 1 "
                                          "(worker2) was declared dead"),
            std::string::npos)
      << step2.status();
  // A pull that would wait for the dead trainer later fails at once too.
  absl::StatusOr<Tensor> again = c0.Pull("w", 2).Get(absl::Seconds(50));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
  EXPECT_NE(again.status().message().find("trainer 1 (worker2)"), std::string::npos) << again.status();
  (void)agent->Shutdown(/*graceful=*/false);
  ::kill(server, SIGKILL);
  rpc::testing::WaitForExit(server);
}

}  // namespace
}  // namespace gw::param_server
