#include "gradwire/param_server/server.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/sharding.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"
#include "shard.h"
#include "wire.h"

namespace gw::param_server {
namespace {

using internal::Shard;
using internal::Waiter;
using rpc::Value;

constexpr size_t kLargeAnswerBytes = 256 << 10;  // see Admit

// Rows `ids` of a sparse shard as one [n, dim] tensor, created on first touch.
// Takes the stripe locks itself (under s.mu or not: asynchronous tables don't hold it).
Tensor ReadRows(Shard& s, const Tensor& ids) {
  const int64_t n = ids.numel();
  Tensor out = Tensor::Empty({n, s.dim});
  const int64_t* id = ids.data<int64_t>();
  float* dst = out.data<float>();
  s.rows->ForEach(reinterpret_cast<const uint64_t*>(id), n, [&](int64_t i, const RowStore::Row& row) {
    std::memcpy(dst + i * s.dim, row.values, static_cast<size_t>(s.dim) * sizeof(float));
  });
  return out;
}

// Applies summed gradient rows, each scaled by `scale`, to a sparse shard.
void ApplyRows(Shard& s, internal::RowSum& sum, float scale) {
  s.rows->ForEach(sum.ids.data(), static_cast<int64_t>(sum.ids.size()), [&](int64_t i, const RowStore::Row& row) {
    float* g = sum.values.data() + i * s.dim;
    if (scale != 1.0f) {
      for (int64_t j = 0; j < s.dim; ++j) g[j] *= scale;
    }
    optim::UpdateRow(s.optimizer, s.dim, row.values, g, row.state, *row.step);
  });
  sum.Clear();
}

// Applies one push: rows of duplicate ids are summed first (a few per push of random
// ids), the others are applied straight from the received gradient without a copy.
void ApplyPush(Shard& s, const Tensor& ids, const Tensor& grad) {
  const int64_t n = ids.numel(), dim = s.dim;
  const uint64_t* id = reinterpret_cast<const uint64_t*>(ids.data<int64_t>());
  const float* g = grad.data<float>();
  absl::flat_hash_map<uint64_t, int64_t> first;  // id -> position among the unique ids
  first.reserve(static_cast<size_t>(n));
  std::vector<uint64_t> unique;
  std::vector<const float*> rows;
  unique.reserve(static_cast<size_t>(n));
  rows.reserve(static_cast<size_t>(n));
  absl::flat_hash_map<int64_t, std::vector<float>> sums;  // unique position -> summed row
  for (int64_t i = 0; i < n; ++i) {
    auto [it, fresh] = first.try_emplace(id[i], static_cast<int64_t>(unique.size()));
    if (fresh) {
      unique.push_back(id[i]);
      rows.push_back(g + i * dim);
      continue;
    }
    const size_t k = static_cast<size_t>(it->second);
    auto [sum, new_sum] = sums.try_emplace(it->second);
    if (new_sum) sum->second.assign(rows[k], rows[k] + dim);
    for (int64_t j = 0; j < dim; ++j) sum->second[static_cast<size_t>(j)] += g[i * dim + j];
    rows[k] = sum->second.data();  // node-stable: flat_hash_map moves the vector, not its buffer
  }
  s.rows->ForEach(unique.data(), static_cast<int64_t>(unique.size()), [&](int64_t i, const RowStore::Row& row) {
    optim::UpdateRow(s.optimizer, dim, row.values, rows[static_cast<size_t>(i)], row.state, *row.step);
  });
}

}  // namespace

namespace internal {

StripedRows::StripedRows(int64_t dim, int state_size, int64_t capacity, RowInit init) {
  // The capacity is shared exactly: the first capacity % kStripes stripes hold one more.
  for (int k = 0; k < kStripes; ++k) {
    const int64_t share = capacity == 0 ? 0 : capacity / kStripes + (k < capacity % kStripes ? 1 : 0);
    // A stripe whose share is 0 (capacity < kStripes) still holds one row: RowStore's 0
    // means unbounded.
    stripes_.push_back(std::make_unique<Stripe>(dim, state_size, capacity == 0 ? 0 : std::max<int64_t>(share, 1), init));
  }
}

// The top bits of the id's hash: independent of ServerOfId's residue and of RowStore's index.
int StripedRows::StripeOf(uint64_t id) { return static_cast<int>(MixId(id) >> 61); }
static_assert(StripedRows::kStripes == 8, "StripeOf takes 3 bits");

void StripedRows::Visit(const std::function<void(uint64_t, const RowStore::Row&)>& fn) const {
  for (const auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    stripe->rows.ForEach(fn);
  }
}

SparseShardStats StripedRows::stats() const {
  SparseShardStats total;
  for (const auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    total.rows += stripe->rows.size();
    total.evictions += stripe->rows.evictions();
    total.bytes += static_cast<int64_t>(stripe->rows.bytes());
    total.raw_bytes += static_cast<int64_t>(stripe->rows.raw_bytes());
  }
  return total;
}

void RowSum::Add(const Tensor& ids_tensor, const Tensor& grad, int64_t dim) {
  const int64_t n = ids_tensor.numel();
  const int64_t* id = ids_tensor.data<int64_t>();
  const float* g = grad.data<float>();
  offset.reserve(offset.size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = static_cast<uint64_t>(id[i]);
    auto [it, fresh] = offset.try_emplace(key, static_cast<int64_t>(ids.size()));
    if (fresh) {
      ids.push_back(key);
      values.insert(values.end(), g + i * dim, g + (i + 1) * dim);
    } else {
      float* dst = values.data() + it->second * dim;
      for (int64_t j = 0; j < dim; ++j) dst[j] += g[i * dim + j];
    }
  }
}

void RowSum::Clear() {
  offset.clear();
  ids.clear();
  values.clear();
}

}  // namespace internal

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

