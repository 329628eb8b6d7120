// Serving: one worker's part of model serving: the models it hosts for inference, and
// which workers serve which model (the replica directory its routers read).
//
// Contract
//   - Serving::Install(agent) in Agent::Start's setup, on every worker that serves or
//     routes (so that no announcement can reach a worker before it listens). It serves
//     the messages of serve/src/messages.h: PredictMessage (`__serve.predict`, answered
//     without a thread hop: the request goes straight into the model's Batcher),
//     ModelsQuery, ReplicaAnnounce and StatsQuery.
//   - Serve(config, module, version) hosts `module` under config.name: requests are
//     batched (batcher.h, config.batching) and computed with gradient recording off; the
//     model must map [rows, *input_shape] to [rows, ...]. It returns once every live
//     worker acknowledged that this one is a replica (each bounded by 10 s; a worker that
//     is down learns it when its first router asks), so a router made afterwards anywhere
//     sees it. ALREADY_EXISTS if the name is served here already.
//   - Swap(model, module, version) replaces the module atomically: every batch is
//     computed wholly by the module that was current when it started, and its requests
//     get that version; no request sees half of each. NOT_FOUND for a model not served.
//   - LoadVersion(model, path, version) makes a module with config.factory, loads the
//     state-dict file `path` into it (nn::Module::Save's format; strict: every parameter,
//     same shapes) and swaps it in. A file that does not load leaves the served version
//     untouched and returns the loader's error; FAILED_PRECONDITION without a factory.
//   - LoadParameters(model, state, version) does the same from named tensors (a state
//     dict: every parameter by name, same shapes), e.g. read from parameter servers
//     (follower.h). ParameterShapes(model) names the served module's parameters and
//     their shapes, in NamedParameters order.
//   - Stop(model) withdraws this replica (acknowledged by every live worker first, as
//     Serve, so routers stop choosing it), answers every queued request, then stops; requests that still arrive are refused
//     with UNAVAILABLE, which routers take as "ask another replica". The destructor and
//     agent shutdown stop every model.
//   - Stats(model) is this replica's ModelStats (model_stats.h); NOT_FOUND if not served.
//   - The directory: Replicas(model) lists the workers known to serve it, sorted. It is
//     filled by the announcements, by asking every worker once (Refresh, which the first
//     Router does), and emptied of workers declared dead (Agent::WatchPeers). A restarted
//     worker that serves again is a replica again.
//   - Thread-safe. The handlers keep the Serving alive as long as the agent serves.
#ifndef GRADWIRE_SERVE_SERVING_H_
#define GRADWIRE_SERVE_SERVING_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gradwire/nn/module.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/serve/batcher.h"
#include "gradwire/serve/model_stats.h"

namespace gw::serve {

struct ModelConfig {
  std::string name = {};
  Shape input_shape = {};  // one sample; requests are [rows, *input_shape]
  DType dtype = DType::kFloat32;
  BatchingOptions batching = {};
  // Makes a fresh module of the served architecture, for LoadVersion (optional).
  std::function<std::shared_ptr<nn::Module>()> factory = {};
};

class Serving {
 public:
  static absl::StatusOr<std::shared_ptr<Serving>> Install(rpc::Agent& agent);
  ~Serving();
  Serving(const Serving&) = delete;
  Serving& operator=(const Serving&) = delete;

  absl::Status Serve(ModelConfig config, std::shared_ptr<nn::Module> module, std::string version);
  absl::Status Swap(const std::string& model, std::shared_ptr<nn::Module> module, std::string version);
  absl::Status LoadVersion(const std::string& model, const std::string& path, std::string version);
  absl::Status LoadParameters(const std::string& model, const nn::NamedTensors& state, std::string version);
  absl::StatusOr<std::vector<std::pair<std::string, Shape>>> ParameterShapes(const std::string& model) const;
  absl::Status Stop(const std::string& model);
  absl::StatusOr<ModelStats> Stats(const std::string& model) const;
  std::vector<std::string> models() const;

  std::vector<std::string> Replicas(const std::string& model) const;
  // Asks every live worker what it serves (bounded by `timeout`); workers that do not
  // answer keep what the directory knew of them.
  void Refresh(absl::Duration timeout);

  rpc::Agent& agent() const;

  class Impl;

 private:
  friend class Router;
  explicit Serving(std::shared_ptr<Impl> impl);
  // For routers: the replicas as a shared snapshot, and the first router's Refresh.
  std::shared_ptr<const std::vector<std::string>> ReplicaSnapshot(const std::string& model) const;
  void RefreshOnce(absl::Duration timeout);
  std::shared_ptr<Impl> impl_;
};

}  // namespace gw::serve

#endif  // GRADWIRE_SERVE_SERVING_H_
