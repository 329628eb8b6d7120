#include "gradwire/serve/router.h"

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "messages.h"

namespace gw::serve {

struct Router::State : std::enable_shared_from_this<Router::State> {
  std::shared_ptr<Serving> serving;
  std::string model;
  RouterOptions options;

  mutable absl::Mutex mu;
  std::map<std::string, ReplicaLoad> loads ABSL_GUARDED_BY(mu);
  uint64_t next ABSL_GUARDED_BY(mu) = 0;  // round-robin among equally loaded replicas
  absl::BitGen rng ABSL_GUARDED_BY(mu);

  // Picks a replica among `candidates` (not empty) and counts the request there.
  std::string Pick(const std::vector<std::string>& candidates) {
    absl::MutexLock lock(&mu);
    const size_t n = candidates.size();
    size_t best = 0;
    if (options.policy == RoutingPolicy::kPowerOfTwo && n > 2) {
      const size_t a = absl::Uniform<size_t>(rng, 0, n);
      size_t b = absl::Uniform<size_t>(rng, 0, n - 1);
      if (b >= a) ++b;
      best = loads[candidates[b]].outstanding < loads[candidates[a]].outstanding ? b : a;
    } else {
      const size_t start = static_cast<size_t>(next++ % n);
      best = start;
      for (size_t k = 1; k < n; ++k) {
        const size_t i = (start + k) % n;
        if (loads[candidates[i]].outstanding < loads[candidates[best]].outstanding) best = i;
      }
    }
    ReplicaLoad& load = loads[candidates[best]];
    ++load.outstanding;
    ++load.sent;
    return candidates[best];
  }

  void Finished(const std::string& replica, bool failed_over) {
    absl::MutexLock lock(&mu);
    ReplicaLoad& load = loads[replica];
    --load.outstanding;
    if (failed_over) ++load.failed_over;
  }

  static bool TryAnother(const absl::Status& s) {
    return absl::IsUnavailable(s) || absl::IsResourceExhausted(s) || absl::IsNotFound(s);
  }

  // Sends the request to a replica not in `tried`; on a failure another replica can fix,
  // tries the next one.
  void Attempt(Tensor input, absl::Time deadline, std::vector<std::string> tried, absl::Status last,
               Promise<Prediction> promise) {
    const std::shared_ptr<const std::vector<std::string>> replicas = serving->ReplicaSnapshot(model);
    std::vector<std::string> untried;  // only after a failover: the first attempt picks among all
    if (!tried.empty()) {
      for (const std::string& r : *replicas) {
        if (std::find(tried.begin(), tried.end(), r) == tried.end()) untried.push_back(r);
      }
    }
    const std::vector<std::string>& candidates = tried.empty() ? *replicas : untried;
    if (candidates.empty()) {
      if (tried.empty()) {
        promise.Set(absl::UnavailableError(absl::StrCat("no worker serves model '", model,
                                                        "' (start it with Serving::Serve on a worker of this job)")));
      } else {
        promise.Set(absl::Status(last.code(), absl::StrCat("model '", model, "': no replica could answer (tried ",
                                                           absl::StrJoin(tried, ", "), "); last: ", last.message())));
      }
      return;
    }
    const absl::Duration remaining = deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      promise.Set(absl::DeadlineExceededError(absl::StrCat("model '", model, "': the deadline passed",
                                                           tried.empty() ? "" : " while failing over from ",
                                                           absl::StrJoin(tried, ", "))));
      return;
    }
    const std::string replica = Pick(candidates);
    internal::PredictMessage message{model, input, absl::ToInt64Microseconds(remaining)};
    serving->agent().Send(
        replica, std::move(message), rpc::CallOptions{.timeout = remaining},
        [self = shared_from_this(), replica, input = std::move(input), deadline, tried = std::move(tried),
         promise](absl::StatusOr<Prediction> r) mutable {
          const bool again = !r.ok() && TryAnother(r.status());
          self->Finished(replica, again);
          if (!again) {
            promise.Set(std::move(r));
            return;
          }
          tried.push_back(replica);
          self->Attempt(std::move(input), deadline, std::move(tried), r.status(), std::move(promise));
        });
  }
};

absl::StatusOr<Router> Router::Create(std::shared_ptr<Serving> serving, std::string model, RouterOptions options) {
  if (!serving) return absl::InvalidArgumentError("Router::Create: no Serving (install it in the agent's setup)");
  if (model.empty()) return absl::InvalidArgumentError("Router::Create: the model needs a name");
  serving->RefreshOnce(absl::Seconds(10));
  auto state = std::make_shared<State>();
  state->serving = std::move(serving);
  state->model = std::move(model);
  state->options = options;
  return Router(std::move(state));
}

Future<Prediction> Router::Predict(Tensor input, absl::Duration timeout) const {
  Promise<Prediction> promise(state_->serving->agent().executor());
  const absl::Time deadline = absl::Now() + (timeout > absl::ZeroDuration() ? timeout : state_->options.timeout);
  state_->Attempt(std::move(input), deadline, {}, absl::OkStatus(), promise);
  return promise.future();
}

absl::StatusOr<Prediction> Router::PredictSync(Tensor input, absl::Duration timeout) const {
  const absl::Duration budget = timeout > absl::ZeroDuration() ? timeout : state_->options.timeout;
  Future<Prediction> f = Predict(std::move(input), budget);
  // Every attempt has its own deadline; the wait only guards against a lost completion.
  return f.Get(budget + absl::Seconds(5));
}

std::vector<std::string> Router::replicas() const { return *state_->serving->ReplicaSnapshot(state_->model); }

std::map<std::string, ReplicaLoad> Router::loads() const {
  absl::MutexLock lock(&state_->mu);
  return state_->loads;
}

absl::StatusOr<ModelStats> Router::ReplicaStats(const std::string& replica) const {
  return state_->serving->agent()
      .Send(replica, internal::StatsQuery{state_->model}, rpc::CallOptions{.timeout = state_->options.timeout})
      .Get(state_->options.timeout + absl::Seconds(5));
}

const std::string& Router::model() const { return state_->model; }

}  // namespace gw::serve
