// Reader (reader.h): dense tables read by a process that does not train, live and from
// checkpoints, over real agents on loopback.
#include "gradwire/param_server/reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "agent_group.h"
#include "scoped_temp_dir.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"
#include "gradwire/tensor/kernels.h"

namespace gw::param_server {
namespace {

// Two servers (ranks 0-1, checkpoints in `dir`), a trainer (rank 2) and a reader (rank 3).
struct ReadDeployment {
  std::unique_ptr<rpc::testing::AgentGroup> group;
  explicit ReadDeployment(const std::string& dir) {
    group = rpc::testing::AgentGroup::Start(4, [&](rpc::Agent& a) {
      if (a.self().rank < 2) (void)*ParameterServer::Install(a, {dir});
    });
  }
  Client Trainer() { return Client((*group)[2], {"worker0", "worker1"}, 0, 1); }
  Reader MakeReader() { return Reader((*group)[3], {"worker0", "worker1"}); }
};

TEST(ReaderTest, ReadsWhatTheTrainerPullsWithTheStepsApplied) {
  const rpc::testing::ScopedTempDir scoped_dir("reader");  // removed at the end, however the test ends
  const std::string dir = scoped_dir.path();
  ReadDeployment d(dir);
  ASSERT_NE(d.group, nullptr);
  Client trainer = d.Trainer();
  Generator gen(4);
  const Tensor w0 = Tensor::Randn({3, 5}, gen), b0 = Tensor::Randn({5}, gen);
  ASSERT_TRUE(trainer.CreateDense("w", w0, optim::Sgd{.lr = 0.5}, Consistency::kSync).ok());
  ASSERT_TRUE(trainer.CreateDense("b", b0, optim::Sgd{.lr = 0.5}, Consistency::kAsync).ok());
  const Reader reader = d.MakeReader();

  absl::StatusOr<TablesSnapshot> before = reader.Read({"w", "b"}, {{3, 5}, {5}}).Get();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(kernels::MaxAbsDiff(before->values[0], w0), 0.0);
  EXPECT_EQ(kernels::MaxAbsDiff(before->values[1], b0), 0.0);
  EXPECT_EQ(before->steps, (std::vector<int64_t>{0, 0}));
  EXPECT_TRUE(before->consistent());

  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(trainer.Push("w", step, Tensor::Randn({3, 5}, gen)).Get().ok());
  }
  ASSERT_TRUE(trainer.Push("b", 0, Tensor::Ones({5})).Get().ok());
  absl::StatusOr<Tensor> w3 = trainer.Pull("w", 3).Get(), b1 = trainer.Pull("b", 1).Get();
  ASSERT_TRUE(w3.ok() && b1.ok());
  absl::StatusOr<TablesSnapshot> after = reader.Read({"w", "b"}, {{15}, {5}}).Get();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->values[0].sizes(), Shape({15}));  // the shape asked for
  EXPECT_EQ(kernels::MaxAbsDiff(after->values[0], kernels::Reshape(*w3, {15})), 0.0);
  EXPECT_EQ(kernels::MaxAbsDiff(after->values[1], *b1), 0.0);
  EXPECT_EQ(after->steps, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(after->oldest, 1);
  EXPECT_EQ(after->newest, 3);
  EXPECT_FALSE(after->consistent());

  absl::StatusOr<TablesSnapshot> steps = reader.Steps({"w"}).Get();
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_TRUE(steps->values.empty());
  EXPECT_EQ(steps->steps, (std::vector<int64_t>{3}));

  // From the servers' checkpoint (the directory: its newest version): the same values and steps.
  absl::StatusOr<CheckpointInfo> written = trainer.Checkpoint().Get();
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->version, 1);
  EXPECT_EQ(written->step, 3);
  absl::StatusOr<TablesSnapshot> saved = Reader::LoadCheckpoint(dir, {"w", "b"}, {{3, 5}, {5}});
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(kernels::MaxAbsDiff(saved->values[0], *w3), 0.0);
  EXPECT_EQ(kernels::MaxAbsDiff(saved->values[1], *b1), 0.0);
  EXPECT_EQ(saved->steps, (std::vector<int64_t>{3, 1}));

  // Errors name what is wrong.
  absl::StatusOr<TablesSnapshot> missing = reader.Read({"nope"}, {{1}}).Get();
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos) << missing.status();
  absl::StatusOr<TablesSnapshot> shape = reader.Read({"w"}, {{4, 5}}).Get();
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("15 values"), std::string::npos) << shape.status();
  absl::StatusOr<TablesSnapshot> unknown = Reader::LoadCheckpoint(dir, {"nope"}, {{1}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  EXPECT_NE(unknown.status().message().find("'nope'"), std::string::npos) << unknown.status();
  absl::StatusOr<TablesSnapshot> no_version = Reader::LoadCheckpoint(dir + "/v00000007", {"w"}, {{3, 5}});
  EXPECT_EQ(no_version.status().code(), absl::StatusCode::kNotFound) << no_version.status();
  std::filesystem::remove(dir + "/v00000001/worker1.gwps");
  absl::StatusOr<TablesSnapshot> one_file = Reader::LoadCheckpoint(dir + "/v00000001", {"w"}, {{3, 5}});
  EXPECT_EQ(one_file.status().code(), absl::StatusCode::kNotFound) << one_file.status();
  EXPECT_NE(one_file.status().message().find("worker1.gwps"), std::string::npos) << one_file.status();
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::param_server
