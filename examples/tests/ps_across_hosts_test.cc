// The README's main job across three hosts: the real ps_fashion_mnist binary started as 4
// processes with the rendezvous environment (no launcher), each of the 2 parameter
// servers (ranks 0 and 1, rank 0 hosting the store at MASTER_ADDR) on a simulated host of
// its own and the 2 trainers on a third (testing::HostNetwork: network namespaces on a
// bridge), with 1 ms of round trip between any two processes (0.5 ms each way, added by
// the fault transport's delay: this machine's kernel has no netem).
// Every process must exit 0, trainer 0 must reach the required accuracy, every process
// must have announced an address of its own host, and no tensor may have gone through
// shared memory (the processes could read each other's memory, but hosts do not share
// it). Needs root and iproute2 (skipped otherwise; CI runs as root).
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "host_network.h"

namespace gw::examples {
namespace {

using testing::HostNetwork;
using testing::HostProcess;

constexpr int kServers = 2, kTrainers = 2;
constexpr double kMinAccuracy = 0.80;  // two epochs reach about 0.85

// The rest of the last line of `text` that starts with `prefix` ("" if none).
std::string After(const std::string& text, const std::string& prefix) {
  std::string rest;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, prefix)) rest = std::string(line);
  }
  return rest;
}

TEST(PsAcrossHostsTest, TwoServerHostsAndATrainerHostTrainOverTheNetworkWithAMillisecondOfRoundTrip) {
  if (std::string why = HostNetwork::Unsupported(); !why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::unique_ptr<HostNetwork>> network = HostNetwork::Create(3);
  ASSERT_TRUE(network.ok()) << network.status();
  const int world = kServers + kTrainers;
  auto host_of = [](int rank) { return rank < kServers ? rank : kServers; };
  std::vector<HostProcess*> workers;
  for (int rank = 0; rank < world; ++rank) {
    absl::StatusOr<HostProcess*> p = (*network)->Start(
        host_of(rank),
        {PS_FASHION_MNIST, absl::StrCat("--servers=", kServers), "--epochs=2",
         absl::StrCat("--min_accuracy=", kMinAccuracy), "--show_network"},
        {{"RANK", std::to_string(rank)},
         {"WORLD_SIZE", std::to_string(world)},
         {"MASTER_ADDR", (*network)->address(0)},
         {"MASTER_PORT", "29500"},
         {"GRADWIRE_FAULTS", "delay:500us-500us,seed:1"},
         {"OMP_NUM_THREADS", "1"}});  // four processes share this machine's cores
    ASSERT_TRUE(p.ok()) << p.status();
    workers.push_back(*p);
  }
  const std::vector<int> codes = HostNetwork::WaitAll(workers, absl::Now() + absl::Seconds(240));
  for (int rank = 0; rank < world; ++rank) {
    const std::string out = workers[static_cast<size_t>(rank)]->output();
    const std::string name = absl::StrCat("worker", rank);
    EXPECT_EQ(codes[static_cast<size_t>(rank)], 0) << name << ":\n" << out;
    // It announced an address of its own host (the trainers dialled the servers there).
    const std::string announced = After(out, name + ": announced ");
    EXPECT_EQ(announced.substr(0, announced.rfind(':')), (*network)->address(host_of(rank))) << name << ":\n" << out;
    // Servers and trainers talk only across hosts: nothing through shared memory.
    EXPECT_EQ(After(out, name + ": shared memory: "), "connections=0 tensors=0") << name << ":\n" << out;
  }
  const std::string trainer0 = workers[kServers]->output();
  double accuracy = 0;
  const std::string final_line = After(trainer0, "final test accuracy: ");  // "0.8547 (2.4 s, ...)"
  ASSERT_TRUE(absl::SimpleAtod(final_line.substr(0, final_line.find(' ')), &accuracy)) << trainer0;
  EXPECT_GE(accuracy, kMinAccuracy) << trainer0;
}

}  // namespace
}  // namespace gw::examples
