// What the parameter-server examples share: their command-line flags, the server role,
// the trainer's connection to the servers, and main()'s dispatch by rank. Included by
// exactly one source file of each example program (it defines flags; each program
// defines its own --epochs and --min_accuracy).
//
// Under `gradwire launch -n N`, the first --servers ranks serve the tables (checkpoints
// with --checkpoint_dir), the others run `train(options, servers)`.
#ifndef GRADWIRE_EXAMPLES_PS_JOB_H_
#define GRADWIRE_EXAMPLES_PS_JOB_H_

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "example_util.h"
#include "gradwire/gradwire.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/server.h"
#include "gradwire/param_server/sparse_embedding.h"

ABSL_FLAG(int, servers, 2, "how many of the ranks are parameter servers (the first ones)");
ABSL_FLAG(int, batch_size, 64, "examples per step and trainer");
ABSL_FLAG(uint64_t, seed, 0, "seed for initialisation and shuffling");
ABSL_FLAG(std::string, data_dir, gw::data::kFashionMnistDir, "directory with the IDX files");
ABSL_FLAG(std::string, checkpoint_dir, "", "servers: write checkpoints here and start from the latest one");
ABSL_FLAG(double, checkpoint_every_s, 0, "servers: seconds between periodic checkpoints (0: none)");
ABSL_FLAG(double, reconnect_timeout_s, 60,
          "trainers: how long to wait for a server that died to come back (restarted from its checkpoint)");
ABSL_FLAG(bool, show_network, false,
          "every process prints the address it announced to the others and, at the end, how many of its "
          "connections and tensors went through shared memory (only between processes on one host)");

namespace gw::examples {

// --show_network: once joined, the address this process announced.
inline void ShowAddress(const rpc::Agent& agent) {
  if (!absl::GetFlag(FLAGS_show_network)) return;
  std::printf("%s: announced %s\n", agent.self().name.c_str(), agent.self().address.c_str());
}

// After shutdown: with --show_network, what went through shared memory; under
// GRADWIRE_FAULTS, what the fault injector did to this process's connections.
inline void ShowAfterShutdown(const rpc::Agent& agent) {
  if (const auto& faults = agent.options().transport_options.faults) {
    std::printf("%s: faults (%s): %s\n", agent.self().name.c_str(), faults->spec().ToString().c_str(),
                faults->stats().ToString().c_str());
  }
  if (!absl::GetFlag(FLAGS_show_network)) return;
  const rpc::TransportStats stats = agent.transport_stats();
  std::printf("%s: shared memory: connections=%lld tensors=%lld\n", agent.self().name.c_str(),
              static_cast<long long>(stats.shared_memory_connections),
              static_cast<long long>(stats.shared_memory_tensors));
}

inline int Serve(rpc::AgentOptions options) {
  // A server serves until the trainers are done, however long training takes (if a
  // trainer dies, the launcher stops everyone).
  options.shutdown_timeout = absl::Hours(24 * 7);
  param_server::ServerOptions server_options;
  server_options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  server_options.checkpoint_every = absl::Seconds(absl::GetFlag(FLAGS_checkpoint_every_s));
  std::shared_ptr<param_server::ParameterServer> server;
  absl::Status installed;
  size_t restored = 0;  // tables loaded from the checkpoint, before any trainer could create one
  auto agent = rpc::Agent::Start(options, [&](rpc::Agent& a) {
    auto s = param_server::ParameterServer::Install(a, server_options);
    if (s.ok()) {
      server = *s;
      restored = server->num_shards();
    }
    installed = s.status();
  });
  if (!agent.ok()) return Fail("cannot join the group", agent.status());
  if (!installed.ok()) return Fail("cannot start the parameter server", installed);
  ShowAddress(**agent);
  std::printf("%s: serving parameters%s\n", (*agent)->self().name.c_str(),
              restored > 0 ? absl::StrCat(" (", restored, " tables restored from its checkpoint)").c_str() : "");
  // Serves until every worker has reached shutdown (the trainers, when they are done).
  absl::Status s = (*agent)->Shutdown();
  ShowAfterShutdown(**agent);
  return s.ok() ? 0 : Fail("shutdown", s);
}

// A trainer's start: the data, the agent, and its client of the servers.
struct TrainerSetup {
  data::Dataset train, test;
  std::shared_ptr<rpc::Agent> agent;
  std::unique_ptr<param_server::Client> ps;
  int trainer = 0, trainers = 1;
};

// This trainer's client of the first `servers` ranks.
inline std::unique_ptr<param_server::Client> MakeClient(rpc::Agent& agent, int servers) {
  std::vector<std::string> names;
  for (int r = 0; r < servers; ++r) names.push_back(agent.workers()[static_cast<size_t>(r)].name);
  const int trainers = static_cast<int>(agent.workers().size()) - servers;
  return std::make_unique<param_server::Client>(
      agent, names, agent.self().rank - servers, trainers,
      param_server::ClientOptions{.reconnect_timeout = absl::Seconds(absl::GetFlag(FLAGS_reconnect_timeout_s))});
}

// Loads Fashion-MNIST (--data_dir), joins the group and connects to the servers; on
// failure returns the exit status (after saying why), else 0.
// `more` runs in the agent's setup (to install more layers: collectives, distributed
// autograd).
inline int StartTrainer(const rpc::AgentOptions& options, int servers, TrainerSetup* setup, rpc::Setup more = {}) {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  auto train = data::LoadFashionMnist(data::Split::kTrain, dir);
  auto test = data::LoadFashionMnist(data::Split::kTest, dir);
  if (!train.ok()) return Fail("training data", train.status());
  if (!test.ok()) return Fail("test data", test.status());
  auto agent = rpc::Agent::Start(options, std::move(more));
  if (!agent.ok()) return Fail("cannot join the group", agent.status());
  ShowAddress(**agent);
  setup->train = *std::move(train);
  setup->test = *std::move(test);
  setup->agent = *agent;
  setup->trainers = options.world_size - servers;
  setup->trainer = options.rank - servers;
  setup->ps = MakeClient(*setup->agent, servers);
  return 0;
}

// A trainer's end: graceful shutdown, then exit status 1 if trainer 0 (`show`) saw a test
// accuracy below `required`.
inline int Finish(rpc::Agent& agent, bool show, double test_acc, double required) {
  if (absl::Status s = agent.Shutdown(); !s.ok()) return Fail("shutdown", s);
  ShowAfterShutdown(agent);
  if (show && test_acc < required) {
    std::fprintf(stderr, "test accuracy %.4f is below the required %.4f\n", test_acc, required);
    return 1;
  }
  return 0;
}

// Parses flags and runs the rank's role: Serve, or train(options, servers).
inline int Main(int argc, char** argv, const char* usage,
                const std::function<int(rpc::AgentOptions, int servers)>& train) {
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<rpc::AgentOptions> options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return Fail("not started by a launcher", options.status());
  options->start_timeout = absl::Seconds(120);  // servers wait for trainers loading data
  const int servers = absl::GetFlag(FLAGS_servers);
  if (servers < 1 || servers >= options->world_size) {
    std::fprintf(stderr, "error: --servers=%d needs 1 <= servers < WORLD_SIZE (%d): at least one trainer\n", servers,
                 options->world_size);
    return 2;
  }
  return options->rank < servers ? Serve(*options) : train(*options, servers);
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_PS_JOB_H_
