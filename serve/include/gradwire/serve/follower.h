// Follower: a served model kept current with a running parameter-server job, so that one
// job trains and serves at once; and ServeCheckpoint, a parameter-server checkpoint
// swapped in as a version.
//
// Contract
//   - Follower::Start(serving, model, options): `model` is served here (Serving::Serve)
//     with a ModelConfig::factory. Its parameters are the dense tables options.tables maps
//     them to (a parameter not in the map: the table of its own name, as the trainers of
//     examples/ps_fashion_mnist create them) on options.servers (in shard order). A thread
//     refreshes the served version on a schedule, starting with one refresh at once:
//       every > 0        every `every`, when the tables moved past the served step;
//       every_steps > 0  the tables' step is polled every `poll` (one small message per
//                        server) and a refresh runs once it is every_steps past the
//                        served step (or the served step is from an earlier job).
//     With both zero only Refresh() refreshes. INVALID_ARGUMENT for a bad schedule or no
//     servers; the Serving's NOT_FOUND for a model it does not serve.
//   - A refresh reads every table (param_server::Reader: each shard copied under its lock,
//     never holding up a step), loads the values into a fresh module and swaps it in as
//     version "step-<n>" (Serving::LoadParameters: each request is answered by one
//     version whole). With options.one_step (the default, for synchronous jobs) it reads
//     until every shard of every table is at the same step, at most options.attempts
//     times, and fails with ABORTED if the tables kept moving (the schedule tries again);
//     without it (asynchronous jobs, whose shards are never at one step) it serves what
//     it read, named by the oldest shard's step.
//   - Status(): served version and step, the latest step seen, steps_behind (latest -
//     served: the staleness in updates), age (since the served values were read: the
//     staleness in time), refreshes, failures and the last error. A failed refresh (a
//     server down, a table missing or of another shape) keeps the served version, is
//     counted and reported, and the schedule goes on.
//   - The status is also in the agent's statistics (rpc/statistics.h), labelled by model:
//     gradwire_serve_follow_served_step, _steps_behind, _age_seconds, _refreshes_total,
//     _failures_total.
//   - AwaitStatus(until, deadline) waits (on the follower's own changes, not by polling)
//     until `until(Status())` holds or the deadline passes; returns whether it holds (it
//     is re-checked when the status changes, so a condition on `age` alone waits it out).
//   - Refresh() refreshes now on the calling thread (unless the tables have not moved
//     since the served step: then it only updates the status). Returns the error of a
//     failed refresh.
//   - Stop() (and the destructor) ends the thread; the model stays at its last version.
//     The Serving and its agent must outlive the Follower. Thread-safe.
//   - ServeCheckpoint(serving, model, checkpoint, version, tables) loads a
//     parameter-server checkpoint (a version's directory, or a checkpoint directory: its
//     newest complete version) through its manifest (param_server::Reader::LoadCheckpoint:
//     files in shard order, sizes and checksums checked, values finite) into a fresh
//     module and swaps it in (strict: every parameter, same shapes; else the served
//     version stays and the error says why).
#ifndef GRADWIRE_SERVE_FOLLOWER_H_
#define GRADWIRE_SERVE_FOLLOWER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/param_server/reader.h"
#include "gradwire/serve/serving.h"

namespace gw::serve {

struct FollowOptions {
  std::vector<std::string> servers = {};            // the parameter servers, in shard order
  std::map<std::string, std::string> tables = {};   // parameter name -> table name
  absl::Duration every = absl::ZeroDuration();      // refresh period
  int64_t every_steps = 0;                          // or: refresh every this many updates
  absl::Duration poll = absl::Milliseconds(100);    // how often every_steps looks at the step
  bool one_step = true;                             // serve only values of one step
  int attempts = 5;                                 // reads per refresh until one step
  absl::Duration timeout = absl::Seconds(10);       // per read
};

struct FollowStatus {
  std::string version = {};      // served by this follower ("" before its first refresh)
  int64_t served_step = -1;      // updates applied to the served values (-1: none yet)
  int64_t latest_step = -1;      // the tables' step when last looked at
  int64_t steps_behind = 0;      // latest_step - served_step
  absl::Duration age = absl::ZeroDuration();  // since the served values were read
  int64_t refreshes = 0;         // versions swapped in
  int64_t failures = 0;          // refreshes that failed
  absl::Status last_error = absl::OkStatus();
  std::string ToString() const;  // one line, for logs and progress
};

class Follower {
 public:
  static absl::StatusOr<std::unique_ptr<Follower>> Start(std::shared_ptr<Serving> serving, std::string model,
                                                         FollowOptions options);
  ~Follower();
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;

  absl::Status Refresh();
  FollowStatus Status() const;
  bool AwaitStatus(const std::function<bool(const FollowStatus&)>& until, absl::Time deadline) const;
  void Stop();

 private:
  // The served parameters' names, their tables and shapes (same order).
  struct Tables {
    std::vector<std::string> parameters, tables;
    std::vector<Shape> shapes;
  };
  friend absl::Status ServeCheckpoint(Serving&, const std::string&, const std::string&, std::string,
                                      const std::map<std::string, std::string>&);
  static absl::StatusOr<Tables> Find(const Serving& serving, const std::string& model,
                                     const std::map<std::string, std::string>& tables);
  Follower(std::shared_ptr<Serving> serving, std::string model, FollowOptions options, Tables tables);
  void Run();
  // The tables' step (oldest shard), recorded in the status.
  absl::StatusOr<int64_t> LatestStep();
  absl::Status Failed(absl::Status s);
  FollowStatus StatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Serving> serving_;
  const std::string model_;
  const FollowOptions options_;
  const Tables tables_;
  const param_server::Reader reader_;
  absl::Mutex refresh_mu_;  // one refresh at a time
  mutable absl::Mutex mu_;
  FollowStatus status_ ABSL_GUARDED_BY(mu_);
  absl::Time served_read_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  rpc::Statistics::Source statistics_;  // last: dropped first
};

absl::Status ServeCheckpoint(Serving& serving, const std::string& model, const std::string& checkpoint,
                             std::string version, const std::map<std::string, std::string>& tables = {});

}  // namespace gw::serve

#endif  // GRADWIRE_SERVE_FOLLOWER_H_
