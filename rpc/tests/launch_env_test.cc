// Unit: LaunchEnv (launch_env.h), the job's shape read from the variables that torchrun,
// `gradwire launch`, SLURM's srun and MPI launchers set.
#include "cluster/launch_env.h"

#include <gtest/gtest.h>

#include <map>

namespace gw::rpc::internal {
namespace {

EnvLookup From(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) {
    auto it = vars.find(name);
    return it == vars.end() ? std::string() : it->second;
  };
}

TEST(LaunchEnvTest, TorchrunVariablesComeFirstAndNeedAllFour) {
  absl::StatusOr<LaunchEnv> e = ReadLaunchEnv(From({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.1"},
                                                    {"MASTER_PORT", "29400"}, {"SLURM_PROCID", "0"},
                                                    {"SLURM_NTASKS", "8"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 29400);
  EXPECT_EQ(e->source, "RANK");
  absl::StatusOr<LaunchEnv> no_port = ReadLaunchEnv(From({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}}));
  EXPECT_EQ(no_port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_port.status().message().find("MASTER_ADDR and MASTER_PORT or GRADWIRE_RDZV"), std::string::npos) << no_port.status();
}

TEST(LaunchEnvTest, SlurmGivesRankSizeMasterHostAndAPortFromTheJobId) {
  absl::StatusOr<LaunchEnv> e = ReadLaunchEnv(From({{"SLURM_PROCID", "5"},
                                                    {"SLURM_NTASKS", "16"},
                                                    {"SLURM_NODELIST", "gpu[03-06,11],login1"},
                                                    {"SLURM_JOB_ID", "123456"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->world_size, 16);
  EXPECT_EQ(e->master_addr, "gpu03");
  EXPECT_EQ(e->master_port, 29500 + 3456);
  EXPECT_EQ(e->source, "SLURM");
  // Explicit values win; SLURM_JOB_NODELIST is read when SLURM_NODELIST is not set.
  e = ReadLaunchEnv(From({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n1,n2"},
                          {"MASTER_PORT", "4000"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->master_addr, "n1");
  EXPECT_EQ(e->master_port, 4000);
  e = ReadLaunchEnv(From({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "n1"},
                          {"MASTER_ADDR", "10.1.1.1"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->master_addr, "10.1.1.1");
}

TEST(LaunchEnvTest, OpenMpiAndPmiNeedMasterAddr) {
  absl::StatusOr<LaunchEnv> e = ReadLaunchEnv(From({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("MASTER_ADDR is not set"), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("Open MPI"), std::string::npos) << e.status();
  e = ReadLaunchEnv(From({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "head"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->world_size, 2);
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_EQ(e->source, "Open MPI");
  e = ReadLaunchEnv(From({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MASTER_ADDR", "head"}, {"MASTER_PORT", "5000"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->source, "PMI");
}

TEST(LaunchEnvTest, AKubernetesIndexedJobGivesTheRankAndTheManifestTheRest) {
  absl::StatusOr<LaunchEnv> e = ReadLaunchEnv(From({{"JOB_COMPLETION_INDEX", "3"}, {"WORLD_SIZE", "4"},
                                                    {"MASTER_ADDR", "train-0.train"}, {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->master_addr, "train-0.train");
  EXPECT_EQ(e->source, "Kubernetes");
  absl::StatusOr<LaunchEnv> no_size = ReadLaunchEnv(From({{"JOB_COMPLETION_INDEX", "3"}, {"MASTER_ADDR", "h"}}));
  EXPECT_EQ(no_size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_size.status().message().find("WORLD_SIZE"), std::string::npos) << no_size.status();
}

TEST(LaunchEnvTest, NothingOrNonsenseSaysWhatToSet) {
  absl::StatusOr<LaunchEnv> e = ReadLaunchEnv(From({}));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("gradwire launch"), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("srun"), std::string::npos) << e.status();
  for (auto bad : std::vector<std::map<std::string, std::string>>{
           {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"MASTER_ADDR", "h"}},
           {{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "4"}, {"MASTER_ADDR", "h"}},
           {{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}},
           {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}},
           {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_NODELIST", "gpu[01-04"}}}) {
    EXPECT_EQ(ReadLaunchEnv(From(bad)).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(LaunchEnvTest, FirstSlurmHostExpandsTheCompressedForm) {
  EXPECT_EQ(*FirstSlurmHost("node7"), "node7");
  EXPECT_EQ(*FirstSlurmHost("n[001-128]"), "n001");
  EXPECT_EQ(*FirstSlurmHost("gpu-[5,7-9]x,cpu1"), "gpu-5x");
  EXPECT_EQ(*FirstSlurmHost("rack[2-3]-node[08-12]"), "rack2-node08");
  EXPECT_EQ(*FirstSlurmHost("a,b"), "a");
  EXPECT_FALSE(FirstSlurmHost("").ok());
  EXPECT_FALSE(FirstSlurmHost("n[]").ok());
  EXPECT_FALSE(FirstSlurmHost("n[1-3").ok());
}

}  // namespace
}  // namespace gw::rpc::internal
