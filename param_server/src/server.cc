#include "gradwire/param_server/server.h"

#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gradwire/optim/functional.h"
#include "gradwire/tensor/error.h"
#include "gradwire/tensor/kernels.h"
#include "wire.h"

namespace gw::param_server {
namespace {

using rpc::Value;

// One table's shard on this server.
struct Shard {
  explicit Shard(rpc::Executor& ex) : executor(ex) {}
  rpc::Executor& executor;
  absl::Mutex mu;
  Tensor values;  // 1-D float32, the shard's key range
  optim::OptimizerConfig optimizer;
  optim::ParamState state;
  Consistency consistency = Consistency::kSync;
  int trainers = 1;
  int64_t staleness = 0;  // kBoundedStaleness
  absl::Duration sync_timeout;
  std::vector<int64_t> clocks ABSL_GUARDED_BY(mu);  // kBoundedStaleness: pushes per trainer
  // kSync: steps applied; a pull for clock c is served once applied >= c.
  int64_t applied ABSL_GUARDED_BY(mu) = 0;
  Tensor sum ABSL_GUARDED_BY(mu);  // pushes of step `applied` so far
  std::set<int> pushed ABSL_GUARDED_BY(mu);
  absl::Time step_deadline ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  std::vector<std::pair<int64_t, Promise<Value>>> waiting ABSL_GUARDED_BY(mu);  // pulls: clock, answer
};

}  // namespace

class ParameterServer::Impl : public std::enable_shared_from_this<ParameterServer::Impl> {
 public:
  explicit Impl(rpc::Agent& agent) : agent_(agent), name_(agent.self().name) {
    watchdog_ = std::thread([this] { Watch(); });
  }
  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    watchdog_.join();
  }

  // Handlers keep the server alive as long as the agent has them.
  absl::Status Register() {
    auto self = shared_from_this();
    for (absl::Status s : {
             agent_.Register(kCreateFn,
                             [self](std::string table, Tensor values, Value optimizer, int64_t consistency,
                                    int64_t trainers, int64_t timeout_ms, int64_t staleness) {
                               return self->Create(table, values, optimizer, consistency, trainers, timeout_ms,
                                                   staleness);
                             }),
             agent_.Register(kPullFn, [self](std::string table, int64_t clock) { return self->Pull(table, clock); }),
             agent_.Register(kPushFn, [self](std::string table, int64_t clock, int64_t trainer, Tensor grad) {
               return self->Push(table, clock, trainer, grad);
             }),
             agent_.Register(kPushPullManyFn,
                             [self](std::vector<std::string> tables, int64_t clock, int64_t trainer,
                                    std::vector<Tensor> grads) { return self->PushPullMany(tables, clock, trainer, grads); }),
         }) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  size_t num_shards() const {
    absl::MutexLock lock(&mu_);
    return shards_.size();
  }

 private:
  absl::Status Create(const std::string& table, const Tensor& values, const Value& optimizer, int64_t consistency,
                      int64_t trainers, int64_t timeout_ms, int64_t staleness) {
    absl::StatusOr<optim::OptimizerConfig> config = ConfigFromValue(optimizer);
    if (!config.ok()) return config.status();
    if (values.dim() != 1 || values.dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "': a shard must be a 1-D float32 tensor"));
    }
    if (consistency < 0 || consistency > 2) return absl::InvalidArgumentError("unknown consistency mode");
    if (staleness < 0) return absl::InvalidArgumentError("staleness must not be negative");
    if (trainers < 1) return absl::InvalidArgumentError("trainers must be at least 1");
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(table);
    if (it != shards_.end()) {
      if (it->second->values.numel() != values.numel()) {
        return absl::AlreadyExistsError(absl::StrCat("table '", table, "' exists on ", name_, " with ",
                                                     it->second->values.numel(), " keys, not ", values.numel()));
      }
      return absl::OkStatus();  // another trainer created it first
    }
    auto shard = std::make_shared<Shard>(agent_.executor());
    shard->values = kernels::Clone(values);
    shard->optimizer = *config;
    shard->consistency = static_cast<Consistency>(consistency);
    shard->trainers = static_cast<int>(trainers);
    shard->sync_timeout = absl::Milliseconds(timeout_ms);
    shard->staleness = staleness;
    {
      absl::MutexLock shard_lock(&shard->mu);
      shard->clocks.assign(static_cast<size_t>(trainers), 0);
    }
    shards_[table] = std::move(shard);
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Shard>> Find(const std::string& table) const {
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(table);
    if (it == shards_.end()) return absl::NotFoundError(absl::StrCat(name_, " has no table '", table, "'"));
    return it->second;
  }