  // Loads the latest checkpoint, if any, then registers the handlers (which keep the
  // server alive as long as the agent has them).
  absl::Status Start() {
    if (absl::Status s = LoadCheckpoint(); !s.ok()) return s;
    auto self = shared_from_this();
    for (absl::Status s : {
             agent_.Register(kCreateFn,
                             [self](std::string table, Tensor values, Value optimizer, int64_t consistency,
                                    int64_t trainers, int64_t timeout_ms, int64_t staleness) {
                               return self->CreateDense(table, values, optimizer, consistency, trainers, timeout_ms,
                                                        staleness);
                             }),
             agent_.Register(kCreateSparseFn,
                             [self](std::string table, Value layout, Value optimizer, int64_t consistency,
                                    int64_t trainers, int64_t timeout_ms, int64_t staleness) {
                               return self->CreateSparse(table, layout, optimizer, consistency, trainers, timeout_ms,
                                                         staleness);
                             }),
             agent_.Register(kPullFn, [self](std::string table, int64_t clock) { return self->Pull(table, clock); }),
             agent_.Register(kPushFn, [self](std::string table, int64_t clock, int64_t trainer, Tensor grad) {
               return self->Push(table, clock, trainer, grad);
             }),
             agent_.Register(kPullRowsFn, [self](std::string table, int64_t clock, Tensor ids) {
               return self->PullRows(table, clock, ids);
             }),
             agent_.Register(kPushRowsFn, [self](std::string table, int64_t clock, int64_t trainer, Tensor ids,
                                                 Tensor grad) { return self->PushRows(table, clock, trainer, ids, grad); }),
             agent_.Register(kPushPullManyFn,
                             [self](std::vector<std::string> tables, int64_t clock, int64_t trainer,
                                    std::vector<Tensor> grads) { return self->PushPullMany(tables, clock, trainer, grads); }),
             agent_.Register(kCheckpointFn, [self]() { return self->Checkpoint(); }),
             agent_.Register(kShardRRefFn, [self](std::string table) { return self->ShardRRef(table); }),
         }) {
      if (!s.ok()) return s;
    }
    watchdog_ = std::thread([this] { Watch(); });
    return absl::OkStatus();
  }

  size_t num_shards() const {
    absl::MutexLock lock(&mu_);
    return shards_.size();
  }

