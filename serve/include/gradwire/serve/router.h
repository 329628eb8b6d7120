// Router: a client's handle to a served model, spreading requests over its replicas.
//
// Contract
//   - Router::Create(serving, model, options) makes a router on the worker whose Serving
//     is given; the first router of a worker asks every worker what it serves
//     (Serving::Refresh). The replicas are then followed as they join and leave
//     (serving.h): a request goes to a replica known at the time it is sent.
//   - Predict(input) sends input ([rows, *input_shape]) to one replica, chosen by
//     options.policy: kLeastOutstanding (fewest requests this router has in flight
//     there; ties go round-robin) or kPowerOfTwo (the less loaded of two picked at
//     random). The future completes exactly once: with the replica's Prediction, or
//     with an error. No request is silently lost.
//   - Failover: when the chosen replica is unavailable (dead, unreachable, draining),
//     its queue is full (RESOURCE_EXHAUSTED) or it no longer serves the model
//     (NOT_FOUND), the request goes to another replica it has not tried yet, while time
//     remains. Inference has no side effects, so a request a dead replica may have
//     computed can be asked again. When every replica failed, the error is the last
//     one, prefixed with the replicas tried; with no replica at all it is UNAVAILABLE
//     "no worker serves model '...'". Other errors (INVALID_ARGUMENT for a wrong shape,
//     DEADLINE_EXCEEDED, the model's own error) are returned as they are.
//   - Every request has a deadline: `timeout` (else options.timeout); the replica skips
//     a request whose deadline passed in its queue.
//   - Copies share the router's state. Thread-safe.
#ifndef GRADWIRE_SERVE_ROUTER_H_
#define GRADWIRE_SERVE_ROUTER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradwire/rpc/future.h"
#include "gradwire/serve/model_stats.h"
#include "gradwire/serve/prediction.h"
#include "gradwire/serve/serving.h"

namespace gw::serve {

enum class RoutingPolicy { kLeastOutstanding, kPowerOfTwo };

struct RouterOptions {
  RoutingPolicy policy = RoutingPolicy::kLeastOutstanding;
  absl::Duration timeout = absl::Seconds(30);  // per request, failovers included
};

// What one router has seen of each replica.
struct ReplicaLoad {
  int64_t outstanding = 0;
  int64_t sent = 0;
  int64_t failed_over = 0;  // requests this replica could not take and another one got
};

class Router {
 public:
  static absl::StatusOr<Router> Create(std::shared_ptr<Serving> serving, std::string model, RouterOptions options = {});

  Future<Prediction> Predict(Tensor input, absl::Duration timeout = absl::ZeroDuration()) const;
  absl::StatusOr<Prediction> PredictSync(Tensor input, absl::Duration timeout = absl::ZeroDuration()) const;

  // The replicas known now, sorted.
  std::vector<std::string> replicas() const;
  // By replica, what this router sent.
  std::map<std::string, ReplicaLoad> loads() const;
  // A replica's own statistics of this model (StatsQuery).
  absl::StatusOr<ModelStats> ReplicaStats(const std::string& replica) const;
  const std::string& model() const;

  struct State;

 private:
  explicit Router(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace gw::serve

#endif  // GRADWIRE_SERVE_ROUTER_H_
