#include "gradwire/serve/serving.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/rpc/trace.h"
#include "messages.h"
#include "replica_directory.h"

namespace gw::serve {

using rpc::CallInfo;

namespace {

// How long Serve and Stop wait for each worker to acknowledge the change.
constexpr absl::Duration kAnnounceTimeout = absl::Seconds(10);

// One model hosted here: its batcher and the module current for new batches.
struct Hosted {
  struct Current {
    std::shared_ptr<nn::Module> module;
    std::string version;
  };
  ModelConfig config;
  absl::Mutex mu;
  std::shared_ptr<const Current> current ABSL_GUARDED_BY(mu);
  std::unique_ptr<Batcher> batcher;  // set once, before the model is visible

  std::shared_ptr<const Current> Snapshot() {
    absl::MutexLock lock(&mu);
    return current;
  }
};

}  // namespace

class Serving::Impl : public std::enable_shared_from_this<Serving::Impl> {
 public:
  explicit Impl(rpc::Agent& agent) : agent_(agent), self_(agent.self().name) {
    state_.worker = self_;
    state_.incarnation = absl::ToUnixNanos(absl::Now());
  }
  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      agent_closed_ = true;  // whoever drops the last reference, the agent is not called from here
    }
    StopAll();
  }

  absl::Status Start() {
    std::weak_ptr<Impl> weak = weak_from_this();
    // Every handler holds `self`; the agent destroys its handlers when it closes, which
    // tells this layer that the agent is about to go (nothing may call it afterwards).
    auto self = std::shared_ptr<Impl>(shared_from_this().get(), [keep = shared_from_this()](Impl* impl) {
      impl->AgentClosed();
    });
    for (absl::Status s : {
             agent_.Handle<internal::PredictMessage>(
                 [self](const CallInfo&, internal::PredictMessage m) { return self->Predict(std::move(m)); },
                 {.mode = rpc::HandlerMode::kInline}),
             agent_.Handle<internal::ModelsQuery>(
                 [self](const CallInfo&, const internal::ModelsQuery&) { return self->State(); },
                 {.mode = rpc::HandlerMode::kInline}),
             agent_.Handle<internal::ReplicaAnnounce>(
                 [self](const CallInfo&, const internal::ReplicaAnnounce& m) {
                   self->directory_.Apply(m.state.worker, m.state);
                   return absl::OkStatus();
                 },
                 {.mode = rpc::HandlerMode::kInline}),
             agent_.Handle<internal::StatsQuery>(
                 [self](const CallInfo&, const internal::StatsQuery& m) { return self->Stats(m.model); },
                 {.mode = rpc::HandlerMode::kInline}),
         }) {
      if (!s.ok()) return s;
    }
    // The handle is the last member: dropped first, so a collect never sees a member gone.
    statistics_ = agent_.statistics().Add("serve", [this](std::vector<rpc::Sample>& out) {
      for (const std::string& model : models()) {
        if (absl::StatusOr<ModelStats> s = Stats(model); s.ok()) AppendSamples(*s, out);
      }
    });
    peer_watch_ = agent_.WatchPeers([weak, this](int rank) {
      if (auto alive = weak.lock()) {
        if (rank >= 0 && rank < static_cast<int>(agent_.workers().size())) {
          directory_.MarkDead(agent_.workers()[static_cast<size_t>(rank)].name);
        }
      }
    });
    return absl::OkStatus();
  }

  absl::Status Serve(ModelConfig config, std::shared_ptr<nn::Module> module, std::string version) {
    if (!module) return absl::InvalidArgumentError(absl::StrCat("Serve '", config.name, "': no module (null)"));
    if (config.name.empty()) return absl::InvalidArgumentError("Serve: the model needs a name (ModelConfig::name)");
    if (config.batching.max_batch_size < 1 || config.batching.max_queue < 1) {
      return absl::InvalidArgumentError(absl::StrCat("Serve '", config.name,
                                                     "': max_batch_size and max_queue must be at least 1"));
    }
    auto hosted = std::make_shared<Hosted>();
    hosted->config = config;
    {
      absl::MutexLock lock(&hosted->mu);
      hosted->current = std::make_shared<const Hosted::Current>(Hosted::Current{std::move(module), std::move(version)});
    }
    Hosted* raw = hosted.get();
    // Each batch is a slice of the trace (rpc/trace.h) on the batcher's thread.
    rpc::Tracer* tracer = &agent_.tracer();
    const rpc::Tracer::Name category = tracer->Intern("serve"),
                            name = tracer->Intern(absl::StrCat("batch of ", config.name)),
                            rows = tracer->Intern("rows");
    hosted->batcher = std::make_unique<Batcher>(
        config.name, self_, config.input_shape, config.dtype, config.batching,
        [raw, tracer, category, name, rows](const Tensor& batch) -> absl::StatusOr<Prediction> {
          rpc::Tracer::Scope span(*tracer, category, name);
          span.span().arg_names[0] = rows;
          span.span().arg_values[0] = batch.dim() > 0 ? batch.size(0) : 1;
          const std::shared_ptr<const Hosted::Current> current = raw->Snapshot();
          autograd::NoGradGuard no_grad;
          return Prediction{current->module->Forward(batch), current->version, {}};
        });
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return absl::CancelledError(absl::StrCat(self_, " is shutting down: cannot serve '", config.name, "'"));
      if (models_.count(config.name) != 0) {
        return absl::AlreadyExistsError(absl::StrCat("model '", config.name, "' is already served on ", self_,
                                                     " (Swap replaces its module)"));
      }
      models_[config.name] = std::move(hosted);
    }
    Announce();
    return absl::OkStatus();
  }

  absl::Status Swap(const std::string& model, std::shared_ptr<nn::Module> module, std::string version) {
    if (!module) return absl::InvalidArgumentError(absl::StrCat("Swap '", model, "': no module (null)"));
    absl::StatusOr<std::shared_ptr<Hosted>> hosted = Find(model);
    if (!hosted.ok()) return hosted.status();
    auto next = std::make_shared<const Hosted::Current>(Hosted::Current{std::move(module), std::move(version)});
    absl::MutexLock lock(&(*hosted)->mu);
    (*hosted)->current = std::move(next);
    return absl::OkStatus();
  }

  absl::Status LoadVersion(const std::string& model, const std::string& path, std::string version) {
    return SwapInFresh(model, absl::StrCat("from ", path), [&](nn::Module& m) { return m.Load(path); }, std::move(version));
  }

  absl::StatusOr<std::vector<std::pair<std::string, Shape>>> ParameterShapes(const std::string& model) {
    absl::StatusOr<std::shared_ptr<Hosted>> hosted = Find(model);
    if (!hosted.ok()) return hosted.status();
    std::vector<std::pair<std::string, Shape>> shapes;
    for (const auto& [name, p] : (*hosted)->Snapshot()->module->NamedParameters()) shapes.emplace_back(name, p.sizes());
    return shapes;
  }

  absl::Status LoadParameters(const std::string& model, const nn::NamedTensors& state, std::string version) {
    return SwapInFresh(model, absl::StrCat("version ", version), [&](nn::Module& m) { return m.LoadStateDict(state); },
                       std::move(version));
  }

  // A fresh module from the model's factory, filled by `fill`, swapped in; what fails
  // leaves the served version untouched.
  absl::Status SwapInFresh(const std::string& model, const std::string& source,
                           const std::function<absl::Status(nn::Module&)>& fill, std::string version) {
    absl::StatusOr<std::shared_ptr<Hosted>> hosted = Find(model);
    if (!hosted.ok()) return hosted.status();
    if (!(*hosted)->config.factory) {
      return absl::FailedPreconditionError(absl::StrCat("loading '", model, "' ", source, " on ", self_,
                                                        ": the model was served without ModelConfig::factory"));
    }
    std::shared_ptr<nn::Module> module = (*hosted)->config.factory();
    if (!module) return absl::FailedPreconditionError(absl::StrCat("loading '", model, "': the factory made no module"));
    if (absl::Status s = fill(*module); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("loading '", model, "' ", source, " (", self_,
                                                 " keeps serving its current version): ", s.message()));
    }
    return Swap(model, std::move(module), std::move(version));
  }

  absl::Status Stop(const std::string& model) {
    std::shared_ptr<Hosted> hosted;
    {
      absl::MutexLock lock(&mu_);
      auto it = models_.find(model);
      if (it == models_.end()) return NotServed(model);
      hosted = std::move(it->second);
      models_.erase(it);
    }
    Announce();
    hosted->batcher->Drain();
    return absl::OkStatus();
  }

  void StopAll() {
    std::map<std::string, std::shared_ptr<Hosted>> models;
    bool announce = false;
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
      models.swap(models_);
      announce = !models.empty() && !agent_closed_;
    }
    if (announce) Announce();
    for (auto& [name, hosted] : models) hosted->batcher->Drain();
  }

  // The agent is closing: stop serving without calling it again.
  void AgentClosed() {
    {
      absl::MutexLock lock(&mu_);
      agent_closed_ = true;
    }
    peer_watch_.reset();
    statistics_.reset();
    StopAll();
  }

  absl::StatusOr<ModelStats> Stats(const std::string& model) const {
    absl::StatusOr<std::shared_ptr<Hosted>> hosted = Find(model);
    if (!hosted.ok()) return hosted.status();
    return (*hosted)->batcher->stats();
  }

  std::vector<std::string> models() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [name, hosted] : models_) out.push_back(name);
    return out;
  }

  internal::ReplicaState State() const {
    absl::MutexLock lock(&mu_);
    return state_;
  }

  void Refresh(absl::Duration timeout) {
    std::vector<std::pair<std::string, Future<internal::ReplicaState>>> asked;
    for (const rpc::WorkerInfo& w : agent_.workers()) {
      if (w.name == self_) continue;
      asked.emplace_back(w.name, agent_.Send(w.name, internal::ModelsQuery{}, rpc::CallOptions{.timeout = timeout}));
    }
    for (auto& [worker, answer] : asked) {
      absl::StatusOr<internal::ReplicaState> state = answer.Get(timeout + absl::Seconds(1));
      if (state.ok() && state->worker == worker) directory_.Apply(worker, *state);
    }
  }

  // The first router of this worker asks every worker once; later changes arrive as
  // announcements.
  void RefreshOnce(absl::Duration timeout) {
    absl::MutexLock once(&refresh_mu_);
    if (refreshed_) return;
    Refresh(timeout);
    refreshed_ = true;
  }

  internal::ReplicaDirectory& directory() { return directory_; }
  rpc::Agent& agent() const { return agent_; }

 private:
  absl::Status NotServed(const std::string& model) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> names;
    for (const auto& [name, hosted] : models_) names.push_back(name);
    return absl::NotFoundError(absl::StrCat("model '", model, "' is not served on ", self_, " (it serves: ",
                                            names.empty() ? "nothing" : absl::StrJoin(names, ", "), ")"));
  }

  absl::StatusOr<std::shared_ptr<Hosted>> Find(const std::string& model) const {
    absl::MutexLock lock(&mu_);
    auto it = models_.find(model);
    if (it == models_.end()) return NotServed(model);
    return it->second;
  }

  Future<Prediction> Predict(internal::PredictMessage m) {
    absl::StatusOr<std::shared_ptr<Hosted>> hosted = Find(m.model);
    if (!hosted.ok()) return MakeReadyFuture<Prediction>(agent_.executor(), hosted.status());
    const absl::Time deadline =
        m.timeout_us > 0 ? absl::Now() + absl::Microseconds(m.timeout_us) : absl::InfiniteFuture();
    Promise<Prediction> promise(agent_.executor());
    (*hosted)->batcher->Submit(std::move(m.input), deadline, [promise, this](absl::StatusOr<Prediction> r) {
      if (r.ok()) r->replica = self_;
      promise.Set(std::move(r));
    });
    return promise.future();
  }

  // This worker's served models changed: tell itself and every other worker.
  void Announce() {
    internal::ReplicaState state;
    {
      absl::MutexLock lock(&mu_);
      if (agent_closed_) return;
      ++state_.version;
      state_.models.clear();
      for (const auto& [name, hosted] : models_) state_.models.push_back(name);
      state = state_;
    }
    directory_.Apply(self_, state);
    std::vector<Future<rpc::Ack>> acks;
    for (const rpc::WorkerInfo& w : agent_.workers()) {
      if (w.name == self_) continue;
      acks.push_back(agent_.Send(w.name, internal::ReplicaAnnounce{state}, rpc::CallOptions{.timeout = kAnnounceTimeout}));
    }
    // Answered or not (a worker that is down learns the state when it asks: Refresh).
    for (Future<rpc::Ack>& ack : acks) (void)ack.Get(kAnnounceTimeout + absl::Seconds(1));
  }

  rpc::Agent& agent_;
  const std::string self_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Hosted>> models_ ABSL_GUARDED_BY(mu_);
  internal::ReplicaState state_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool agent_closed_ ABSL_GUARDED_BY(mu_) = false;
  internal::ReplicaDirectory directory_;
  absl::Mutex refresh_mu_;
  bool refreshed_ ABSL_GUARDED_BY(refresh_mu_) = false;
  rpc::Agent::PeerWatch peer_watch_;
  rpc::Statistics::Source statistics_;
};

