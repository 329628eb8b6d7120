// What the parameter-server examples share: their command-line flags, the server role,
// the trainer's connection to the servers, and main()'s dispatch by rank. Included by
// exactly one source file of each example program (it defines flags; each program
// defines its own --epochs and --min_accuracy).
//
// Under `gradwire launch -n N`, the first --servers ranks serve the tables (checkpoints
// with --checkpoint_dir), the others run `train(options, servers)`. Elastic jobs (started
// with `gradwire launch --max-workers M`): a worker started later with
// `gradwire launch --join` joins the running job as a trainer (train() joins the tables
// at the next step boundary) or, with --join_as=server, as a parameter server onto which
// the tables are moved (re-sharded) while the trainers train; trainers that finish leave
// the job, so that those still training go on alone.
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
#include "flags.h"
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
ABSL_FLAG(std::string, join_as, "trainer",
          "a worker started with `gradwire launch --join`: joins the running job as a \"trainer\" or as a \"server\" "
          "that takes its share of every table");
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

// Is this worker part of an elastic job (workers may join it)?
inline bool Elastic(const rpc::Agent& agent) { return agent.options().max_world_size > agent.options().world_size; }

// A server that joined the running job: every table moves onto the servers that hold it
// and this one.
inline absl::Status TakeShare(rpc::Agent& agent, int servers, const std::vector<std::string>& tables) {
  std::vector<std::string> names;
  for (int r = 0; r < servers; ++r) names.push_back(agent.workers()[static_cast<size_t>(r)].name);
  param_server::Client admin(agent, names, /*trainer=*/-1, /*trainers=*/1);
  const absl::Time start = absl::Now();
  for (const std::string& table : tables) {
    absl::StatusOr<std::vector<std::string>> now = admin.ServersOf(table);
    if (!now.ok()) return now.status();
    std::vector<std::string> with_me = *now;
    with_me.push_back(agent.self().name);
    if (absl::Status s = admin.Reshard(table, with_me); !s.ok()) return s;
  }
  std::printf("%s: joined the job as a parameter server and took its share of %zu tables (re-sharded in %.3f s)\n",
              agent.self().name.c_str(), tables.size(), absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
  return absl::OkStatus();
}

// `tables`: for a server that joins (--join_as=server), the tables to take a share of.
inline int Serve(rpc::AgentOptions options, int servers = 0, const std::vector<std::string>& tables = {}) {
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
  std::fflush(stdout);  // seen even if the server is killed later (outside the launcher too)
  if (options.join) {
    if (absl::Status s = TakeShare(**agent, servers, tables); !s.ok()) return Fail("cannot take a share of the tables", s);
  }
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
  absl::StatusOr<FashionMnist> data =
      LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), /*show=*/options.rank == servers && !options.join);
  if (!data.ok()) return Fail("Fashion-MNIST", data.status());
  auto agent = rpc::Agent::Start(options, std::move(more));
  if (!agent.ok()) return Fail("cannot join the group", agent.status());
  ShowAddress(**agent);
  setup->train = std::move(data->train);
  setup->test = std::move(data->test);
  setup->agent = *agent;
  // The group's (a worker that joined learns its rank and the group's size at Start).
  setup->trainers = (*agent)->options().world_size - servers;
  setup->trainer = (*agent)->self().rank - servers;
  setup->ps = MakeClient(*setup->agent, servers);
  return 0;
}

// A trainer done with `tables` at `clock` (its next step): in an elastic job it leaves
// them (later steps do not wait for it); the others train on.
inline absl::Status LeaveTables(const TrainerSetup& setup, const std::vector<std::string>& tables, int64_t clock) {
  if (!Elastic(*setup.agent)) return absl::OkStatus();
  for (const std::string& table : tables) {
    if (absl::Status s = setup.ps->Leave(table, clock - 1); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A trainer's end: graceful shutdown, then exit status 1 if trainer 0 (`show`) saw a test
// accuracy below `required`.
inline int Finish(rpc::Agent& agent, bool show, double test_acc, double required) {
  // In an elastic job a trainer leaves (the others may train on for long); otherwise the
  // group shuts down together.
  if (absl::Status s = Elastic(agent) ? agent.Leave() : agent.Shutdown(); !s.ok()) return Fail("shutdown", s);
  ShowAfterShutdown(agent);
  if (show && test_acc < required) {
    std::fprintf(stderr, "test accuracy %.4f is below the required %.4f\n", test_acc, required);
    return 1;
  }
  return 0;
}

// Parses flags and runs the rank's role: Serve, or train(options, servers). `tables`: the
// tables a server that joins takes a share of (none: servers cannot join this example).
inline int Main(int argc, char** argv, const char* usage,
                const std::function<int(rpc::AgentOptions, int servers)>& train,
                const std::function<std::vector<std::string>()>& tables = {}) {
  ParseFlags(argc, argv, usage);
  absl::StatusOr<rpc::AgentOptions> options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return Fail("not started by a launcher", options.status());
  options->start_timeout = absl::Seconds(120);  // servers wait for trainers loading data
  const int servers = absl::GetFlag(FLAGS_servers);
  if (options->join) {  // the rank comes from the running group
    const std::string role = absl::GetFlag(FLAGS_join_as);
    if (role == "trainer") return train(*options, servers);
    if (role == "server" && tables) return Serve(*options, servers, tables());
    std::fprintf(stderr, "error: --join_as=%s: a worker that joins is a \"trainer\"%s\n", role.c_str(),
                 tables ? " or a \"server\"" : " (this example has no servers to add)");
    return 2;
  }
  if (servers < 1 || servers >= options->world_size) {
    std::fprintf(stderr, "error: --servers=%d needs 1 <= servers < WORLD_SIZE (%d): at least one trainer\n", servers,
                 options->world_size);
    return 2;
  }
  return options->rank < servers ? Serve(*options) : train(*options, servers);
}

}  // namespace gw::examples

#endif  // GRADWIRE_EXAMPLES_PS_JOB_H_
