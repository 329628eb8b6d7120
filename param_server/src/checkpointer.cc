#include "checkpointer.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace gw::param_server::internal {
namespace {

constexpr int kPlans = 5;  // a cut planned again at most this often when a server is past it

}  // namespace

absl::StatusOr<Checkpointer::Registered> Checkpointer::Register(const std::vector<std::string>& servers) {
  const rpc::CallOptions call{timeout_};
  absl::Status late;
  for (int attempt = 0; attempt < kPlans; ++attempt) {
    std::vector<Future<CutPlan>> asked;
    for (const std::string& server : servers) asked.push_back(agent_.Send(server, CutPlanMessage{}, call));
    absl::StatusOr<std::vector<CutPlan>> plans = WhenAll(agent_.executor(), std::move(asked)).Get();
    if (!plans.ok()) return plans.status();
    Registered cut;
    {
      absl::MutexLock lock(&mu_);
      cut.version = last_version_ + 1;
    }
    std::string jobs_seen;
    for (size_t i = 0; i < plans->size(); ++i) {
      const CutPlan& p = (*plans)[i];
      cut.version = std::max(cut.version, p.latest_version + 1);
      for (size_t t = 0; t < p.tables.size() && t < p.proposals.size() && t < p.consistency.size(); ++t) {
        if (p.consistency[t] == static_cast<int64_t>(Consistency::kSync)) cut.step = std::max(cut.step, p.proposals[t]);
      }
      if (p.job.empty()) continue;
      if (!cut.job.empty() && cut.job != p.job) {
        return absl::FailedPreconditionError(absl::StrCat("the servers restored checkpoints of different jobs ('",
                                                          cut.job, "' on ", jobs_seen, ", '", p.job, "' on ",
                                                          servers[i], "): restart them from one job's checkpoint"));
      }
      cut.job = p.job;
      jobs_seen = servers[i];
    }
    // Planned again, a cut aims further ahead each time: trainers running at full speed
    // pass the furthest step between the plan and the cut (a cut from a client that does
    // not push itself); the first plan is the step where every shard may already be (an
    // idle job is cut at once).
    cut.step += attempt;
    if (cut.job.empty()) {
      cut.job = absl::StrCat(agent_.options().run_id, "@", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                                                               absl::UTCTimeZone()));
    }
    std::vector<Future<rpc::Ack>> registered;
    for (const std::string& server : servers) {
      registered.push_back(agent_.Send(server, CutMessage{cut.version, cut.job, cut.step}, call));
    }
    absl::Status s = WhenAll(agent_.executor(), std::move(registered)).Get().status();
    {
      absl::MutexLock lock(&mu_);
      last_version_ = std::max(last_version_, cut.version);
    }
    if (s.ok()) return cut;
    Abandon(servers, cut.version);
    if (!absl::IsAborted(s)) return s;
    late = s;  // a shard passed the step meanwhile: plan again
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no checkpoint could be cut: the servers passed the planned step ", kPlans, " times (last: ",
                   late.message(), ")"));
}

void Checkpointer::Abandon(const std::vector<std::string>& servers, int64_t version) {
  for (const std::string& server : servers) {
    agent_.Send(server, CutAbandonMessage{version}, rpc::CallOptions{timeout_});  // best effort
  }
}

Future<CheckpointInfo> Checkpointer::Cut(const std::vector<std::string>& servers, std::vector<ManifestTable> tables) {
  Promise<CheckpointInfo> done(agent_.executor());
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    last_ = done.future();
  }
  absl::StatusOr<Registered> cut = Register(servers);
  if (!cut.ok()) {
    Finished(cut.status());
    done.Set(cut.status());
    return done.future();
  }
  std::vector<Future<CutFile>> written;
  for (const std::string& server : servers) {
    written.push_back(agent_.Send(server, CutWrittenMessage{cut->version}, rpc::CallOptions{timeout_}));
  }
  WhenAll(agent_.executor(), std::move(written))
      .Subscribe([self = shared_from_this(), servers, cut = *cut, tables = std::move(tables),
                  done](const absl::StatusOr<std::vector<CutFile>>& files) mutable {
        if (!files.ok()) {
          self->Failed(servers, cut.version, cut.step, files.status(), done);
          return;
        }
        self->Commit(servers, cut, std::move(tables), *files, done);
      });
  return done.future();
}

