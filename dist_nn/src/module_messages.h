// Internal: the method messages of RemoteModule (dist_nn/include/gradwire/dist_nn/
// remote_module.h). Each runs on the module's worker with the module as its value
// (Agent::HandleMethod, RRef::Send).
#ifndef GRADWIRE_DIST_NN_SRC_MODULE_MESSAGES_H_
#define GRADWIRE_DIST_NN_SRC_MODULE_MESSAGES_H_

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "gradwire/rpc/message.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/tensor/tensor.h"

namespace gw::dist_nn::internal {

// module->Forward(input).
struct ModuleForward {
  static constexpr char kFunction[] = "__module.forward";
  using Reply = Tensor;
  Tensor input;
  static constexpr auto Fields() { return std::make_tuple(rpc::Field("input", &ModuleForward::input)); }
};

// RRefs of the module's parameter tensors, owned by its worker.
struct ModuleParameters {
  static constexpr char kFunction[] = "__module.parameters";
  using Reply = std::vector<rpc::RRef<Tensor>>;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// The module's ToString().
struct ModuleDescribe {
  static constexpr char kFunction[] = "__module.describe";
  using Reply = std::string;
  static constexpr auto Fields() { return std::tuple<>(); }
};

// The module's parameters by dotted name (copies travel back).
struct ModuleState {
  static constexpr char kFunction[] = "__module.state";
  using Reply = std::map<std::string, Tensor>;
  static constexpr auto Fields() { return std::tuple<>(); }
};

}  // namespace gw::dist_nn::internal

#endif  // GRADWIRE_DIST_NN_SRC_MODULE_MESSAGES_H_