  Future<Value> Pull(const std::string& table, int64_t clock) {
    absl::StatusOr<std::shared_ptr<Shard>> shard = Find(table);
    if (!shard.ok()) return MakeReadyFuture<Value>(agent_.executor(), shard.status());
    Shard& s = **shard;
    absl::MutexLock lock(&s.mu);
    if (s.consistency == Consistency::kAsync || Readable(s, clock)) {
      return MakeReadyFuture<Value>(agent_.executor(), Value(kernels::Clone(s.values)));
    }
    Promise<Value> answer(agent_.executor());
    s.waiting.emplace_back(clock, answer);
    if (s.step_deadline == absl::InfiniteFuture()) s.step_deadline = absl::Now() + s.sync_timeout;
    return answer.future();
  }

  // Whether a pull for `clock` may be served (kSync: that step was applied; bounded
  // staleness: every trainer has reached clock - staleness).
  static bool Readable(const Shard& s, int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (s.consistency == Consistency::kBoundedStaleness) {
      return *std::min_element(s.clocks.begin(), s.clocks.end()) >= clock - s.staleness;
    }
    return s.applied >= clock;
  }

  // Answers the waiting pulls that became readable.
  static std::vector<Promise<Value>> Released(Shard& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    std::vector<Promise<Value>> ready;
    auto split = std::partition(s.waiting.begin(), s.waiting.end(), [&](const auto& w) { return !Readable(s, w.first); });
    for (auto it = split; it != s.waiting.end(); ++it) ready.push_back(it->second);
    s.waiting.erase(split, s.waiting.end());
    if (s.waiting.empty()) s.step_deadline = absl::InfiniteFuture();
    return ready;
  }

  absl::Status Push(const std::string& table, int64_t clock, int64_t trainer, const Tensor& grad) {
    absl::StatusOr<std::shared_ptr<Shard>> found = Find(table);
    if (!found.ok()) return found.status();
    Shard& s = **found;
    std::vector<Promise<Value>> ready;
    Tensor snapshot;
    absl::Status status;
    {
      absl::MutexLock lock(&s.mu);
      if (grad.sizes() != s.values.sizes() || grad.dtype() != s.values.dtype()) {
        return absl::InvalidArgumentError(absl::StrCat("table '", table, "' on ", name_, ": gradient of shape ",
                                                       ShapeToString(grad.sizes()), " for a shard of shape ",
                                                       ShapeToString(s.values.sizes())));
      }
      if (s.consistency != Consistency::kAsync && (trainer < 0 || trainer >= s.trainers)) {
        return absl::InvalidArgumentError(absl::StrCat("table '", table, "': no trainer ", trainer));
      }
      try {
        status = s.consistency == Consistency::kSync ? AddToStep(table, s, clock, static_cast<int>(trainer), grad)
                                                     : ApplyNow(s, static_cast<int>(trainer), grad);
      } catch (const gw::Error& e) {
        status = absl::InvalidArgumentError(e.what());
      }
      ready = Released(s);
      // kSync: the values change again only when every trainer has pushed the next step,
      // which each does after receiving this answer, so they may travel without a copy.
      if (!ready.empty()) snapshot = s.consistency == Consistency::kSync ? s.values : kernels::Clone(s.values);
    }
    for (auto& p : ready) p.Set(Value(snapshot));
    return status;
  }

