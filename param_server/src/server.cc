// ParameterServer::Impl: the handlers of the parameter server's messages (messages.h),
// over the tables this server holds. The units it builds on: shard.h (a table's shard,
// its data and lock), consistency_clock.h (the sync / async / bounded-staleness
// protocol), striped_rows.h (sparse rows), checkpoint.cc (a shard's file form),
// versions.h and manifest.h (the checkpoint directory).
#include "gradwire/param_server/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "freeze.h"
#include "gradwire/nn/file_io.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/optim/functional.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/rpc/waits.h"
#include "gradwire/tensor/kernels.h"
#include "manifest.h"
#include "messages.h"
#include "shard.h"
#include "trainer_registry.h"
#include "versions.h"

namespace gw::param_server {
namespace {

using internal::ConsistencyClock;
using internal::Shard;
using internal::ShardConfig;
using internal::Waiter;
using rpc::Ack;
using rpc::CallInfo;

constexpr size_t kLargeAnswerBytes = 256 << 10;  // see Admit

std::string Mode(Consistency c, int64_t trainers, int64_t staleness) {
  static constexpr const char* kNames[] = {"synchronous", "asynchronous", "bounded-staleness"};
  const int i = static_cast<int>(c);
  return absl::StrCat(i >= 0 && i <= 2 ? kNames[i] : "unknown", " with ", trainers, " trainer(s)",
                      c == Consistency::kBoundedStaleness ? absl::StrCat(" and staleness ", staleness) : "");
}

}  // namespace

class ParameterServer::Impl : public std::enable_shared_from_this<ParameterServer::Impl> {
 public:
  Impl(rpc::Agent& agent, ServerOptions options)
      : agent_(agent), name_(agent.self().name), options_(std::move(options)) {}
  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    {
      absl::MutexLock lock(&cut_mu_);
      writer_stopping_ = true;
    }
    if (writer_.joinable()) writer_.join();
  }

  // Loads the latest checkpoint, if any, then serves the messages (the handlers keep the
  // server alive as long as the agent has them).
  absl::Status Start() {
    if (absl::Status s = LoadCheckpoint(); !s.ok()) return s;
    auto self = shared_from_this();
    for (absl::Status s : {
             agent_.Handle<internal::CreateDenseMessage>(
                 [self](const CallInfo&, const internal::CreateDenseMessage& m) { return self->CreateDense(m); }),
             agent_.Handle<internal::CreateSparseMessage>(
                 [self](const CallInfo&, const internal::CreateSparseMessage& m) { return self->CreateSparse(m); }),
             agent_.Handle<internal::PullMessage>(
                 [self](const CallInfo&, const internal::PullMessage& m) { return self->Pull(m.table, m.clock, m.epoch); }),
             agent_.Handle<internal::PushMessage>([self](const CallInfo& info, const internal::PushMessage& m) {
               self->trainers_.Pushed(m.trainer, info.caller_rank, info.caller);
               return self->Push(m.table, m.clock, m.trainer, m.grad, m.epoch);
             }),
             agent_.Handle<internal::PullRowsMessage>(
                 [self](const CallInfo&, const internal::PullRowsMessage& m) { return self->PullRows(m); }),
             agent_.Handle<internal::PushRowsMessage>(
                 [self](const CallInfo& info, const internal::PushRowsMessage& m) {
                   self->trainers_.Pushed(m.trainer, info.caller_rank, info.caller);
                   return self->PushRows(m);
                 }),
             agent_.Handle<internal::PushPullManyMessage>(
                 [self](const CallInfo& info, const internal::PushPullManyMessage& m) {
                   self->trainers_.Pushed(m.trainer, info.caller_rank, info.caller);
                   return self->PushPullMany(m);
                 }),
             agent_.Handle<internal::JoinTableMessage>([self](const CallInfo& info, const internal::JoinTableMessage& m) {
               if (m.from >= 0) self->trainers_.Pushed(m.trainer, info.caller_rank, info.caller);
               return self->JoinTable(m);
             }),
             agent_.Handle<internal::LeaveTableMessage>(
                 [self](const CallInfo&, const internal::LeaveTableMessage& m) { return self->LeaveTable(m); }),
             agent_.Handle<internal::FreezeMessage>(
                 [self](const CallInfo&, const internal::FreezeMessage& m) { return self->Freeze(m); }),
             agent_.Handle<internal::ExportMessage>(
                 [self](const CallInfo&, const internal::ExportMessage& m) { return self->Export(m); }),
             agent_.Handle<internal::ImportMessage>(
                 [self](const CallInfo&, const internal::ImportMessage& m) { return self->Import(m); }),
             agent_.Handle<internal::EndFreezeMessage>(
                 [self](const CallInfo&, const internal::EndFreezeMessage& m) { return self->EndFreeze(m); }),
             agent_.Handle<internal::CutPlanMessage>(
                 [self](const CallInfo&, internal::CutPlanMessage) { return self->CutPlan(); }),
             agent_.Handle<internal::CutMessage>(
                 [self](const CallInfo&, const internal::CutMessage& m) { return self->Cut(m); }),
             agent_.Handle<internal::CutWrittenMessage>(
                 [self](const CallInfo&, const internal::CutWrittenMessage& m) { return self->CutWritten(m.version); }),
             agent_.Handle<internal::CutCommitMessage>(
                 [self](const CallInfo&, const internal::CutCommitMessage& m) { return self->CutCommit(m); }),
             agent_.Handle<internal::CutAbandonMessage>([self](const CallInfo&, const internal::CutAbandonMessage& m) {
               self->CutAbandon(m.version);
               return Ack{};
             }),
             agent_.Handle<internal::RestoredMessage>([self](const CallInfo&, internal::RestoredMessage) {
               return internal::RestoredInfo{self->restored_.version, self->restored_.step, self->restored_.job};
             }),
             agent_.Handle<internal::ShardRRefMessage>(
                 [self](const CallInfo&, const internal::ShardRRefMessage& m) { return self->ShardRRef(m.table); }),
             agent_.Handle<internal::ReadMessage>(
                 [self](const CallInfo&, const internal::ReadMessage& m) { return self->Read(m); }),
         }) {
      if (!s.ok()) return s;
    }
    watchdog_ = std::thread([this] { Watch(); });
    if (!options_.checkpoint_dir.empty()) writer_ = std::thread([this] { WriteCuts(); });
    // The tables and checkpoints in the agent's statistics (what a metrics endpoint exports).
    waits_ = agent_.waits().Add("ps", [this](std::vector<rpc::Wait>& out) { AppendWaits(out); });
    statistics_ = agent_.statistics().Add("ps", [this](std::vector<rpc::Sample>& out) {
      AppendTableStatistics(out);
      if (!options_.checkpoint_dir.empty()) {
        const CheckpointStats c = checkpoint_stats();
        auto add = [&](const char* name, double value) {
          out.push_back({absl::StrCat("gradwire_ps_checkpoint_", name), {}, value});
        };
        add("versions_written_total", static_cast<double>(c.written));
        add("failures_total", static_cast<double>(c.failed));
        add("failures_in_a_row", static_cast<double>(c.failures_in_a_row));
        add("last_version", static_cast<double>(c.last_version));
        add("last_step", static_cast<double>(c.last_step));
        add("last_bytes", static_cast<double>(c.last_bytes));
        add("last_copy_seconds", absl::ToDoubleSeconds(c.last_copy));
        add("last_write_seconds", absl::ToDoubleSeconds(c.last_write));
        add("restored_version", static_cast<double>(restored_.version));
      }
    });
    // A trainer declared dead fails the steps waiting for its push at once.
    peer_watch_ = agent_.WatchPeers([weak = weak_from_this()](int rank) {
      if (std::shared_ptr<Impl> self = weak.lock()) self->OnWorkerGone(rank);
    });
    return absl::OkStatus();
  }

  size_t num_shards() const {
    absl::MutexLock lock(&mu_);
    return shards_.size();
  }

  absl::StatusOr<SparseShardStats> sparse_stats(const std::string& table) const {
    absl::StatusOr<std::shared_ptr<Shard>> found = FindKind(table, true);
    if (!found.ok()) return found.status();
    return (*found)->rows->stats();
  }

  const RestoredCheckpoint& restored() const { return restored_; }

  CheckpointStats checkpoint_stats() const {
    absl::MutexLock lock(&cut_mu_);
    return stats_;
  }

 private:
  // ---------------------------------------------------------------- checkpoints

