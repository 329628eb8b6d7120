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
ABSL_FLAG(std::string, checkpoint_dir, "",
          "checkpoints: the servers write numbered versions here (each one step of every table, with a checksummed "
          "manifest) and a job started on them resumes the newest intact one at its step (see --fresh)");
ABSL_FLAG(double, checkpoint_every_s, 0,
          "checkpoints: trainer 0 cuts one every S seconds at the step it is about to push (0: only the final one, "
          "after the last step)");
ABSL_FLAG(int, checkpoint_keep, 3, "checkpoints: complete versions the servers keep");
ABSL_FLAG(int, checkpoint_max_failures, 3,
          "checkpoints: the job stops with an error after this many failed checkpoints in a row (0: never)");
ABSL_FLAG(bool, fresh, false,
          "checkpoints: start from the initial parameters although --checkpoint_dir holds versions (they are kept; "
          "new versions are numbered after them)");
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
  server_options.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  server_options.fresh = absl::GetFlag(FLAGS_fresh);
  std::shared_ptr<param_server::ParameterServer> server;
  absl::Status installed;
  auto agent = rpc::Agent::Start(options, [&](rpc::Agent& a) {
    auto s = param_server::ParameterServer::Install(a, server_options);
    if (s.ok()) server = *s;
    installed = s.status();
  });
  if (!agent.ok()) return Fail("cannot join the group", agent.status());
  if (!installed.ok()) return Fail("cannot start the parameter server", installed);
  ShowAddress(**agent);
  const param_server::RestoredCheckpoint& restored = server->restored();
  std::printf("%s: serving parameters%s\n", (*agent)->self().name.c_str(),
              restored.version > 0 ? absl::StrCat(" (restored checkpoint version ", restored.version, " at step ",
                                                  restored.step, ": ", restored.tables, " tables from ", restored.path,
                                                  ")").c_str()
                                   : "");
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
  // Trainer 0 cuts the checkpoints (one client per job does).
  const bool cuts = agent.self().rank == servers && !agent.options().join && !absl::GetFlag(FLAGS_checkpoint_dir).empty();
  return std::make_unique<param_server::Client>(
      agent, names, agent.self().rank - servers, trainers,
      param_server::ClientOptions{
          .reconnect_timeout = absl::Seconds(absl::GetFlag(FLAGS_reconnect_timeout_s)),
          .checkpoint_every = cuts ? absl::Seconds(absl::GetFlag(FLAGS_checkpoint_every_s)) : absl::ZeroDuration(),
          .checkpoint_max_failures = absl::GetFlag(FLAGS_checkpoint_max_failures)});
}

// Where a trainer starts: step 0, or the step of the checkpoint the servers restored, with
// `loader` moved to that step's batch (the order an uninterrupted run would have seen).
struct Resumed {
  int64_t step = 0;
  int first_epoch = 1;  // the epoch the loop starts at: Reset it, then SkipBatches(skip)
  int64_t skip = 0;
};

// Call after creating the tables, before the first pull. Refuses (FAILED_PRECONDITION
// naming the flags) a checkpoint that already holds every step of `epochs`.
inline absl::StatusOr<Resumed> Resume(const TrainerSetup& setup, data::DataLoader& loader, int epochs) {
  if (setup.agent->options().join) return Resumed{};  // it joins the running steps (Client::Join)
  absl::StatusOr<param_server::ResumePoint> point = setup.ps->Resume();
  if (!point.ok()) return point.status();
  Resumed r;
  if (point->version == 0) return r;
  const int64_t per_epoch = loader.batches_per_epoch();
  if (point->step >= per_epoch * epochs) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the servers restored checkpoint version ", point->version, " at step ", point->step, " from --checkpoint_dir=",
        absl::GetFlag(FLAGS_checkpoint_dir), ", which already holds every step of --epochs=", epochs, " (",
        per_epoch * epochs, " steps): raise --epochs to train on from it, or start over with --fresh"));
  }
  r.step = point->step;
  r.first_epoch = static_cast<int>(point->step / per_epoch) + 1;
  r.skip = point->step % per_epoch;
  for (int e = 1; e < r.first_epoch; ++e) loader.Reset();  // each epoch's shuffle, as it was drawn
  if (setup.trainer == 0) {
    std::printf("resuming checkpoint version %lld (job %s) at step %lld: epoch %d, batch %lld\n",
                static_cast<long long>(point->version), point->job.c_str(), static_cast<long long>(point->step),
                r.first_epoch, static_cast<long long>(r.skip + 1));
    std::fflush(stdout);
  }
  return r;
}

// Skips `n` batches of the epoch `loader` was just Reset for.
inline void SkipBatches(data::DataLoader& loader, int64_t n) {
  data::Batch unused;
  for (int64_t i = 0; i < n && loader.Next(&unused); ++i) {
  }
}

// Trainer 0's last word with --checkpoint_dir: the final checkpoint, after the last step.
inline absl::Status FinalCheckpoint(const TrainerSetup& setup) {
  if (setup.trainer != 0 || setup.agent->options().join || absl::GetFlag(FLAGS_checkpoint_dir).empty()) {
    return absl::OkStatus();
  }
  absl::StatusOr<param_server::CheckpointInfo> info = setup.ps->Checkpoint().Get();
  if (!info.ok()) return info.status();
  std::printf("final checkpoint: version %lld at step %lld in %s\n", static_cast<long long>(info->version),
              static_cast<long long>(info->step), absl::GetFlag(FLAGS_checkpoint_dir).c_str());
  std::fflush(stdout);
  return absl::OkStatus();
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
// `check` (optional) vets the program's own flags on every rank before anything starts: an
// error is said and the exit status is 2 (e.g. an unknown --model, on servers and
// trainers alike).
inline int Main(int argc, char** argv, const char* usage,
                const std::function<int(rpc::AgentOptions, int servers)>& train,
                const std::function<std::vector<std::string>()>& tables = {},
                const std::function<absl::Status()>& check = {}) {
  ParseFlags(argc, argv, usage);
  if (check) {
    if (absl::Status s = check(); !s.ok()) return Fail("invalid flags", s);
  }
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