  // kAsync and kBoundedStaleness: the push applies at once and advances its trainer's clock.
  static absl::Status ApplyNow(Shard& s, int trainer, const Tensor& grad) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    optim::Update(s.optimizer, s.values, grad, s.state);
    if (s.consistency == Consistency::kBoundedStaleness) ++s.clocks[static_cast<size_t>(trainer)];
    return absl::OkStatus();
  }

  // kSync: the push joins step `clock`; the last trainer's push applies the mean once.
  absl::Status AddToStep(const std::string& table, Shard& s, int64_t clock, int trainer, const Tensor& grad)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    if (clock != s.applied) {
      return absl::FailedPreconditionError(absl::StrCat("table '", table, "' on ", name_, ": push for step ", clock,
                                                        " while step ", s.applied, " is being aggregated"));
    }
    if (!s.pushed.insert(trainer).second) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table, "': trainer ", trainer, " pushed step ", clock,
                                                     " twice"));
    }
    if (s.sum.defined()) {
      kernels::AddInPlace(s.sum, grad);
    } else {
      s.sum = kernels::Clone(grad);
    }
    if (s.step_deadline == absl::InfiniteFuture()) s.step_deadline = absl::Now() + s.sync_timeout;
    if (static_cast<int>(s.pushed.size()) < s.trainers) return absl::OkStatus();
    kernels::ScaleInPlace(s.sum, 1.0 / s.trainers);  // the mean gradient
    optim::Update(s.optimizer, s.values, s.sum, s.state);
    ++s.applied;
    s.sum = Tensor();
    s.pushed.clear();
    s.step_deadline = absl::InfiniteFuture();
    return absl::OkStatus();
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

  // Fails synchronous steps that did not complete in time, naming who did not push.
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
      for (auto& [table, s] : shards) {
        std::vector<Promise<Value>> failed;
        absl::Status why;
        {
          absl::MutexLock lock(&s->mu);
          if (absl::Now() < s->step_deadline) continue;
          int64_t needed = 0;  // kBoundedStaleness: the clock every trainer must reach
          for (const auto& [clock, p] : s->waiting) needed = std::max(needed, clock - s->staleness);
          std::vector<std::string> missing;
          for (int t = 0; t < s->trainers; ++t) {
            const bool behind = s->consistency == Consistency::kBoundedStaleness
                                    ? s->clocks[static_cast<size_t>(t)] < needed
                                    : !s->pushed.contains(t);
            if (behind) missing.push_back(absl::StrCat("trainer ", t));
          }
          const std::string what = s->consistency == Consistency::kBoundedStaleness
                                       ? absl::StrCat("a bounded-staleness pull (clock ", needed, " needed)")
                                       : absl::StrCat("synchronous step ", s->applied);
          why = absl::DeadlineExceededError(absl::StrCat(
              what, " of table '", table, "' on ", name_, " is missing the push of ", absl::StrJoin(missing, ", "),
              " after ", absl::FormatDuration(s->sync_timeout), " (a trainer is slow or dead)"));
          for (auto& [clock, p] : s->waiting) failed.push_back(p);
          s->waiting.clear();
          s->step_deadline = absl::InfiniteFuture();
        }
        for (auto& p : failed) p.Set(why);
      }
    }
  }

  rpc::Agent& agent_;
  const std::string name_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;
};

absl::StatusOr<std::shared_ptr<ParameterServer>> ParameterServer::Install(rpc::Agent& agent) {
  auto impl = std::make_shared<Impl>(agent);
  if (absl::Status s = impl->Register(); !s.ok()) return s;
  return std::shared_ptr<ParameterServer>(new ParameterServer(std::move(impl)));
}

ParameterServer::~ParameterServer() = default;
size_t ParameterServer::num_shards() const { return impl_->num_shards(); }

}  // namespace gw::param_server