  // The newest usable version, if the directory has any (server.h, checkpoint.h).
  absl::Status LoadCheckpoint() {
    const std::string& dir = options_.checkpoint_dir;
    if (dir.empty()) return absl::OkStatus();
    if (options_.fresh || agent_.options().join) {
      if (!internal::ListVersions(dir).empty()) {
        std::fprintf(stderr, "gradwire: %s: starts empty (%s); the checkpoint versions in %s are kept\n", name_.c_str(),
                     options_.fresh ? "fresh" : "it joined a running job", dir.c_str());
      }
      return absl::OkStatus();
    }
    std::vector<std::pair<std::string, std::unique_ptr<Shard>>> shards;
    absl::StatusOr<internal::UsableVersion> usable = internal::NewestUsable(
        dir, name_,
        [&](const internal::UsableVersion& v) -> absl::Status {
          const std::string path = absl::StrCat(v.path, "/", v.manifest.FileOf(name_)->name);
          absl::StatusOr<nn::NamedTensors> file =
              nn::LoadTensors(path, nn::LoadOptions{.allow_non_finite = options_.allow_non_finite});
          if (!file.ok()) return file.status();
          auto restored = internal::Restore(*file);
          if (!restored.ok()) return absl::DataLossError(absl::StrCat(path, ": ", restored.status().message()));
          if (restored->size() != v.manifest.FileOf(name_)->shards.size()) {
            return absl::DataLossError(absl::StrCat(path, " holds ", restored->size(), " tables, its manifest lists ",
                                                    v.manifest.FileOf(name_)->shards.size()));
          }
          shards = *std::move(restored);
          return absl::OkStatus();
        },
        [&](const std::string& path, const absl::Status& why) {
          restored_.skipped.push_back(absl::StrCat(path, ": ", why.message()));
          std::fprintf(stderr, "gradwire: %s: checkpoint %s is not usable: %s\n", name_.c_str(), path.c_str(),
                       std::string(why.message()).c_str());
        });
    if (absl::IsNotFound(usable.status())) {
      std::error_code ec;
      if (const std::string old = absl::StrCat(dir, "/", name_, ".gwps"); std::filesystem::exists(old, ec)) {
        return absl::FailedPreconditionError(absl::StrCat(
            old, " is an unversioned checkpoint of an older gradwire, which this one does not read: move it away"));
      }
      return absl::OkStatus();
    }
    if (!usable.ok()) {
      return absl::Status(usable.status().code(),
                          absl::StrCat(usable.status().message(), "; start fresh (ServerOptions::fresh, the examples' "
                                                                  "--fresh) or move the directory away"));
    }
    restored_.version = usable->manifest.version;
    restored_.step = usable->manifest.step;
    restored_.job = usable->manifest.job;
    restored_.path = usable->path;
    restored_.tables = static_cast<int64_t>(shards.size());
    {
      absl::MutexLock lock(&cut_mu_);
      job_ = usable->manifest.job;
    }
    absl::MutexLock lock(&mu_);
    for (auto& [table, shard] : shards) shards_[table] = std::move(shard);
    return absl::OkStatus();
  }

