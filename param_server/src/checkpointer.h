// Internal: the coordinating side of checkpoints (client.h: Client::Checkpoint and
// ClientOptions::checkpoint_every; server.h, "Checkpoints", has the servers' side).
//
// Contract
//   - Cut(servers, tables) cuts one version of every table of `servers`:
//       1. plan: every server says where each of its shards could be cut (CutPlanMessage);
//          the cut's step is the furthest synchronous step among them, its version
//          one past the newest in any server's directory (and past this Checkpointer's
//          last), its job the one the servers restored (they must agree) or a new one;
//       2. register (CutMessage) on every server; a server already past the step refuses
//          (ABORTED): the cut is abandoned everywhere and planned again, the k-th time k
//          steps past the furthest (at most 5 times);
//     Cut returns once every server registered it, so a trainer that calls it before
//     pushing its next step cannot make any shard pass the cut. In the background:
//       3. every server copies its shards when they reach the step, writes its file and
//          answers CutWrittenMessage with its size, CRC32C and shards (within `timeout`);
//       4. the manifest (manifest.h: the files, and `tables`' layouts) goes to every server
//          (CutCommitMessage), which writes it: the version is complete.
//     The future completes with the version once every server committed it, or with the
//     first error, after which the version is abandoned on every server (CutAbandon).
//   - Failures: each failed cut is counted and written to stderr (the first, then at
//     most one line a minute); after `max_failures` failures in a row (0: never) Health()
//     returns the last one, naming the count, until a cut succeeds. A successful cut
//     resets the count.
//   - One Checkpointer per job should cut (a second one's cuts supersede the first's on
//     the servers). Thread-safe; the agent must outlive it and its futures.
#ifndef GRADWIRE_PARAM_SERVER_SRC_CHECKPOINTER_H_
#define GRADWIRE_PARAM_SERVER_SRC_CHECKPOINTER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/param_server/checkpoint.h"
#include "gradwire/rpc/agent.h"
#include "manifest.h"
#include "messages.h"

namespace gw::param_server::internal {

class Checkpointer : public std::enable_shared_from_this<Checkpointer> {
 public:
  Checkpointer(rpc::Agent& agent, int max_failures, absl::Duration timeout)
      : agent_(agent), max_failures_(max_failures), timeout_(timeout) {}

  Future<CheckpointInfo> Cut(const std::vector<std::string>& servers, std::vector<ManifestTable> tables);

  absl::Status Health() const;
  bool in_flight() const;
  // The most recent cut's future (NOT_FOUND when none was started).
  Future<CheckpointInfo> Last() const;

 private:
  struct Registered {
    int64_t version = 0;
    int64_t step = 0;
    std::string job;
  };
  absl::StatusOr<Registered> Register(const std::vector<std::string>& servers);
  void Abandon(const std::vector<std::string>& servers, int64_t version);
  void Commit(const std::vector<std::string>& servers, const Registered& cut, std::vector<ManifestTable> tables,
              const std::vector<CutFile>& files, Promise<CheckpointInfo> done);
  // A cut that failed after its registration: abandoned everywhere, counted, `done` set.
  void Failed(const std::vector<std::string>& servers, int64_t version, int64_t step, const absl::Status& why,
              Promise<CheckpointInfo> done);
  void Finished(const absl::Status& status);

  rpc::Agent& agent_;
  const int max_failures_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  int64_t last_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Future<CheckpointInfo>> last_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int failures_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_failure_ ABSL_GUARDED_BY(mu_);
  absl::Time last_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace gw::param_server::internal

#endif  // GRADWIRE_PARAM_SERVER_SRC_CHECKPOINTER_H_