  absl::StatusOr<SparseShardStats> sparse_stats(const std::string& table) const {
    absl::StatusOr<std::shared_ptr<Shard>> found = Find(table);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    absl::MutexLock lock(&s.mu);
    if (!s.sparse) return absl::InvalidArgumentError(absl::StrCat("table '", table, "' is dense"));
    return s.rows->stats();
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

  // Checks shared by both kinds of table; the shard is not shared yet.
  static absl::Status Configure(Shard& s, const Value& optimizer, int64_t consistency, int64_t trainers,
                                int64_t timeout_ms, int64_t staleness) {
    absl::StatusOr<optim::OptimizerConfig> config = ConfigFromValue(optimizer);
    if (!config.ok()) return config.status();
    try {
      optim::Validate(*config);
    } catch (const gw::Error& e) {
      return absl::InvalidArgumentError(e.what());
    }
    if (consistency < 0 || consistency > 2) return absl::InvalidArgumentError("unknown consistency mode");
    if (staleness < 0) return absl::InvalidArgumentError("staleness must not be negative");
    if (trainers < 1 || trainers > internal::kMaxTrainers) {
      return absl::InvalidArgumentError(absl::StrCat("trainers must be in [1, ", internal::kMaxTrainers, "], got ", trainers));
    }
    s.optimizer = *config;
    s.consistency = static_cast<Consistency>(consistency);
    s.trainers = static_cast<int>(trainers);
    s.sync_timeout = absl::Milliseconds(timeout_ms);
    s.staleness = staleness;
    s.clocks.assign(static_cast<size_t>(trainers), 0);
    return absl::OkStatus();
  }

  // A table created again (by another trainer, or after a restart) must ask for the
  // same consistency, trainers and staleness: a silent mismatch would hang its steps.
  absl::Status SameMode(const std::string& table, const Shard& old, int64_t consistency, int64_t trainers,
                        int64_t staleness) const {
    if (static_cast<int64_t>(old.consistency) == consistency && old.trainers == trainers &&
        (old.consistency != Consistency::kBoundedStaleness || old.staleness == staleness)) {
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(absl::StrCat(
        "table '", table, "' exists on ", name_, " with consistency ", static_cast<int>(old.consistency), ", ",
        old.trainers, " trainers and staleness ", old.staleness, "; asked for consistency ", consistency, ", ",
        trainers, " trainers and staleness ", staleness, " (restarted with another deployment? move its checkpoint away)"));
  }

  // Adds a configured shard unless the table exists; `same` says whether an existing
  // one is compatible (another trainer created it first, or it was restored).
  absl::Status Add(const std::string& table, std::unique_ptr<Shard> shard,
                   const std::function<absl::Status(const Shard&)>& same) {
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(table);
    if (it != shards_.end()) return same(*it->second);
    shards_[table] = std::move(shard);
    return absl::OkStatus();
  }

  absl::Status CreateDense(const std::string& table, const Tensor& values, const Value& optimizer,
                           int64_t consistency, int64_t trainers, int64_t timeout_ms, int64_t staleness) {
    if (values.dim() != 1 || values.dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "': a shard must be a 1-D float32 tensor"));
    }
    auto shard = std::make_unique<Shard>();
    if (absl::Status s = Configure(*shard, optimizer, consistency, trainers, timeout_ms, staleness); !s.ok()) return s;
    shard->values = kernels::Clone(values);
    return Add(table, std::move(shard), [&](const Shard& old) {
      if (absl::Status same = SameMode(table, old, consistency, trainers, staleness); !same.ok()) return same;
      if (old.sparse || old.values.numel() != values.numel()) {
        return absl::AlreadyExistsError(absl::StrCat("table '", table, "' exists on ", name_, " as ",
                                                     old.sparse ? "a sparse table" : "a dense shard of ",
                                                     old.sparse ? "" : absl::StrCat(old.values.numel(), " keys"),
                                                     ", not a dense shard of ", values.numel(), " keys"));
      }
      return absl::OkStatus();
    });
  }

