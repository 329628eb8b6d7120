// ParameterServer::Impl: the handlers of the parameter server's messages (messages.h),
// over the tables this server holds. The units it builds on: shard.h (a table's shard,
// its data and lock), consistency_clock.h (the sync / async / bounded-staleness
// protocol), striped_rows.h (sparse rows), checkpoint.cc (a shard's file form).
#include "gradwire/param_server/server.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/optim/functional.h"
#include "gradwire/rpc/errors.h"
#include "gradwire/tensor/kernels.h"
#include "freeze.h"
#include "messages.h"
#include "shard.h"
#include "trainer_registry.h"

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
             agent_.Handle<internal::CheckpointMessage>(
                 [self](const CallInfo&, internal::CheckpointMessage) { return self->Checkpoint(); }),
             agent_.Handle<internal::ShardRRefMessage>(
                 [self](const CallInfo&, const internal::ShardRRefMessage& m) { return self->ShardRRef(m.table); }),
             agent_.Handle<internal::ReadMessage>(
                 [self](const CallInfo&, const internal::ReadMessage& m) { return self->Read(m); }),
         }) {
      if (!s.ok()) return s;
    }
    watchdog_ = std::thread([this] { Watch(); });
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

  absl::StatusOr<std::string> Checkpoint() {
    if (options_.checkpoint_dir.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(name_, " has no checkpoint directory (ServerOptions::checkpoint_dir)"));
    }
    absl::MutexLock one_at_a_time(&checkpoint_mu_);
    std::vector<std::pair<std::string, std::shared_ptr<Shard>>> shards;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [name, s] : shards_) shards.emplace_back(name, s);
    }
    std::sort(shards.begin(), shards.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    nn::NamedTensors out;
    for (auto& [table, s] : shards) {
      absl::MutexLock lock(&s->mu);
      internal::Snapshot(table, *s, out);
    }
    std::error_code ec;
    std::filesystem::create_directories(options_.checkpoint_dir, ec);
    const std::string path = CheckpointPath();
    if (absl::Status s = nn::SaveTensors(path, out); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(name_, ": checkpoint failed: ", s.message()));
    }
    return path;
  }

 private:
  std::string CheckpointPath() const { return absl::StrCat(options_.checkpoint_dir, "/", name_, ".gwps"); }

  absl::Status LoadCheckpoint() {
    if (options_.checkpoint_dir.empty() || !std::filesystem::exists(CheckpointPath())) return absl::OkStatus();
    absl::StatusOr<nn::NamedTensors> file = nn::LoadTensors(CheckpointPath());
    if (!file.ok()) return file.status();
    auto restored = internal::Restore(*file);
    if (!restored.ok()) {
      return absl::DataLossError(absl::StrCat(CheckpointPath(), ": ", restored.status().message(),
                                              " (move the file away to start this server empty)"));
    }
    absl::MutexLock lock(&mu_);
    for (auto& [table, shard] : *restored) shards_[table] = std::move(shard);
    return absl::OkStatus();
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
    AfterLayoutChange();
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
    return PullWhenReadable(table, *s, clock, [s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
      return s->config.consistency == Consistency::kSync ? s->values : kernels::Clone(s->values);
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
    {
      absl::MutexLock lock(&s.mu);
      try {
        status = change();
      } catch (...) {
        status = rpc::StatusFromException("the update");
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

  // A table's layout changed here: a checkpoint now, so that a restarted server does not
  // come back with the old layout's shard (or one it gave away).
  void AfterLayoutChange() {
    if (options_.checkpoint_dir.empty()) return;
    if (absl::StatusOr<std::string> path = Checkpoint(); !path.ok()) {
      std::fprintf(stderr, "gradwire: %s\n", std::string(path.status().message()).c_str());
    }
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
    if (retired) {
      Retire(*retired);
      AfterLayoutChange();
    }
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

  // Fails pulls that waited past their table's sync_timeout, naming who did not push,
  // and writes the periodic checkpoints.
  void Watch() {
    absl::Time next_checkpoint = absl::Now() + options_.checkpoint_every;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100))) return;
      }
      if (options_.checkpoint_every > absl::ZeroDuration() && absl::Now() >= next_checkpoint) {
        if (absl::StatusOr<std::string> path = Checkpoint(); !path.ok()) {
          std::fprintf(stderr, "gradwire: %s\n", std::string(path.status().message()).c_str());
        }
        next_checkpoint = absl::Now() + options_.checkpoint_every;
      }
      std::vector<std::pair<std::string, std::shared_ptr<Shard>>> shards;
      {
        absl::MutexLock lock(&mu_);
        for (auto& [name, s] : shards_) shards.emplace_back(name, s);
      }
      for (auto& [table, s] : shards) FailIfLate(table, *s);
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
  absl::Mutex checkpoint_mu_;
  std::thread watchdog_;
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
absl::StatusOr<std::string> ParameterServer::Checkpoint() { return impl_->Checkpoint(); }

}  // namespace gw::param_server