void Checkpointer::Commit(const std::vector<std::string>& servers, const Registered& cut,
                          std::vector<ManifestTable> tables, const std::vector<CutFile>& files,
                          Promise<CheckpointInfo> done) {
  Manifest m;
  m.job = cut.job;
  m.version = cut.version;
  m.step = cut.step;
  m.written_at = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  m.tables = std::move(tables);
  m.shared_directory = !files.empty() && std::all_of(files.begin(), files.end(), [&](const CutFile& f) {
    return !f.directory.empty() && f.directory == files[0].directory;
  });
  CheckpointInfo info{cut.version, cut.step, cut.job, {}};
  for (size_t i = 0; i < servers.size(); ++i) {
    const CutFile& f = files[i];
    ManifestFile file{servers[i], f.name, static_cast<uint64_t>(f.bytes), static_cast<uint32_t>(f.crc32c), {}};
    for (const CutShard& s : f.shards) {
      file.shards.push_back({s.table, s.sparse, static_cast<int>(s.consistency), s.epoch, s.size, s.clock, s.updates});
    }
    m.files.push_back(std::move(file));
    info.files.push_back(f.name);
  }
  const std::string manifest = Encode(m);  // never throws (names that are not UTF-8 are replaced)
  std::vector<Future<rpc::Ack>> committed;
  for (const std::string& server : servers) {
    committed.push_back(agent_.Send(server, CutCommitMessage{cut.version, manifest}, rpc::CallOptions{timeout_}));
  }
  WhenAll(agent_.executor(), std::move(committed))
      .Subscribe([self = shared_from_this(), servers, info, done](const absl::StatusOr<std::vector<rpc::Ack>>& r) {
        if (!r.ok()) {
          self->Failed(servers, info.version, info.step, r.status(), done);
          return;
        }
        self->Finished(absl::OkStatus());
        done.Set(info);
      });
}

void Checkpointer::Failed(const std::vector<std::string>& servers, int64_t version, int64_t step,
                          const absl::Status& why, Promise<CheckpointInfo> done) {
  const absl::Status s(why.code(), absl::StrCat("checkpoint version ", version, " (step ", step, "): ", why.message()));
  Abandon(servers, version);
  Finished(s);
  done.Set(s);
}

void Checkpointer::Finished(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  if (status.ok()) {
    failures_in_a_row_ = 0;
    last_failure_ = absl::OkStatus();
    return;
  }
  ++failures_in_a_row_;
  last_failure_ = status;
  // The first failure in a row, then at most a line a minute.
  if (failures_in_a_row_ == 1 || absl::Now() - last_logged_ >= absl::Minutes(1)) {
    last_logged_ = absl::Now();
    std::fprintf(stderr, "gradwire: %s: checkpoint failed (%d in a row): %s\n", agent_.self().name.c_str(),
                 failures_in_a_row_, status.ToString().c_str());
  }
}

absl::Status Checkpointer::Health() const {
  absl::MutexLock lock(&mu_);
  if (max_failures_ <= 0 || failures_in_a_row_ < max_failures_) return absl::OkStatus();
  return absl::Status(last_failure_.code(),
                      absl::StrCat(failures_in_a_row_, " checkpoints in a row failed (the job stops after ",
                                   max_failures_, ": ClientOptions::checkpoint_max_failures, --checkpoint_max_failures"
                                   " in the examples; 0 never stops); the last: ",
                                   last_failure_.message()));
}

Future<CheckpointInfo> Checkpointer::Last() const {
  absl::MutexLock lock(&mu_);
  if (last_) return *last_;
  return MakeReadyFuture<CheckpointInfo>(agent_.executor(), absl::NotFoundError("no checkpoint was cut"));
}

bool Checkpointer::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_ > 0;
}

}  // namespace gw::param_server::internal