  absl::Status NoDirectory() const {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, " has no checkpoint directory (ServerOptions::checkpoint_dir; the examples' --checkpoint_dir)"));
  }

  // Per table this server serves a shard of: where its clock is, how far its trainers are
  // apart, the pulls that wait, its rows and the optimizer steps applied.
  void AppendTableStatistics(std::vector<rpc::Sample>& out) const {
    for (const auto& entry : Live()) {
      const std::map<std::string, std::string> labels = {{"table", entry.first}};
      auto add = [&](const char* name, double value) {
        out.push_back({absl::StrCat("gradwire_ps_table_", name), labels, value});
      };
      Shard& shard = *entry.second;
      const int64_t rows = shard.config.sparse ? shard.rows->stats().rows : 0;
      absl::MutexLock lock(&shard.mu);
      const Consistency mode = shard.clock.mode();
      // The clock: kSync, the open step; bounded staleness, the furthest trainer's; async,
      // the updates applied (it has no clock).
      int64_t slowest = std::numeric_limits<int64_t>::max(), fastest = 0;
      for (const auto& trainer : shard.clock.trainers()) {
        if (trainer.second.until != internal::ConsistencyClock::kForever) continue;  // left
        slowest = std::min(slowest, trainer.second.next);
        fastest = std::max(fastest, trainer.second.next);
      }
      if (mode == Consistency::kSync) {
        add("clock", static_cast<double>(shard.clock.applied()));
        add("step_pushed", static_cast<double>(shard.clock.pushed().size()));
        add("step_trainers", static_cast<double>(shard.clock.taking_part()));
      } else if (mode == Consistency::kBoundedStaleness) {
        add("clock", static_cast<double>(shard.clock.JoinHint()));
        if (slowest <= fastest) add("staleness", static_cast<double>(fastest - slowest));
      } else if (!shard.config.sparse) {
        add("clock", static_cast<double>(shard.state.step));
      }
      add("waiting_pulls", static_cast<double>(shard.waiting.size()));
      add("rows", static_cast<double>(shard.config.sparse ? rows : shard.values.numel()));
      if (!shard.config.sparse) add("updates_total", static_cast<double>(shard.state.step));
    }
  }

  // What the tables wait for (waits.h): a synchronous step's missing pushes, and pulls
  // that wait for a clock, each on the workers of the trainers they wait for.
  void AppendWaits(std::vector<rpc::Wait>& out) const {
    const absl::Time now = absl::Now();
    for (const auto& [table, shard_ptr] : Live()) {
      Shard& shard = *shard_ptr;
      absl::MutexLock lock(&shard.mu);
      const Consistency mode = shard.clock.mode();
      auto on_trainers = [&](const std::vector<int>& trainers, rpc::Wait& w) {
        std::vector<std::string> names;
        for (int t : trainers) {
          const int rank = trainers_.RankOf(t);
          if (rank >= 0) w.on.push_back(rank);
          names.push_back(rank >= 0 ? absl::StrCat("trainer ", t, " (", agent_.NameOf(rank), ")")
                                    : absl::StrCat("trainer ", t, " (no push yet)"));
        }
        return absl::StrJoin(names, ", ");
      };
      if (mode == Consistency::kSync && !shard.clock.pushed().empty()) {
        const int64_t step = shard.clock.applied();
        rpc::Wait w{
            .layer = "param_server", .state = "waits", .what = absl::StrCat("step ", step, " of table '", table, "'")};
        if (shard.step_deadline != absl::InfiniteFuture()) {
          w.seconds = absl::ToDoubleSeconds(shard.config.sync_timeout - (shard.step_deadline - now));
        }
        for (int t : shard.clock.pushed()) {
          if (const int rank = trainers_.RankOf(t); rank >= 0) w.ready.push_back(rank);
        }
        const std::string missing = on_trainers(shard.clock.Lagging(step + 1), w);
        w.note = absl::StrCat(shard.clock.pushed().size(), " of ", shard.clock.taking_part(),
                              " trainers pushed; waiting for ", missing.empty() ? "none" : missing);
        out.push_back(std::move(w));
      }
      if (!shard.waiting.empty()) {
        int64_t clock = std::numeric_limits<int64_t>::max();
        for (const Waiter& waiter : shard.waiting) clock = std::min(clock, waiter.clock);
        rpc::Wait w{.layer = "param_server",
                    .state = "waits",
                    .what = absl::StrCat(shard.waiting.size(), " pull(s) of table '", table, "' for clock ", clock)};
        const std::string missing = on_trainers(shard.clock.Lagging(clock), w);
        w.note = absl::StrCat("waiting for ", missing.empty() ? "none" : missing);
        out.push_back(std::move(w));
      }
    }
  }

  // The shards that serve now (not those staged for a next layout), by table name.
  std::vector<std::pair<std::string, std::shared_ptr<Shard>>> Live() const {
    std::vector<std::pair<std::string, std::shared_ptr<Shard>>> out;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [name, s] : shards_) out.emplace_back(name, s);
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
  }

  absl::StatusOr<internal::CutPlan> CutPlan() {
    if (options_.checkpoint_dir.empty()) return NoDirectory();
    internal::CutPlan plan;
    for (auto& [table, s] : Live()) {
      absl::MutexLock lock(&s->mu);
      plan.tables.push_back(table);
      plan.consistency.push_back(static_cast<int64_t>(s->config.consistency));
      plan.proposals.push_back(s->config.consistency == Consistency::kSync ? s->clock.applied() : 0);
    }
    const std::vector<int64_t> versions = internal::ListVersions(options_.checkpoint_dir);
    plan.latest_version = versions.empty() ? 0 : versions.front();
    absl::MutexLock lock(&cut_mu_);
    plan.job = job_;
    // A cut registered or committed here whose directory is not there (yet, or any more)
    // still takes its number.
    if (pending_) plan.latest_version = std::max(plan.latest_version, pending_->version);
    if (committed_) plan.latest_version = std::max(plan.latest_version, committed_->version);
    return plan;
  }

  // A cut being taken here: the shards' copies, then the file.
  struct PendingCut {
    int64_t version = 0;
    std::string job;
    int64_t step = 0;
    bool registering = true;
    absl::Time registered = absl::Now();  // a cut pending past kCutLifetime is dropped (its client is gone)
    std::set<std::string> waiting;  // synchronous tables not copied yet
    std::map<std::string, nn::NamedTensors> copies;
    std::vector<internal::CutShard> shards;
    absl::Duration copy_time;
    std::optional<internal::CutFile> file;  // once written
    absl::Status failed;
    std::vector<Promise<internal::CutFile>> written;  // CutWritten answers waiting for the file
  };

  // Copies shard `s` of `table` for a cut: its checkpoint form, and what the manifest says of it.
  static void CopyForCut(const std::string& table, Shard& s, nn::NamedTensors& out, internal::CutShard& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    internal::Snapshot(table, s, out, /*open_step=*/false);
    info = {table,
            s.config.sparse,
            static_cast<int64_t>(s.config.consistency),
            s.config.epoch,
            s.config.sparse ? s.rows->stats().rows : s.values.numel(),
            s.config.consistency == Consistency::kSync ? s.clock.applied() : s.clock.JoinHint(),
            s.state.step};
  }

  // Adds a shard's copy to `cut` if it is still the pending one; true when the cut is then
  // complete and may be written.
  bool AddCopy(const std::shared_ptr<PendingCut>& cut, nn::NamedTensors copy, internal::CutShard info,
               absl::Duration took) {
    absl::MutexLock lock(&cut_mu_);
    if (pending_ != cut) return false;
    cut->waiting.erase(info.table);
    cut->copies[info.table] = std::move(copy);
    cut->shards.push_back(std::move(info));
    cut->copy_time += took;
    return !cut->registering && cut->waiting.empty();
  }

  absl::Status Cut(const internal::CutMessage& m) {
    if (options_.checkpoint_dir.empty()) return NoDirectory();
    const auto shards = Live();
    auto cut = std::make_shared<PendingCut>();
    cut->version = m.version;
    cut->job = m.job;
    cut->step = m.step;
    for (const auto& [table, s] : shards) {
      if (s->config.consistency == Consistency::kSync) cut->waiting.insert(table);
    }
    std::shared_ptr<PendingCut> superseded;
    {
      absl::MutexLock lock(&cut_mu_);
      if (pending_ && pending_->version == m.version) {
        if (pending_->job == m.job && pending_->step == m.step) return absl::OkStatus();  // a retry
        return absl::FailedPreconditionError(absl::StrCat(name_, " is cutting checkpoint version ", m.version,
                                                          " at step ", pending_->step, " already (two clients cut "
                                                          "checkpoints?)"));
      }
      if (pending_ && pending_->version > m.version) {
        return absl::FailedPreconditionError(absl::StrCat(name_, " is cutting checkpoint version ", pending_->version,
                                                          ", newer than ", m.version, " (two clients cut checkpoints?)"));
      }
      superseded = pending_;
      pending_ = cut;
    }
    if (superseded) {
      Drop(superseded, absl::AbortedError(absl::StrCat("checkpoint version ", superseded->version, " on ", name_,
                                                       " was superseded by version ", m.version)));
    }
    absl::Status late;
    for (const auto& entry : shards) {
      const std::string& table = entry.first;  // a plain reference: lambdas may not capture bindings
      Shard& s = *entry.second;
      nn::NamedTensors copy;
      internal::CutShard info;
      const absl::Time start = absl::Now();
      bool copied = false;
      if (s.config.consistency == Consistency::kSync) {
        absl::MutexLock lock(&s.mu);
        const int64_t at = s.clock.applied();
        if (at == m.step) {  // the step's pushes so far are not in the copy: the trainers push it again
          CopyForCut(table, s, copy, info);
          copied = true;
        } else if (at < m.step) {
          s.cut_version = m.version;
          s.cut_step = m.step;
        } else {
          late = absl::AbortedError(absl::StrCat("table '", table, "' on ", name_, " is past step ", m.step, " (at ", at, ")"));
          break;
        }
      } else {
        // An asynchronous sparse shard's pushes take only the gate and the rows' locks.
        auto copy_now = [&] {
          absl::MutexLock lock(&s.mu);
          CopyForCut(table, s, copy, info);
        };
        if (s.config.sparse && s.config.consistency == Consistency::kAsync) {
          absl::MutexLock gate(&s.gate);  // no push is half-applied while the rows are copied
          copy_now();
        } else {
          copy_now();
        }
        copied = true;
      }
      if (copied) AddCopy(cut, std::move(copy), std::move(info), absl::Now() - start);
    }
    if (!late.ok()) {
      Drop(cut, late);
      return late;
    }
    bool ready = false;
    {
      absl::MutexLock lock(&cut_mu_);
      cut->registering = false;
      ready = pending_ == cut && cut->waiting.empty();
    }
    if (ready) Write(cut);
    return absl::OkStatus();
  }

  // A synchronous shard whose clock changed (under its lock): its copy for the cut waiting
  // for this step, if any. Returns that cut (nullptr: none), with the copy in `copy`, or
  // with `missed` set when the table jumped past the cut's step (a restored table joining
  // its trainers: the cut cannot be one step).
  std::shared_ptr<PendingCut> CopyIfCut(const std::string& table, Shard& s, nn::NamedTensors& copy,
                                        internal::CutShard& info, absl::Status& missed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (s.cut_version == 0) return nullptr;
    const int64_t at = s.clock.applied();
    if (at < s.cut_step) return nullptr;
    const int64_t version = s.cut_version;
    s.cut_version = 0;
    std::shared_ptr<PendingCut> cut;
    {
      absl::MutexLock lock(&cut_mu_);
      if (pending_ && pending_->version == version) cut = pending_;
    }
    if (!cut) return nullptr;
    if (at != cut->step) {
      missed = absl::AbortedError(absl::StrCat("table '", table, "' on ", name_, " jumped from before step ", cut->step,
                                               " to step ", at, " (restored, joining its trainers)"));
      return cut;
    }
    CopyForCut(table, s, copy, info);
    return cut;
  }

  void Write(const std::shared_ptr<PendingCut>& cut) {
    absl::MutexLock lock(&cut_mu_);
    writes_.push_back(cut);
  }

  // The writer thread: each cut whose copies are all in, to its file.
  void WriteCuts() {
    while (true) {
      std::shared_ptr<PendingCut> cut;
      {
        absl::MutexLock lock(&cut_mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cut_mu_) { return writer_stopping_ || !writes_.empty(); };
        cut_mu_.Await(absl::Condition(&ready));
        if (writer_stopping_ || writes_.empty()) return;  // queued writes are dropped: nobody waits for them
        cut = writes_.front();
        writes_.pop_front();
        if (pending_ != cut) continue;  // superseded or abandoned while queued: not worth a write
      }
      nn::NamedTensors all;
      for (auto& [table, copy] : cut->copies) {  // by table name
        for (auto& entry : copy) all.push_back(entry);
      }
      const std::string dir = internal::VersionPath(options_.checkpoint_dir, cut->version);
      const std::string name = absl::StrCat(name_, ".gwps");
      const absl::Time start = absl::Now();
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      nn::FileDigest digest;
      // A version never holds what a restore would refuse: values that are not finite (a
      // diverged table) fail the cut instead.
      absl::Status s = options_.allow_non_finite ? absl::OkStatus() : FiniteOrWhy(all);
      if (s.ok()) {
        s = ec ? absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot create '", dir, "'"))
               : nn::SaveTensors(absl::StrCat(dir, "/", name), all, &digest);
      }
      std::vector<Promise<internal::CutFile>> answers;
      absl::StatusOr<internal::CutFile> file =
          internal::CutFile{name, static_cast<int64_t>(digest.bytes), static_cast<int64_t>(digest.crc32c), cut->shards,
                        DirectoryIdentity()};
      {
        absl::MutexLock lock(&cut_mu_);
        if (s.ok()) {
          cut->file = *file;
          stats_.last_copy = cut->copy_time;
          stats_.last_write = absl::Now() - start;
          stats_.last_bytes = static_cast<int64_t>(digest.bytes);
        } else {
          cut->failed = absl::Status(s.code(), absl::StrCat(name_, " could not write checkpoint version ", cut->version,
                                                            ": ", s.message()));
          CountFailure(cut->failed);
          file = cut->failed;
        }
        answers.swap(cut->written);
      }
      for (auto& p : answers) p.Set(file);
    }
  }

  // Which directory the checkpoints go to, so that the manifest can say whether every
  // server wrote into the same one: "<host>:<device>:<inode>" ("" if unknown).
  std::string DirectoryIdentity() const {
    struct stat st {};
    char host[256] = {};
    if (::stat(options_.checkpoint_dir.c_str(), &st) != 0 || ::gethostname(host, sizeof host - 1) != 0) return "";
    return absl::StrCat(host, ":", st.st_dev, ":", st.st_ino);
  }

  // OK, or which entry of a cut's copies holds a value that is not finite.
  static absl::Status FiniteOrWhy(const nn::NamedTensors& tensors) {
    for (const auto& [entry, t] : tensors) {
      if (t.dtype() != DType::kFloat32) continue;
      const float* v = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (!std::isfinite(v[i])) {
          return absl::FailedPreconditionError(absl::StrCat(
              "'", entry, "' holds ", v[i], " at index ", i,
              ": the table diverged; no version is written (ServerOptions::allow_non_finite writes it anyway)"));
        }
      }
    }
    return absl::OkStatus();
  }

  void CountFailure(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cut_mu_) {
    ++stats_.failed;
    ++stats_.failures_in_a_row;
    stats_.last_error = std::string(why.message());
    if (stats_.failures_in_a_row == 1 || absl::Now() - last_logged_ >= absl::Minutes(1)) {
      last_logged_ = absl::Now();
      std::fprintf(stderr, "gradwire: %s (%lld failed in a row)\n", std::string(why.message()).c_str(),
                   static_cast<long long>(stats_.failures_in_a_row));
    }
  }

  Future<internal::CutFile> CutWritten(int64_t version) {
    absl::MutexLock lock(&cut_mu_);
    if (pending_ && pending_->version == version) {
      if (pending_->file) return MakeReadyFuture<internal::CutFile>(agent_.executor(), *pending_->file);
      if (!pending_->failed.ok()) return MakeReadyFuture<internal::CutFile>(agent_.executor(), pending_->failed);
      Promise<internal::CutFile> later(agent_.executor());
      pending_->written.push_back(later);
      return later.future();
    }
    if (committed_ && committed_->version == version && committed_->file) {
      return MakeReadyFuture<internal::CutFile>(agent_.executor(), *committed_->file);
    }
    return MakeReadyFuture<internal::CutFile>(
        agent_.executor(), absl::NotFoundError(absl::StrCat(name_, " is not cutting checkpoint version ", version,
                                                            " (abandoned or superseded)")));
  }

  absl::Status CutCommit(const internal::CutCommitMessage& m) {
    std::shared_ptr<PendingCut> cut;
    {
      absl::MutexLock lock(&cut_mu_);
      if (committed_ && committed_->version == m.version) return absl::OkStatus();  // a retry
      if (!pending_ || pending_->version != m.version || !pending_->file) {
        return absl::FailedPreconditionError(
            absl::StrCat(name_, " has not written checkpoint version ", m.version, " (abandoned or superseded)"));
      }
      cut = pending_;
    }
    const std::string dir = internal::VersionPath(options_.checkpoint_dir, m.version);
    absl::StatusOr<internal::Manifest> manifest = internal::Decode(m.manifest, "the manifest sent");
    absl::Status s = manifest.status();
    if (s.ok() && (manifest->version != m.version || manifest->step != cut->step || manifest->job != cut->job ||
                   manifest->FileOf(name_) == nullptr ||
                   manifest->FileOf(name_)->crc32c != static_cast<uint32_t>(cut->file->crc32c))) {
      s = absl::InvalidArgumentError(absl::StrCat("the manifest of version ", m.version, " is not of the cut ", name_,
                                                  " wrote (version, step, job or its file differ)"));
    }
    if (s.ok()) s = nn::WriteFileAtomically(absl::StrCat(dir, "/", internal::kManifestName), {m.manifest}, "checkpoint", name_);
    absl::ReleasableMutexLock lock(&cut_mu_);
    if (pending_ == cut) pending_ = nullptr;
    if (!s.ok()) {
      const absl::Status failed(s.code(), absl::StrCat(name_, " could not commit checkpoint version ", m.version, ": ",
                                                       s.message()));
      CountFailure(failed);
      return failed;
    }
    committed_ = cut;
    job_ = cut->job;
    ++stats_.written;
    stats_.failures_in_a_row = 0;
    stats_.last_version = cut->version;
    stats_.last_step = cut->step;
    cut->copies.clear();  // their memory goes now
    lock.Release();
    // Outside the lock: a push that completes a step takes it (CopyIfCut).
    internal::Prune(options_.checkpoint_dir, std::max(1, options_.checkpoint_keep));
    return absl::OkStatus();
  }

  void CutAbandon(int64_t version) {
    std::shared_ptr<PendingCut> cut;
    {
      absl::MutexLock lock(&cut_mu_);
      if (pending_ && pending_->version == version) cut = pending_;
    }
    if (cut) Drop(cut, absl::AbortedError(absl::StrCat("checkpoint version ", version, " was abandoned")));
  }

  // A cut pending for longer than kCutLifetime is dropped: its client died (it would have
  // abandoned it), or a shard it waits for never got to its step (frozen, retired, its
  // trainers gone). Its copies would stay in memory otherwise.
  static constexpr absl::Duration kCutLifetime = absl::Minutes(10);
  void DropIfStale() {
    std::shared_ptr<PendingCut> stale;
    {
      absl::MutexLock lock(&cut_mu_);
      if (pending_ && absl::Now() - pending_->registered > kCutLifetime) stale = pending_;
    }
    if (stale) {
      Drop(stale, absl::DeadlineExceededError(absl::StrCat("checkpoint version ", stale->version, " on ", name_,
                                                           " was pending for ", absl::FormatDuration(kCutLifetime),
                                                           ": dropped")));
    }
  }

  // Ends `cut` if it is still pending: the shards stop waiting for it, and the answers
  // that wait for its file get `why`.
  void Drop(const std::shared_ptr<PendingCut>& cut, const absl::Status& why) {
    std::vector<Promise<internal::CutFile>> answers;
    {
      absl::MutexLock lock(&cut_mu_);
      if (pending_ == cut) pending_ = nullptr;
      answers.swap(cut->written);
      if (cut->failed.ok() && !cut->file) cut->failed = why;
    }
    for (auto& [table, s] : Live()) {
      absl::MutexLock lock(&s->mu);
      if (s->cut_version == cut->version) s->cut_version = 0;
    }
    for (auto& p : answers) p.Set(why);
  }

  // ---------------------------------------------------------------- tables

  // The configuration shared by both kinds of table, checked.
  static absl::StatusOr<ShardConfig> Configure(const internal::TableConfig& t) {
    if (absl::Status s = rpc::CatchExceptions("optimizer", [&] { optim::Validate(t.optimizer); }); !s.ok()) return s;
    if (t.consistency != Consistency::kSync && t.consistency != Consistency::kAsync &&
        t.consistency != Consistency::kBoundedStaleness) {
      return absl::InvalidArgumentError("unknown consistency mode");
    }
    if (t.staleness < 0) return absl::InvalidArgumentError("staleness must not be negative");
    if (t.trainers < 1 || t.trainers > internal::kMaxTrainers) {
      return absl::InvalidArgumentError(absl::StrCat("trainers must be in [1, ", internal::kMaxTrainers, "], got ", t.trainers));
    }
    ShardConfig c;
    c.optimizer = t.optimizer;
    c.consistency = t.consistency;
    c.trainers = static_cast<int>(t.trainers);
    c.sync_timeout = absl::Milliseconds(std::max<int64_t>(0, t.sync_timeout_ms));
    c.staleness = t.staleness;
    return c;
  }

  // Adds a shard unless the table exists. An existing one (another trainer created it
  // first, or it was restored) must ask for the same consistency, trainers and staleness
  // (a silent mismatch would hang its steps) and the same shape (`same_shape`).
  absl::Status Add(const std::string& table, const ShardConfig& c, std::function<std::unique_ptr<Shard>()> make,
                   const std::function<absl::Status(const Shard&)>& same_shape) {
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(table);
    if (it == shards_.end()) {
      shards_[table] = make();
      return absl::OkStatus();
    }
    const ShardConfig& old = it->second->config;
    if (old.consistency != c.consistency || old.trainers != c.trainers ||
        (old.consistency == Consistency::kBoundedStaleness && old.staleness != c.staleness)) {
      return absl::AlreadyExistsError(absl::StrCat("table '", table, "' exists on ", name_, " as ",
                                                   Mode(old.consistency, old.trainers, old.staleness), "; asked for ",
                                                   Mode(c.consistency, c.trainers, c.staleness),
                                                   " (restarted with another deployment? move its checkpoint away)"));
    }
    return same_shape(*it->second);
  }

  absl::Status CreateDense(const internal::CreateDenseMessage& m) {
    if (!m.values.defined() || m.values.dim() != 1 || m.values.dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("table '", m.table, "': a shard must be a 1-D float32 tensor"));
    }
    absl::StatusOr<ShardConfig> c = Configure(m.config);
    if (!c.ok()) return c.status();
    const int64_t n = m.values.numel();
    c->size = n;
    return Add(
        m.table, *c,
        [&] {
          auto shard = std::make_unique<Shard>(*c);
          absl::MutexLock lock(&shard->mu);
          shard->values = kernels::Clone(m.values);
          return shard;
        },
        [&](const Shard& old) {
          if (!old.config.sparse && old.config.size == n) return absl::OkStatus();
          return absl::AlreadyExistsError(absl::StrCat(
              "table '", m.table, "' exists on ", name_, " as ",
              old.config.sparse ? "a sparse table" : absl::StrCat("a dense shard of ", old.config.size, " keys"),
              ", not a dense shard of ", n, " keys"));
        });
  }

  absl::Status CreateSparse(const internal::CreateSparseMessage& m) {
    absl::StatusOr<ShardConfig> c = Configure(m.config);
    if (!c.ok()) return c.status();
    const int kind = static_cast<int>(m.init.kind);
    if (m.dim < 1 || m.dim > internal::kMaxRowWidth || m.capacity < 0 ||
        m.capacity > internal::StripedRows::kMaxCapacity || kind < 0 || kind > 2) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table '", m.table, "': bad layout (dim ", m.dim,
                                                     ", capacity ", m.capacity, ", init ", kind, ")"));
    }
    c->sparse = true;
    c->dim = m.dim;
    c->capacity = m.capacity;
    c->init = m.init;
    return Add(
        m.table, *c, [&] { return std::make_unique<Shard>(*c); },
        [&](const Shard& old) {
          if (old.config.sparse && old.config.dim == m.dim) return absl::OkStatus();
          return absl::AlreadyExistsError(
              absl::StrCat("table '", m.table, "' exists on ", name_, " and is not a sparse table of width ", m.dim));
        });
  }

  absl::StatusOr<std::shared_ptr<Shard>> Find(const std::string& table) const {
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(table);
    if (it == shards_.end()) return absl::NotFoundError(absl::StrCat(name_, " has no table '", table, "'"));
    return it->second;
  }

  absl::StatusOr<std::shared_ptr<Shard>> FindKind(const std::string& table, bool sparse) const {
    absl::StatusOr<std::shared_ptr<Shard>> found = Find(table);
    if (found.ok() && (*found)->config.sparse != sparse) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "' on ", name_, " is ",
                                                     sparse ? "dense: use Pull/Push" : "sparse: use PullRows/PushRows"));
    }
    return found;
  }

  // The shard a request split by layout `epoch` is for: ABORTED when the table has
  // another layout here (re-sharded: the client re-reads it and sends the request again).
  // The first request of a layout whose shard was imported puts that shard in place.
  absl::StatusOr<std::shared_ptr<Shard>> Lookup(const std::string& table, bool sparse, int64_t epoch) {
    Promote(table, epoch);
    {
      absl::MutexLock lock(&mu_);
      if (auto it = moved_.find(table); it != moved_.end() && !shards_.contains(table)) {
        return absl::AbortedError(absl::StrCat("table '", table, "' moved away from ", name_, " (layout ", it->second,
                                               "): the client re-reads the layout"));
      }
    }
    absl::StatusOr<std::shared_ptr<Shard>> found = FindKind(table, sparse);
    if (found.ok() && (*found)->config.epoch != epoch) {
      return absl::AbortedError(absl::StrCat("table '", table, "' on ", name_, " has layout ", (*found)->config.epoch,
                                             ", the request was split by layout ", epoch,
                                             " (re-sharded): the client re-reads the layout"));
    }
    return found;
  }

  // Puts the shard imported for layout `epoch` of `table` in place, if there is one.
  void Promote(const std::string& table, int64_t epoch) {
    std::shared_ptr<Shard> retired;
    {
      absl::MutexLock lock(&mu_);
      auto it = staged_.find(table);
      if (it == staged_.end() || it->second->config.epoch != epoch) return;
      if (auto live = shards_.find(table); live != shards_.end()) retired = live->second;
      shards_[table] = it->second;
      staged_.erase(it);
    }
    if (retired) Retire(*retired);
  }

  // A shard a new layout replaced: everything it still gets is refused (ABORTED), and
  // the pulls and freezes that wait on it end so.
  void Retire(Shard& s) {
    std::vector<Promise<Tensor>> pulls;
    std::vector<Promise<int64_t>> freezes;
    {
      absl::MutexLock gate(&s.gate);
      s.gate_closed = true;
    }
    absl::Status why;
    {
      absl::MutexLock lock(&s.mu);
      s.frozen_at = Shard::kRetired;
      for (Waiter& w : s.waiting) pulls.push_back(w.answer);
      s.waiting.clear();
      freezes.swap(s.quiescent);
      why = internal::FrozenRefusal(absl::StrCat("a shard on ", name_), s, true, 0);
    }
    // Outside the lock: answering runs the waiters' continuations (replies, sends).
    for (auto& p : pulls) p.Set(why);
    for (auto& p : freezes) p.Set(why);
  }

  // Dense shards copied for a reader that does not train (never waits for a step).
  absl::StatusOr<internal::TablesRead> Read(const internal::ReadMessage& m) const {
    internal::TablesRead out;
    for (const std::string& table : m.tables) {
      absl::StatusOr<std::shared_ptr<Shard>> found = FindKind(table, false);
      if (!found.ok()) return found.status();
      Shard& s = **found;
      absl::MutexLock lock(&s.mu);
      out.steps.push_back(s.state.step);
      if (m.values) out.values.push_back(kernels::Clone(s.values));
    }
    return out;
  }

  // The dense shard as an RRef owned by this server: one per shard, so every trainer's
  // DistributedOptimizer updates the same owned tensor (whose storage is the shard's).
  absl::StatusOr<rpc::RRef<Tensor>> ShardRRef(const std::string& table) {
    absl::StatusOr<std::shared_ptr<Shard>> found = FindKind(table, false);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    absl::MutexLock lock(&s.mu);
    if (!s.rref) {
      Tensor view = s.values.detach();  // same storage
      view.set_requires_grad(true);
      s.rref = agent_.Own(view);
    }
    return *s.rref;
  }

  // ---------------------------------------------------------------- pulls

  // Serves `read` now if `clock` is readable, else when it becomes so. `read` runs under
  // the shard's mutex.
  Future<Tensor> PullWhenReadable(const std::string& table, Shard& s, int64_t clock, std::function<Tensor()> read) {
    // Sparse rows have their own locks (StripedRows); asynchronous pulls never wait.
    if (s.config.sparse && s.config.consistency == Consistency::kAsync) {
      return MakeReadyFuture<Tensor>(agent_.executor(), read());
    }
    absl::MutexLock lock(&s.mu);
    if (absl::Status frozen = internal::FrozenRefusal(absl::StrCat("table '", table, "' on ", name_), s, false, clock);
        !frozen.ok()) {
      return MakeReadyFuture<Tensor>(agent_.executor(), frozen);
    }
    if (s.clock.Readable(clock)) return MakeReadyFuture<Tensor>(agent_.executor(), read());
    if (std::string dead = trainers_.DeadAmong(s.clock.Lagging(clock)); !dead.empty()) {
      return MakeReadyFuture<Tensor>(agent_.executor(), DeadTrainerError(table, s, clock, dead));
    }
    Promise<Tensor> answer(agent_.executor());
    s.waiting.push_back({clock, answer, std::move(read)});
    if (s.step_deadline == absl::InfiniteFuture()) s.step_deadline = absl::Now() + s.config.sync_timeout;
    return answer.future();
  }

  Future<Tensor> Pull(const std::string& table, int64_t clock, int64_t epoch) {
    if (clock < 0) {
      return MakeReadyFuture<Tensor>(agent_.executor(), absl::InvalidArgumentError(absl::StrCat(
                                                            "table '", table, "': negative clock ", clock)));
    }
    absl::StatusOr<std::shared_ptr<Shard>> shard = Lookup(table, false, epoch);
    if (!shard.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), shard.status());
    Shard* s = shard->get();
    // kSync: the values change again only when every trainer has pushed the next step,
    // which each does after receiving this answer, so they may travel without a copy.
    // ThreadSanitizer cannot see that order (it runs through the socket and the trainer)
    // and counts the reply's read for the whole sendmsg call, which may still be returning
    // when the next step writes: under TSan the answer is a copy, as in the other modes.