absl::StatusOr<std::shared_ptr<Serving>> Serving::Install(rpc::Agent& agent) {
  auto impl = std::make_shared<Impl>(agent);
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::shared_ptr<Serving>(new Serving(std::move(impl)));
}

Serving::Serving(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Serving::~Serving() { impl_->StopAll(); }

absl::Status Serving::Serve(ModelConfig config, std::shared_ptr<nn::Module> module, std::string version) {
  return impl_->Serve(std::move(config), std::move(module), std::move(version));
}
absl::Status Serving::Swap(const std::string& model, std::shared_ptr<nn::Module> module, std::string version) {
  return impl_->Swap(model, std::move(module), std::move(version));
}
absl::Status Serving::LoadVersion(const std::string& model, const std::string& path, std::string version) {
  return impl_->LoadVersion(model, path, std::move(version));
}
absl::Status Serving::LoadParameters(const std::string& model, const nn::NamedTensors& state, std::string version) {
  return impl_->LoadParameters(model, state, std::move(version));
}
absl::StatusOr<std::vector<std::pair<std::string, Shape>>> Serving::ParameterShapes(const std::string& model) const {
  return impl_->ParameterShapes(model);
}
absl::Status Serving::Stop(const std::string& model) { return impl_->Stop(model); }
absl::StatusOr<ModelStats> Serving::Stats(const std::string& model) const { return impl_->Stats(model); }
std::vector<std::string> Serving::models() const { return impl_->models(); }
std::vector<std::string> Serving::Replicas(const std::string& model) const {
  return *impl_->directory().Replicas(model);
}
void Serving::Refresh(absl::Duration timeout) { impl_->Refresh(timeout); }
void Serving::RefreshOnce(absl::Duration timeout) { impl_->RefreshOnce(timeout); }
std::shared_ptr<const std::vector<std::string>> Serving::ReplicaSnapshot(const std::string& model) const {
  return impl_->directory().Replicas(model);
}
rpc::Agent& Serving::agent() const { return impl_->agent(); }

}  // namespace gw::serve
