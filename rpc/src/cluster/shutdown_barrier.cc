#include "cluster/shutdown_barrier.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gw::rpc::internal {

absl::Status ShutdownBarrier::AwaitAll(const char* what, absl::Time deadline) {
  // The ranks handed out may grow while this waits (a worker joins the running group):
  // once the keys of those known are there, the count is read again.
  // A joined worker that is gone is dropped from the wait: with joined workers the wait
  // goes in slices of a second, to look again.
  for (int waited = 0;;) {
    std::vector<std::string> keys;
    for (int r = waited; r < ranks_; ++r) {
      if (r >= world_size_ && gone_ && gone_(r)) continue;
      keys.push_back(rendezvous_.Key(what, r));
    }
    const absl::Duration left = std::max(absl::ZeroDuration(), deadline - absl::Now());
    const bool sliced = ranks_ > world_size_ && gone_;
    absl::Status s = rendezvous_.store().Wait(keys, sliced ? std::min(left, absl::Seconds(1)) : left);
    if (!s.ok() && sliced && s.code() == absl::StatusCode::kDeadlineExceeded && absl::Now() < deadline) continue;
    if (!s.ok()) {
      std::vector<std::string> missing;
      for (int r = 0; r < ranks_; ++r) {
        if (!rendezvous_.store().Get(rendezvous_.Key(what, r), absl::Milliseconds(1)).ok())
          missing.push_back(absl::StrCat(r));
      }
      return absl::Status(s.code(), absl::StrCat("rank(s) ", missing.empty() ? "?" : absl::StrJoin(missing, ", "),
                                                 " did not reach '", what, "' (", s.message(), ")"));
    }
    waited = ranks_;
    absl::StatusOr<int> now = rendezvous_.Ranks(world_size_, capacity_);
    if (!now.ok() || *now <= ranks_) return absl::OkStatus();
    ranks_ = *now;
  }
}

absl::Status ShutdownBarrier::Arrive(const char* what, absl::Time deadline) {
  if (absl::Status s = rendezvous_.store().Set(rendezvous_.Key(what, rank_), "1"); !s.ok()) return s;
  return AwaitAll(what, deadline);
}

absl::Status ShutdownBarrier::Depart() {
  if (absl::Status s = rendezvous_.MarkLeft(rank_); !s.ok()) return s;
  for (const char* step : kSteps) {
    if (absl::Status s = rendezvous_.store().Set(rendezvous_.Key(step, rank_), "1"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShutdownBarrier::Run(absl::Time deadline, const Steps& steps) {
  gone_ = steps.gone;
  absl::StatusOr<int> ranks = rendezvous_.Ranks(world_size_, capacity_);
  ranks_ = ranks.ok() ? *ranks : world_size_;
  steps.drain(deadline);
  absl::Status s = Arrive("shutdown/", deadline);
  absl::Status leaks;
  if (s.ok()) {
    steps.drain(deadline);
    s = Arrive("rrefs_drained/", deadline);
    if (s.ok()) leaks = steps.check_leaks();
  }
  if (s.ok()) s = rendezvous_.store().Set(rendezvous_.Key("exited/", rank_), "1");
  steps.await_handlers(deadline);
  if (s.ok() && rendezvous_.hosts_store()) s = AwaitAll("exited/", deadline);
  if (s.ok() && rendezvous_.keys_outlive_job() && AwaitAll("exited/", absl::Now()).ok()) {
    if (absl::Status forgot = rendezvous_.ForgetRun(); !forgot.ok()) {
      std::fprintf(stderr,
                   "gradwire: %s: could not remove this run's keys from %s: %s; remove them before the job's "
                   "name is used again (etcdctl del --prefix /gradwire/JOB/)\n",
                   name_.c_str(), rendezvous_.store_address().c_str(), std::string(forgot.message()).c_str());
    }
  }
  if (!s.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(name_, ": graceful shutdown did not complete: ", s.message()));
  }
  return leaks;
}

}  // namespace gw::rpc::internal