  // layout: {"dim": int, "capacity": int, "init": int (RowInit::Kind), "a": double,
  // "b": double, "seed": int}
  absl::Status CreateSparse(const std::string& table, const Value& layout, const Value& optimizer,
                            int64_t consistency, int64_t trainers, int64_t timeout_ms, int64_t staleness) {
    auto shard = std::make_unique<Shard>();
    if (absl::Status s = Configure(*shard, optimizer, consistency, trainers, timeout_ms, staleness); !s.ok()) return s;
    absl::StatusOr<SparseLayout> l = LayoutFromValue(layout);
    if (!l.ok()) return l.status();
    if (l->dim < 1 || l->dim > internal::kMaxRowWidth || l->capacity < 0 ||
        l->capacity > internal::StripedRows::kMaxCapacity || static_cast<int>(l->init.kind) < 0 ||
        static_cast<int>(l->init.kind) > 2) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table '", table, "': bad layout (dim ", l->dim,
                                                     ", capacity ", l->capacity, ")"));
    }
    shard->sparse = true;
    shard->dim = l->dim;
    shard->capacity = l->capacity;
    shard->init = l->init;
    shard->rows = std::make_unique<internal::StripedRows>(l->dim, optim::RowStateSize(shard->optimizer), l->capacity, l->init);
    return Add(table, std::move(shard), [&](const Shard& old) {
      if (absl::Status same = SameMode(table, old, consistency, trainers, staleness); !same.ok()) return same;
      if (!old.sparse || old.dim != l->dim) {
        return absl::AlreadyExistsError(absl::StrCat("table '", table, "' exists on ", name_, " and is not a sparse table of width ", l->dim));
      }
      return absl::OkStatus();
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
    if (found.ok() && (*found)->sparse != sparse) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "' on ", name_, " is ",
                                                     sparse ? "dense: use Pull/Push" : "sparse: use PullRows/PushRows"));
    }
    return found;
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

  // Serves `read` now if `clock` is readable, else when it becomes so.
  Future<Value> PullWhenReadable(Shard& s, int64_t clock, std::function<Value()> read) {
    // Sparse rows have their own locks (StripedRows); asynchronous pulls never wait.
    if (s.sparse && s.consistency == Consistency::kAsync) return MakeReadyFuture<Value>(agent_.executor(), read());
    absl::MutexLock lock(&s.mu);
    if (s.consistency == Consistency::kAsync || Readable(s, clock)) {
      return MakeReadyFuture<Value>(agent_.executor(), read());
    }
    Promise<Value> answer(agent_.executor());
    s.waiting.push_back({clock, answer, std::move(read)});
    if (s.step_deadline == absl::InfiniteFuture()) s.step_deadline = absl::Now() + s.sync_timeout;
    return answer.future();
  }

  Future<Value> Pull(const std::string& table, int64_t clock) {
    absl::StatusOr<std::shared_ptr<Shard>> shard = FindKind(table, false);
    if (!shard.ok()) return MakeReadyFuture<Value>(agent_.executor(), shard.status());
    Shard* s = shard->get();
    // kSync: the values change again only when every trainer has pushed the next step,
    // which each does after receiving this answer, so they may travel without a copy.
    return PullWhenReadable(*s, clock, [s]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return Value(s->consistency == Consistency::kSync ? s->values : kernels::Clone(s->values));
    });
  }

  Future<Value> PullRows(const std::string& table, int64_t clock, const Tensor& ids) {
    absl::StatusOr<std::shared_ptr<Shard>> shard = FindKind(table, true);
    if (!shard.ok()) return MakeReadyFuture<Value>(agent_.executor(), shard.status());
    if (ids.dim() != 1 || ids.dtype() != DType::kInt64) {
      return MakeReadyFuture<Value>(agent_.executor(), absl::InvalidArgumentError(absl::StrCat(
                                                           "table '", table, "': ids must be a 1-D int64 tensor, got ",
                                                           DTypeName(ids.dtype()), " ", ShapeToString(ids.sizes()))));
    }
    Shard* s = shard->get();
    const Tensor contiguous = kernels::Contiguous(ids);
    return PullWhenReadable(*s, clock, [s, contiguous]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return Value(ReadRows(*s, contiguous));
    });
  }

  // Whether a pull for `clock` may be served (kSync: that step was applied; bounded
  // staleness: every trainer has reached clock - staleness).
  static bool Readable(const Shard& s, int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (s.consistency == Consistency::kBoundedStaleness) {
      return *std::min_element(s.clocks.begin(), s.clocks.end()) >= clock - s.staleness;
    }
    return s.applied >= clock;
  }

  // Answers the waiting pulls that became readable: (answer, value read now).
  static std::vector<std::pair<Promise<Value>, Value>> Released(Shard& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    std::vector<std::pair<Promise<Value>, Value>> ready;
    auto split = std::partition(s.waiting.begin(), s.waiting.end(), [&](const Waiter& w) { return !Readable(s, w.clock); });
    for (auto it = split; it != s.waiting.end(); ++it) ready.emplace_back(it->answer, it->read());
    s.waiting.erase(split, s.waiting.end());
    if (s.waiting.empty()) {
      s.step_deadline = absl::InfiniteFuture();
    } else if (!ready.empty() && s.consistency == Consistency::kBoundedStaleness) {
      s.step_deadline = absl::Now() + s.sync_timeout;  // progress: the slowest moved on
    }
    return ready;
  }

  // ---------------------------------------------------------------- pushes

  // What a push does to its shard, by consistency mode.
  struct PushOps {
    std::function<void()> accumulate;  // kSync: add to the open step
    std::function<void()> apply_step;  // kSync: apply the open step's mean, reset it
    std::function<void()> apply_now;   // otherwise: apply this push
    std::function<void()> drop_step;   // kSync: forget the open step's pushes
  };

  // Runs a push through the shard's consistency mode and answers the pulls it released.
  absl::Status Admit(const std::string& table, Shard& s, int64_t clock, int64_t trainer,
                     const std::function<absl::Status()>& check, const PushOps& ops) {
    if (s.sparse && s.consistency == Consistency::kAsync) {
      // Nothing waits on an asynchronous table and its rows have their own locks: pushes
      // run in parallel with each other and with pulls.
      try {
        ops.apply_now();
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat("table '", table, "' on ", name_, ": ", e.what()));
      }
      return absl::OkStatus();
    }
    std::vector<std::pair<Promise<Value>, Value>> ready;
    absl::Status status;
    {
      absl::MutexLock lock(&s.mu);
      if (absl::Status c = check(); !c.ok()) return c;
      if (s.consistency != Consistency::kAsync && (trainer < 0 || trainer >= s.trainers)) {
        return absl::InvalidArgumentError(absl::StrCat("table '", table, "': no trainer ", trainer, " (the table has ",
                                                       s.trainers, ")"));
      }
      try {
        switch (s.consistency) {
          case Consistency::kSync: status = AddToStep(table, s, clock, static_cast<int>(trainer), ops); break;
          case Consistency::kAsync: ops.apply_now(); break;
          case Consistency::kBoundedStaleness: {
            int64_t& next = s.clocks[static_cast<size_t>(trainer)];
            if (clock >= next) {  // else a retried push already applied
              ops.apply_now();
              next = clock + 1;
            }
            break;
          }
        }
      } catch (const std::exception& e) {  // the pulls it released are answered all the same
        status = absl::InvalidArgumentError(absl::StrCat("table '", table, "' on ", name_, ": ", e.what()));
      }
      ready = Released(s);
    }
    // Large answers go out from the worker pool: sending one copies the values into the
    // transport, and this thread has its own caller to answer, so a step's answers to its
    // trainers are copied in parallel. Small ones are answered here (no hop).
    for (auto& [p, v] : ready) {
      const bool large = v.is<Tensor>() && v.get<Tensor>().nbytes() >= kLargeAnswerBytes;
      // Copied into the task (a handle), so that a refused Post still has it to answer.
      if (!large || !agent_.executor().Post([p = p, v = v]() mutable { p.Set(std::move(v)); })) p.Set(std::move(v));
    }
    return status;
  }

  // kSync: the push joins step `clock`; the last trainer's push applies the mean once.
  absl::Status AddToStep(const std::string& table, Shard& s, int64_t clock, int trainer, const PushOps& ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (clock < s.applied) return absl::OkStatus();  // a retry of a push already applied
    if (clock > s.applied && s.restored) {
      // The server restarted from a checkpoint taken before the trainers' current step:
      // the steps in between (and the checkpoint's open step, which the trainers have
      // passed) were lost with it; join the trainers where they are. Pulls up to `clock`
      // are answered with the checkpoint's values.
      ops.drop_step();
      s.pushed.clear();
      s.applied = clock;
    }
    if (clock != s.applied) {
      return absl::FailedPreconditionError(absl::StrCat("table '", table, "' on ", name_, ": push for step ", clock,
                                                        " while step ", s.applied, " is being aggregated"));
    }
    if (s.pushed.contains(trainer)) return absl::OkStatus();  // a retried push of this step
    ops.accumulate();  // may throw: the trainer is marked as pushed only once it counts
    s.pushed.insert(trainer);
    if (s.step_deadline == absl::InfiniteFuture()) s.step_deadline = absl::Now() + s.sync_timeout;
    if (static_cast<int>(s.pushed.size()) < s.trainers) return absl::OkStatus();
    ops.apply_step();
    ++s.applied;
    s.pushed.clear();
    s.restored = false;
    s.step_deadline = absl::InfiniteFuture();
    return absl::OkStatus();
  }

  absl::Status Push(const std::string& table, int64_t clock, int64_t trainer, const Tensor& grad) {
    absl::StatusOr<std::shared_ptr<Shard>> found = FindKind(table, false);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    auto check = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
      if (grad.sizes() == s.values.sizes() && grad.dtype() == s.values.dtype()) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "' on ", name_, ": gradient of shape ",
                                                     ShapeToString(grad.sizes()), " for a shard of shape ",
                                                     ShapeToString(s.values.sizes())));
    };
    PushOps ops;
    // Received gradients are kept as they are (never written: a caller on this worker
    // may share them). Pushes before the last are summed as they arrive, so that the
    // last one only adds itself while averaging (one pass on the step's critical path).
    ops.accumulate = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      s.pending.push_back(kernels::Contiguous(grad));
      if (s.pending.size() == 2 && static_cast<int>(s.pushed.size()) + 1 < s.trainers) {
        s.pending = {kernels::Add(s.pending[0], s.pending[1])};
      }
    };
    ops.apply_step = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      // The average of the pushes is formed block by block inside the update (one pass).
      // Large shards are updated in ranges on the worker pool too (the trainers wait).
      optim::UpdateWithAverage(s.optimizer, s.values, s.pending, s.trainers, s.state,
                               [this](int64_t n, const std::function<void(int64_t)>& task) {
                                 rpc::ParallelFor(agent_.executor(), n, task);
                               });
      s.pending.clear();
    };
    ops.drop_step = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { s.pending.clear(); };
    ops.apply_now = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { optim::Update(s.optimizer, s.values, grad, s.state); };
    return Admit(table, s, clock, trainer, check, ops);
  }

  absl::Status PushRows(const std::string& table, int64_t clock, int64_t trainer, const Tensor& ids,
                        const Tensor& grad) {
    absl::StatusOr<std::shared_ptr<Shard>> found = FindKind(table, true);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    const int64_t n = ids.numel();
    if (ids.dim() != 1 || ids.dtype() != DType::kInt64 || grad.dtype() != DType::kFloat32 || grad.dim() != 2 ||
        grad.size(0) != n || grad.size(1) != s.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table, "' on ", name_, ": push of ids ", DTypeName(ids.dtype()), " ", ShapeToString(ids.sizes()),
          " and gradient ", DTypeName(grad.dtype()), " ", ShapeToString(grad.sizes()), "; expected int64 [n] and float32 [n, ",
          s.dim, "]"));
    }
    const Tensor id = kernels::Contiguous(ids), g = kernels::Contiguous(grad);
    PushOps ops;
    ops.accumulate = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { s.row_sum.Add(id, g, s.dim); };
    ops.apply_step = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      ApplyRows(s, s.row_sum, 1.0f / static_cast<float>(s.trainers));
    };
    ops.drop_step = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { s.row_sum.Clear(); };
    ops.apply_now = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { ApplyPush(s, id, g); };
    return Admit(table, s, clock, trainer, [] { return absl::OkStatus(); }, ops);
  }

  // Pushes this trainer's gradients for `clock` to several tables and answers with their
  // values as of clock + 1, in one message each way.
  Future<Value> PushPullMany(const std::vector<std::string>& tables, int64_t clock, int64_t trainer,
                             const std::vector<Tensor>& grads) {
    if (tables.size() != grads.size()) {
      return MakeReadyFuture<Value>(agent_.executor(),
                                    absl::InvalidArgumentError("push_pull_many: one gradient per table"));
    }
    for (size_t i = 0; i < tables.size(); ++i) {
      if (absl::Status s = Push(tables[i], clock, trainer, grads[i]); !s.ok()) {
        return MakeReadyFuture<Value>(agent_.executor(), s);
      }
    }
    std::vector<Future<Value>> pulled;
    for (const std::string& table : tables) pulled.push_back(Pull(table, clock + 1));
    Promise<Value> all(agent_.executor());  // answered on the completing thread: no pool hop
    WhenAll(agent_.executor(), std::move(pulled)).Subscribe([all](const absl::StatusOr<std::vector<Value>>& v) {
      all.Set(v.ok() ? absl::StatusOr<Value>(Value(rpc::ValueList(v->begin(), v->end())))
                     : absl::StatusOr<Value>(v.status()));
    });
    return all.future();
  }

  // ---------------------------------------------------------------- background

  // Fails synchronous steps that did not complete in time, naming who did not push, and
  // writes the periodic checkpoints.
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
    std::vector<Promise<Value>> failed;
    absl::Status why;
    {
      absl::MutexLock lock(&s.mu);
      if (absl::Now() < s.step_deadline) return;
      int64_t needed = 0;  // kBoundedStaleness: the clock every trainer must reach
      for (const Waiter& w : s.waiting) needed = std::max(needed, w.clock - s.staleness);
      std::vector<std::string> missing;
      for (int t = 0; t < s.trainers; ++t) {
        const bool behind = s.consistency == Consistency::kBoundedStaleness ? s.clocks[static_cast<size_t>(t)] < needed
                                                                            : !s.pushed.contains(t);
        if (behind) missing.push_back(absl::StrCat("trainer ", t));
      }
      const std::string what = s.consistency == Consistency::kBoundedStaleness
                                   ? absl::StrCat("a bounded-staleness pull (clock ", needed, " needed)")
                                   : absl::StrCat("synchronous step ", s.applied);
      why = absl::DeadlineExceededError(absl::StrCat(what, " of table '", table, "' on ", name_,
                                                     " is missing the push of ", absl::StrJoin(missing, ", "), " after ",
                                                     absl::FormatDuration(s.sync_timeout), " (a trainer is slow or dead)"));
      for (Waiter& w : s.waiting) failed.push_back(w.answer);
      s.waiting.clear();
      s.step_deadline = absl::InfiniteFuture();
    }
    for (auto& p : failed) p.Set(why);
  }

  rpc::Agent& agent_;
  const std::string name_;
  const ServerOptions options_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  absl::Mutex checkpoint_mu_;
  std::thread watchdog_;
};

absl::StatusOr<std::shared_ptr<ParameterServer>> ParameterServer::Install(rpc::Agent& agent, ServerOptions options) {
  auto impl = std::make_shared<Impl>(agent, std::move(options));
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::shared_ptr<ParameterServer>(new ParameterServer(std::move(impl)));
}

ParameterServer::~ParameterServer() = default;
size_t ParameterServer::num_shards() const { return impl_->num_shards(); }
absl::StatusOr<SparseShardStats> ParameterServer::sparse_stats(const std::string& table) const {
  return impl_->sparse_stats(table);
}
absl::StatusOr<std::string> ParameterServer::Checkpoint() { return impl_->Checkpoint(); }

}  // namespace gw::param_server
