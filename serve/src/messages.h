// Internal: the messages of the serving layer (serve/include/gradwire/serve/serving.h).
#ifndef GRADWIRE_SERVE_SRC_MESSAGES_H_
#define GRADWIRE_SERVE_SRC_MESSAGES_H_

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "gradwire/rpc/message.h"
#include "gradwire/serve/model_stats.h"
#include "gradwire/serve/prediction.h"
#include "gradwire/tensor/tensor.h"

namespace gw::serve::internal {

// One request to a replica: `input` is [rows, *sample shape]; timeout_us > 0 is the
// request's remaining budget (the replica's deadline is its arrival plus it).
struct PredictMessage {
  static constexpr char kFunction[] = "__serve.predict";
  using Reply = Prediction;
  std::string model;
  Tensor input;
  int64_t timeout_us = 0;
  static constexpr auto Fields() {
    return std::make_tuple(rpc::Field("model", &PredictMessage::model), rpc::Field("input", &PredictMessage::input),
                           rpc::Field("timeout_us", &PredictMessage::timeout_us));
  }
};

// Which models `worker` serves (named here, not taken from the call: a connection may
// not know its peer's name yet). `incarnation` tells a restarted process from its
// predecessor; `version` orders one incarnation's announcements.
struct ReplicaState {
  std::string worker;
  int64_t incarnation = 0;
  int64_t version = 0;
  std::vector<std::string> models;
  static constexpr auto Fields() {
    return std::make_tuple(rpc::Field("worker", &ReplicaState::worker), rpc::Field("incarnation", &ReplicaState::incarnation),
                           rpc::Field("version", &ReplicaState::version), rpc::Field("models", &ReplicaState::models));
  }
};

// A worker's answer to "what do you serve?" (asked once, when the first router is made).
struct ModelsQuery {
  static constexpr char kFunction[] = "__serve.models";
  using Reply = ReplicaState;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// Sent to every worker when this worker's served models change (Serve, Stop).
struct ReplicaAnnounce {
  static constexpr char kFunction[] = "__serve.announce";
  using Reply = rpc::Ack;
  ReplicaState state;
  static constexpr auto Fields() { return std::make_tuple(rpc::Field("state", &ReplicaAnnounce::state)); }
};

// A replica's statistics of one model.
struct StatsQuery {
  static constexpr char kFunction[] = "__serve.stats";
  using Reply = ModelStats;
  std::string model;
  static constexpr auto Fields() { return std::make_tuple(rpc::Field("model", &StatsQuery::model)); }
};

}  // namespace gw::serve::internal

#endif  // GRADWIRE_SERVE_SRC_MESSAGES_H_