#if defined(__SANITIZE_THREAD__)
    constexpr bool kAliasSyncValues = false;
#else
    constexpr bool kAliasSyncValues = true;
#endif
    return PullWhenReadable(table, *s, clock, [s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
      return kAliasSyncValues && s->config.consistency == Consistency::kSync ? s->values : kernels::Clone(s->values);
    });
  }

  Future<Tensor> PullRows(const internal::PullRowsMessage& m) {
    if (m.clock < 0) {
      return MakeReadyFuture<Tensor>(agent_.executor(), absl::InvalidArgumentError(absl::StrCat(
                                                            "table '", m.table, "': negative clock ", m.clock)));
    }
    absl::StatusOr<std::shared_ptr<Shard>> shard = Lookup(m.table, true, m.epoch);
    if (!shard.ok()) return MakeReadyFuture<Tensor>(agent_.executor(), shard.status());
    if (!m.ids.defined() || m.ids.dim() != 1 || m.ids.dtype() != DType::kInt64) {
      return MakeReadyFuture<Tensor>(agent_.executor(),
                                     absl::InvalidArgumentError(absl::StrCat("table '", m.table,
                                                                             "': ids must be a 1-D int64 tensor")));
    }
    Shard* s = shard->get();
    const Tensor ids = kernels::Contiguous(m.ids);
    return PullWhenReadable(m.table, *s, m.clock, [s, ids] { return internal::ReadRows(*s->rows, ids); });
  }

  // Answers the waiting pulls that became readable: (answer, value read now).
  static std::vector<std::pair<Promise<Tensor>, Tensor>> Released(Shard& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    std::vector<std::pair<Promise<Tensor>, Tensor>> ready;
    auto split = std::partition(s.waiting.begin(), s.waiting.end(),
                                [&](const Waiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return !s.clock.Readable(w.clock); });
    for (auto it = split; it != s.waiting.end(); ++it) ready.emplace_back(it->answer, it->read());
    s.waiting.erase(split, s.waiting.end());
    if (s.waiting.empty()) {
      s.step_deadline = absl::InfiniteFuture();
    } else if (!ready.empty()) {
      s.step_deadline = absl::Now() + s.config.sync_timeout;  // progress: the rest wait afresh
    }
    return ready;
  }

  // ---------------------------------------------------------------- pushes

  // Runs a push through the shard's consistency clock, then answers the pulls it released.
  // The waiting pulls' deadline (FailIfLate) starts with the first of them and restarts
  // whenever some are released.
  absl::Status Admit(const std::string& table, Shard& s, int64_t clock, int64_t trainer,
                     const std::function<absl::Status()>& check, const ConsistencyClock::Ops& ops) {
    const std::string where = absl::StrCat("table '", table, "' on ", name_);
    if (s.config.sparse && s.config.consistency == Consistency::kAsync) {
      // Nothing waits on an asynchronous table and its rows have their own locks: pushes
      // run in parallel with each other and with pulls (a freeze waits for them).
      absl::ReaderMutexLock gate(&s.gate);
      if (s.gate_closed) {
        return absl::AbortedError(absl::StrCat(where, " is being re-sharded or was: the client sends this again "
                                                      "once the new layout is in place"));
      }
      return rpc::CatchExceptions(where, [&] { ops.apply_now(); });
    }
    return ChangeClock(table, s, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      if (absl::Status c = check(); !c.ok()) return c;
      if (absl::Status f = internal::FrozenRefusal(where, s, true, clock); !f.ok()) return f;
      return s.clock.Push(clock, trainer, ops);
    });
  }

  // Runs `change` on the shard's clock (under its lock: a push, a trainer joining or
  // leaving), then answers the pulls it released.
  absl::Status ChangeClock(const std::string& table, Shard& s, const std::function<absl::Status()>& change) {
    const std::string where = absl::StrCat("table '", table, "' on ", name_);
    std::vector<std::pair<Promise<Tensor>, Tensor>> ready;
    std::vector<std::pair<Promise<int64_t>, int64_t>> frozen;
    absl::Status status;
    std::shared_ptr<PendingCut> cut;  // a checkpoint waiting for the step this change began
    nn::NamedTensors copy;
    internal::CutShard info;
    absl::Status missed;
    absl::Duration copy_took;
    {
      absl::MutexLock lock(&s.mu);
      const int64_t before = s.clock.applied();
      const bool restored = s.clock.restored();
      try {
        status = change();
      } catch (...) {
        status = rpc::StatusFromException("the update");
      }
      if (restored && s.clock.applied() > before + 1) {
        std::fprintf(stderr,
                     "gradwire: %s: restored at step %lld, continues at its trainers' step %lld: this shard's updates "
                     "of the steps in between are lost (more frequent checkpoints lose fewer)\n",
                     where.c_str(), static_cast<long long>(before),
                     static_cast<long long>(s.clock.applied() - (s.clock.pushed().empty() ? 1 : 0)));
      }
      if (s.cut_version != 0) {  // (the clock read only when a cut waits: this is every push's path)
        const absl::Time copy_start = absl::Now();
        cut = CopyIfCut(table, s, copy, info, missed);
        copy_took = absl::Now() - copy_start;
      }
      if (!status.ok() && status.code() != absl::StatusCode::kAborted) {
        status = absl::Status(status.code(), absl::StrCat(where, ": ", status.message()));
      }
      ready = Released(s);  // also after a failed push: what it released is answered all the same
      if (!s.quiescent.empty() && internal::Quiescent(s)) {
        for (Promise<int64_t>& p : s.quiescent) frozen.emplace_back(p, s.frozen_at);
        s.quiescent.clear();
      }
    }
    for (auto& [p, at] : frozen) p.Set(at);
    if (cut && !missed.ok()) {
      Drop(cut, missed);
    } else if (cut && AddCopy(cut, std::move(copy), std::move(info), copy_took)) {
      Write(cut);
    }
    // Large answers go out from the worker pool: sending one copies the values into the
    // transport, and this thread has its own caller to answer, so a step's answers to its
    // trainers are copied in parallel. Small ones are answered here (no hop).
    for (auto& [p, v] : ready) {
      const bool large = v.nbytes() >= kLargeAnswerBytes;
      // Copied into the task (a handle), so that a refused Post still has it to answer.
      if (!large || !agent_.executor().Post([p = p, v = v]() mutable { p.Set(std::move(v)); })) p.Set(std::move(v));
    }
    return status;
  }

  absl::Status Push(const std::string& table, int64_t clock, int64_t trainer, const Tensor& grad, int64_t epoch) {
    absl::StatusOr<std::shared_ptr<Shard>> found = Lookup(table, false, epoch);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    auto check = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) -> absl::Status {
      if (grad.defined() && grad.sizes() == s.values.sizes() && grad.dtype() == s.values.dtype()) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "' on ", name_, ": gradient of shape ",
                                                     grad.defined() ? ShapeToString(grad.sizes()) : "undefined",
                                                     " for a shard of shape ", ShapeToString(s.values.sizes())));
    };
    ConsistencyClock::Ops ops = StepOps(s);
    // Received gradients are kept as they are (never written: a caller on this worker
    // may share them). Pushes before the last are summed as they arrive, so that the
    // last one only adds itself while averaging (one pass on the step's critical path).
    ops.accumulate = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      s.pending.push_back(kernels::Contiguous(grad));
      if (s.pending.size() == 2 && static_cast<int>(s.clock.pushed().size()) + 1 < s.clock.taking_part()) {
        s.pending = {kernels::Add(s.pending[0], s.pending[1])};
      }
    };
    ops.apply_now = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      optim::Update(s.config.optimizer, s.values, grad, s.state);
    };
    return Admit(table, s, clock, trainer, check, ops);
  }

  // What completing or dropping a synchronous step does to the shard's data: applies (or
  // forgets) the mean of the pushes of the trainers that took part in it.
  ConsistencyClock::Ops StepOps(Shard& s) {
    ConsistencyClock::Ops ops;
    if (s.config.sparse) {
      ops.apply_step = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
        internal::ApplyRowSum(*s.rows, s.config.optimizer, s.row_sum, 1.0f / static_cast<float>(s.clock.pushed().size()));
      };
      ops.drop_step = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { s.row_sum.Clear(); };
      return ops;
    }
    ops.apply_step = [this, &s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      // The average of the pushes is formed block by block inside the update (one pass).
      // Large shards are updated in ranges on the worker pool too (the trainers wait).
      optim::UpdateWithAverage(s.config.optimizer, s.values, s.pending, static_cast<int64_t>(s.clock.pushed().size()),
                               s.state, [this](int64_t n, const std::function<void(int64_t)>& task) {
                                 rpc::ParallelFor(agent_.executor(), n, task);
                               });
      s.pending.clear();
    };
    ops.drop_step = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { s.pending.clear(); };
    return ops;
  }

  // ---------------------------------------------------------------- elastic trainers

  // The shard a change of trainers applies to: that of the sender's layout, not frozen (a
  // frozen shard's trainers are on their way to the next layout's shards: ABORTED, the
  // client asks the next layout).
  absl::StatusOr<std::shared_ptr<Shard>> TrainersOf(const std::string& table, int64_t epoch) {
    absl::StatusOr<std::shared_ptr<Shard>> found = Lookup(table, /*sparse=*/false, epoch);
    if (!found.ok() && found.status().code() == absl::StatusCode::kInvalidArgument) found = Lookup(table, true, epoch);
    if (!found.ok()) return found;
    absl::MutexLock lock(&(*found)->mu);
    if ((*found)->frozen_at != Shard::kNotFrozen) {
      return absl::AbortedError(absl::StrCat("table '", table, "' on ", name_, " is being re-sharded: the client "
                                             "sends this again once the new layout is in place"));
    }
    return found;
  }

  absl::StatusOr<int64_t> JoinTable(const internal::JoinTableMessage& m) {
    absl::StatusOr<std::shared_ptr<Shard>> found = TrainersOf(m.table, m.epoch);
    if (!found.ok()) return found.status();
    if (m.trainer < 0 || m.trainer >= internal::kMaxTrainers) {
      return absl::InvalidArgumentError(absl::StrCat("table '", m.table, "': no trainer index ", m.trainer, " (at most ",
                                                     internal::kMaxTrainers, ")"));
    }
    Shard& s = **found;
    int64_t joined = 0;
    absl::Status status = ChangeClock(m.table, s, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      joined = m.from < 0 ? s.clock.JoinHint() : s.clock.Join(static_cast<int>(m.trainer), m.from, StepOps(s));
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return joined;
  }

  absl::Status LeaveTable(const internal::LeaveTableMessage& m) {
    absl::StatusOr<std::shared_ptr<Shard>> found = TrainersOf(m.table, m.epoch);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    return ChangeClock(m.table, s, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      if (m.trainer >= 0 && m.trainer < internal::kMaxTrainers) s.clock.Leave(static_cast<int>(m.trainer), m.last, StepOps(s));
      return absl::OkStatus();
    });
  }

  absl::Status PushRows(const internal::PushRowsMessage& m) {
    absl::StatusOr<std::shared_ptr<Shard>> found = Lookup(m.table, true, m.epoch);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    const int64_t dim = s.config.dim;
    if (!m.ids.defined() || !m.grad.defined() || m.ids.dim() != 1 || m.ids.dtype() != DType::kInt64 ||
        m.grad.dtype() != DType::kFloat32 || m.grad.dim() != 2 || m.grad.size(0) != m.ids.numel() ||
        m.grad.size(1) != dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", m.table, "' on ", name_, ": push of ids ",
          m.ids.defined() ? absl::StrCat(DTypeName(m.ids.dtype()), " ", ShapeToString(m.ids.sizes())) : "undefined",
          " and gradient ",
          m.grad.defined() ? absl::StrCat(DTypeName(m.grad.dtype()), " ", ShapeToString(m.grad.sizes())) : "undefined",
          "; expected int64 [n] and float32 [n, ", dim, "]"));
    }
    const Tensor id = kernels::Contiguous(m.ids), g = kernels::Contiguous(m.grad);
    const optim::OptimizerConfig& optimizer = s.config.optimizer;
    ConsistencyClock::Ops ops = StepOps(s);
    ops.accumulate = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { s.row_sum.Add(id, g, dim); };
    ops.apply_now = [&] { internal::ApplyRows(*s.rows, optimizer, id, g); };
    return Admit(m.table, s, m.clock, m.trainer, [] { return absl::OkStatus(); }, ops);
  }

  // Pushes this trainer's gradients for `clock` to several tables and answers with their
  // values as of clock + 1, in one message each way.
  Future<std::vector<Tensor>> PushPullMany(const internal::PushPullManyMessage& m) {
    if (m.tables.size() != m.grads.size()) {
      return MakeReadyFuture<std::vector<Tensor>>(
          agent_.executor(), absl::InvalidArgumentError(absl::StrCat("PushPullMany: ", m.grads.size(), " gradients for ",
                                                                     m.tables.size(), " tables")));
    }
    for (size_t i = 0; i < m.tables.size(); ++i) {
      if (absl::Status s = Push(m.tables[i], m.clock, m.trainer, m.grads[i], m.epoch); !s.ok()) {
        return MakeReadyFuture<std::vector<Tensor>>(agent_.executor(), s);
      }
    }
    std::vector<Future<Tensor>> pulled;
    for (const std::string& table : m.tables) pulled.push_back(Pull(table, m.clock + 1, m.epoch));
    return WhenAll(agent_.executor(), std::move(pulled));  // answered on the completing thread: no pool hop
  }

  // ---------------------------------------------------------------- re-sharding

  // The live shard of layout `epoch` (the one a re-sharding moves).
  absl::StatusOr<std::shared_ptr<Shard>> Moving(const std::string& table, int64_t epoch) {
    Promote(table, epoch);  // a re-sharding whose coordinator died after its commit
    absl::StatusOr<std::shared_ptr<Shard>> found = Find(table);
    if (found.ok() && (*found)->config.epoch != epoch) {
      return absl::FailedPreconditionError(absl::StrCat("table '", table, "' on ", name_, " has layout ",
                                                        (*found)->config.epoch, ", not ", epoch,
                                                        " (another re-sharding ran meanwhile?)"));
    }
    return found;
  }

  Future<int64_t> Freeze(const internal::FreezeMessage& m) {
    if (m.point >= Shard::kNotFrozen) {
      return MakeReadyFuture<int64_t>(agent_.executor(), absl::InvalidArgumentError("freeze: bad clock"));
    }
    absl::StatusOr<std::shared_ptr<Shard>> found = Moving(m.table, m.epoch);
    if (!found.ok()) return MakeReadyFuture<int64_t>(agent_.executor(), found.status());
    Shard& s = **found;
    if (m.point >= 0 && s.config.sparse && s.config.consistency == Consistency::kAsync) {
      absl::MutexLock gate(&s.gate);  // waits for the pushes under way
      s.gate_closed = true;
    }
    std::vector<Promise<Tensor>> refused;
    absl::Status why;
    Future<int64_t> answer;
    {
      absl::MutexLock lock(&s.mu);
      if (s.frozen_at == Shard::kRetired) {
        return MakeReadyFuture<int64_t>(agent_.executor(), internal::FrozenRefusal(m.table, s, true, 0));
      }
      const int64_t proposal = internal::FreezeProposal(s);
      if (m.point < 0) return MakeReadyFuture<int64_t>(agent_.executor(), proposal);
      const int64_t at = std::max({m.point, proposal, s.frozen_at == Shard::kNotFrozen ? int64_t{0} : s.frozen_at});
      s.frozen_at = at;
      // Pulls that could only be answered after the freeze point end now (the client asks
      // the next layout).
      const std::string where = absl::StrCat("table '", m.table, "' on ", name_);
      auto keep = std::partition(s.waiting.begin(), s.waiting.end(), [&](const Waiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
        return internal::FrozenRefusal(where, s, false, w.clock).ok();
      });
      for (auto it = keep; it != s.waiting.end(); ++it) refused.push_back(it->answer);
      s.waiting.erase(keep, s.waiting.end());
      why = internal::FrozenRefusal(where, s, true, at);
      if (internal::Quiescent(s)) {
        answer = MakeReadyFuture<int64_t>(agent_.executor(), at);
      } else {
        Promise<int64_t> later(agent_.executor());
        s.quiescent.push_back(later);
        answer = later.future();
      }
    }
    for (auto& p : refused) p.Set(why);
    return answer;
  }

  absl::StatusOr<internal::ShardForm> Export(const internal::ExportMessage& m) {
    absl::StatusOr<std::shared_ptr<Shard>> found = Moving(m.table, m.epoch);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    nn::NamedTensors form;
    {
      absl::MutexLock lock(&s.mu);
      if (!internal::Quiescent(s)) {
        return absl::FailedPreconditionError(
            absl::StrCat("table '", m.table, "' on ", name_, " is not frozen at rest: freeze it first"));
      }
      internal::Snapshot(m.table, s, form);
    }
    internal::ShardForm out;
    const std::string prefix = absl::StrCat(m.table, "|");
    for (auto& [name, t] : form) {
      out.names.push_back(name.substr(prefix.size()));
      out.tensors.push_back(std::move(t));
    }
    return out;
  }

  absl::Status Import(const internal::ImportMessage& m) {
    if (m.form.names.size() != m.form.tensors.size()) return absl::InvalidArgumentError("import: one tensor per name");
    nn::NamedTensors form;
    for (size_t i = 0; i < m.form.names.size(); ++i) form.emplace_back(absl::StrCat(m.table, "|", m.form.names[i]), m.form.tensors[i]);
    auto restored = internal::Restore(form);
    if (!restored.ok()) return absl::InvalidArgumentError(absl::StrCat("import of table '", m.table, "': ", restored.status().message()));
    if (restored->size() != 1) return absl::InvalidArgumentError(absl::StrCat("import of table '", m.table, "': not one table"));
    std::unique_ptr<Shard> shard = std::move((*restored)[0].second);
    {
      absl::MutexLock lock(&shard->mu);
      shard->clock.ClearRestored();  // the clocks of a live layout, not of a checkpoint
    }
    absl::MutexLock lock(&mu_);
    staged_[m.table] = std::move(shard);
    return absl::OkStatus();
  }

  absl::Status EndFreeze(const internal::EndFreezeMessage& m) {
    std::shared_ptr<Shard> retired, thawed;
    {
      absl::MutexLock lock(&mu_);
      auto staged = staged_.find(m.table);
      auto live = shards_.find(m.table);
      if (m.commit == 0) {  // aborted: the frozen shard of the layout before serves again
        if (staged != staged_.end() && staged->second->config.epoch == m.epoch) staged_.erase(staged);
        if (live != shards_.end() && live->second->config.epoch == m.epoch - 1) thawed = live->second;
      } else if (staged != staged_.end() && staged->second->config.epoch == m.epoch) {
        if (live != shards_.end()) retired = live->second;
        shards_[m.table] = staged->second;
        staged_.erase(staged);
      } else if (live != shards_.end() && live->second->config.epoch < m.epoch) {
        retired = live->second;  // not in the new layout: the table moved away
        shards_.erase(live);
        moved_[m.table] = m.epoch;
      }
    }
    if (retired) Retire(*retired);
    if (thawed) {
      {
        absl::MutexLock gate(&thawed->gate);
        thawed->gate_closed = false;
      }
      std::vector<Promise<int64_t>> freezes;
      {
        absl::MutexLock lock(&thawed->mu);
        if (thawed->frozen_at != Shard::kRetired) thawed->frozen_at = Shard::kNotFrozen;
        freezes.swap(thawed->quiescent);
      }
      for (auto& p : freezes) p.Set(absl::AbortedError(absl::StrCat("the re-sharding of table '", m.table, "' was aborted")));
    }
    return absl::OkStatus();
  }

  // ---------------------------------------------------------------- background

  // Fails pulls that waited past their table's sync_timeout, naming who did not push.
  void Watch() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100))) return;
      }
      std::vector<std::pair<std::string, std::shared_ptr<Shard>>> shards;
      {
        absl::MutexLock lock(&mu_);
        for (auto& [name, s] : shards_) shards.emplace_back(name, s);
      }
      for (auto& [table, s] : shards) FailIfLate(table, *s);
      DropIfStale();
    }
  }

  void FailIfLate(const std::string& table, Shard& s) {
    std::vector<Promise<Tensor>> failed;
    absl::Status why;
    {
      absl::MutexLock lock(&s.mu);
      if (absl::Now() < s.step_deadline) return;
      int64_t needed = 0;  // the latest clock a waiting pull asks for
      for (const Waiter& w : s.waiting) needed = std::max(needed, w.clock);
      std::vector<std::string> missing;
      for (int t : s.clock.Lagging(needed)) missing.push_back(absl::StrCat("trainer ", t));
      why = absl::DeadlineExceededError(absl::StrCat(Waiting(table, s, needed), " is missing the push of ",
                                                     absl::StrJoin(missing, ", "), " after ",
                                                     absl::FormatDuration(s.config.sync_timeout),
                                                     " (a trainer is slow or dead)"));
      for (Waiter& w : s.waiting) failed.push_back(w.answer);
      s.waiting.clear();
      s.step_deadline = absl::InfiniteFuture();
    }
    for (auto& p : failed) p.Set(why);
  }

  // "synchronous step 3 of table 'w' on worker1" (or a bounded-staleness pull's clock):
  // what a pull for `needed` waits for.
  std::string Waiting(const std::string& table, const Shard& s, int64_t needed) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const std::string what = s.config.consistency == Consistency::kBoundedStaleness
                                 ? absl::StrCat("a bounded-staleness pull (clock ", needed - s.config.staleness, " needed)")
                                 : absl::StrCat("synchronous step ", s.clock.applied());
    return absl::StrCat(what, " of table '", table, "' on ", name_);
  }

  absl::Status DeadTrainerError(const std::string& table, const Shard& s, int64_t needed, const std::string& dead) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return absl::UnavailableError(absl::StrCat(Waiting(table, s, needed), " cannot complete: ", dead,
                                               " was declared dead before its push (a restarted trainer pushes "
                                               "again; retry then)"));
  }

  // A worker was declared dead: the pulls waiting for a push of one of its trainers fail.
  void OnWorkerGone(int rank) {
    if (!trainers_.WorkerGone(rank)) return;
    std::vector<std::pair<std::string, std::shared_ptr<Shard>>> shards;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [name, s] : shards_) shards.emplace_back(name, s);
    }
    for (auto& [table, shard] : shards) {
      Shard& s = *shard;  // a plain reference: lambdas may not capture structured bindings
      std::vector<std::pair<Promise<Tensor>, absl::Status>> failed;
      {
        absl::MutexLock lock(&s.mu);
        // Only the pulls that wait for a dead trainer (under bounded staleness an earlier
        // clock may wait for live ones only).
        auto keep = std::partition(s.waiting.begin(), s.waiting.end(),
                                   [&](const Waiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
                                     return trainers_.DeadAmong(s.clock.Lagging(w.clock)).empty();
                                   });
        for (auto it = keep; it != s.waiting.end(); ++it) {
          failed.emplace_back(it->answer,
                              DeadTrainerError(table, s, it->clock, trainers_.DeadAmong(s.clock.Lagging(it->clock))));
        }
        s.waiting.erase(keep, s.waiting.end());
        if (s.waiting.empty()) s.step_deadline = absl::InfiniteFuture();
      }
      for (auto& [p, why] : failed) p.Set(why);
    }
  }

  rpc::Agent& agent_;
  const std::string name_;
  const ServerOptions options_;
  internal::TrainerRegistry trainers_;
  rpc::Agent::PeerWatch peer_watch_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  // Re-sharding: shards imported for a table's next layout, and the tables whose layout
  // left this server (and since which layout).
  absl::flat_hash_map<std::string, std::shared_ptr<Shard>> staged_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> moved_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;
  // Checkpoints: what Install restored, the cut being taken, the last one committed, the
  // cuts the writer thread writes, the job the versions belong to, and the statistics.
  RestoredCheckpoint restored_;  // set before serving
  mutable absl::Mutex cut_mu_;
  std::shared_ptr<PendingCut> pending_ ABSL_GUARDED_BY(cut_mu_);
  std::shared_ptr<PendingCut> committed_ ABSL_GUARDED_BY(cut_mu_);
  std::deque<std::shared_ptr<PendingCut>> writes_ ABSL_GUARDED_BY(cut_mu_);
  bool writer_stopping_ ABSL_GUARDED_BY(cut_mu_) = false;
  std::string job_ ABSL_GUARDED_BY(cut_mu_);
  CheckpointStats stats_ ABSL_GUARDED_BY(cut_mu_);
  absl::Time last_logged_ ABSL_GUARDED_BY(cut_mu_) = absl::InfinitePast();
  std::thread writer_;
  rpc::Statistics::Source statistics_;  // last: dropped first
  rpc::Waits::Source waits_;            // as statistics_
};

absl::StatusOr<std::shared_ptr<ParameterServer>> ParameterServer::Install(rpc::Agent& agent, ServerOptions options) {
  auto impl = std::make_shared<Impl>(agent, std::move(options));
  if (absl::Status s = impl->Start(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("ParameterServer::Install on ", agent.self().name, ": ", s.message()));
  }
  return std::shared_ptr<ParameterServer>(new ParameterServer(std::move(impl)));
}

ParameterServer::~ParameterServer() = default;
size_t ParameterServer::num_shards() const { return impl_->num_shards(); }
absl::StatusOr<SparseShardStats> ParameterServer::sparse_stats(const std::string& table) const {
  return impl_->sparse_stats(table);
}
const RestoredCheckpoint& ParameterServer::restored() const { return impl_->restored(); }
CheckpointStats ParameterServer::checkpoint_stats() const { return impl_->checkpoint_stats(); }

}  // namespace gw::param_server
