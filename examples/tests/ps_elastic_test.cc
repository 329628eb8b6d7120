// The README's main job grows while it trains: started under
// `gradwire launch --max-workers 6`, it is joined (`gradwire launch --join`) by a third
// trainer, which takes part in the synchronous steps from the next step boundary on, and
// by a third parameter server, onto which every table is re-sharded while the trainers
// train. The trainers that finish leave the job; the job ends with the accuracy it needs.
// Real processes on one simulated host (testing::HostNetwork: needs root and iproute2,
// skipped otherwise; CI runs as root).
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "host_network.h"

namespace gw::examples {
namespace {

using testing::HostNetwork;
using testing::HostProcess;

TEST(PsElasticTest, TheMainJobTakesATrainerAndAServerThatJoinItMidRun) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(1);
  ASSERT_TRUE(network.ok()) << network.status();
  const std::string port = "29511";  // the host is a private network namespace: it is free
  absl::StatusOr<HostProcess*> job = (*network)->Start(
      0,
      {GRADWIRE_CLI, "launch", "-n", "4", "--max-workers", "6", "--master-port", port, PS_FASHION_MNIST,
       "--servers=2", "--epochs=6", "--min_accuracy=0.80"},
      {{"OMP_NUM_THREADS", "1"}});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->AwaitText("parameters in", absl::Now() + absl::Seconds(120))) << (*job)->output();
  absl::StatusOr<HostProcess*> trainer = (*network)->Start(
      0, {GRADWIRE_CLI, "launch", "--join", "--master-port", port, PS_FASHION_MNIST, "--servers=2", "--epochs=1"},
      {{"OMP_NUM_THREADS", "1"}});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<HostProcess*> server = (*network)->Start(
      0, {GRADWIRE_CLI, "launch", "--join", "--master-port", port, PS_FASHION_MNIST, "--servers=2", "--join_as=server"},
      {{"OMP_NUM_THREADS", "1"}});
  ASSERT_TRUE(server.ok()) << server.status();

  const std::vector<int> codes = HostNetwork::WaitAll({*job, *trainer, *server}, absl::Now() + absl::Seconds(400));
  const std::string out = (*job)->output(), joined = (*trainer)->output(), added = (*server)->output();
  EXPECT_EQ(codes[0], 0) << out;
  EXPECT_EQ(codes[1], 0) << joined;
  EXPECT_EQ(codes[2], 0) << added;
  EXPECT_NE(out.find("final test accuracy"), std::string::npos) << out;
  // It took part in the others' steps: 6 epochs of 2 trainers are 2814 steps.
  const size_t at = joined.find("joined the job as trainer ");
  ASSERT_NE(at, std::string::npos) << joined;
  const size_t step = joined.find(" at step ", at);
  ASSERT_NE(step, std::string::npos) << joined;
  EXPECT_LT(std::stoll(joined.substr(step + 9)), 2814 - 100) << joined;
  EXPECT_NE(joined.find("test accuracy"), std::string::npos) << joined;
  EXPECT_NE(added.find("joined the job as a parameter server and took its share of 6 tables"), std::string::npos)
      << added;
}

}  // namespace
}  // namespace gw::examples
