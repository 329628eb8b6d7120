// Optimizer configs of optim/ as rpc Values, so they can travel to the workers that apply
// them (DistributedOptimizer owners, parameter servers).
//
// Contract
//   - ConfigToValue gives a map {"name": "SGD" | "Adam" | "AdamW" | "Adagrad", and one
//     entry per hyper-parameter}; ConfigFromValue reads it back (missing fields take
//     their defaults) and reports an unknown name or a mistyped field as
//     INVALID_ARGUMENT. Round trips are exact.
#ifndef GRADWIRE_DIST_AUTOGRAD_OPTIMIZER_VALUE_H_
#define GRADWIRE_DIST_AUTOGRAD_OPTIMIZER_VALUE_H_

#include "absl/status/statusor.h"
#include "gradwire/optim/functional.h"
#include "gradwire/rpc/value.h"

namespace gw::dist_autograd {

rpc::Value ConfigToValue(const optim::OptimizerConfig& config);
absl::StatusOr<optim::OptimizerConfig> ConfigFromValue(const rpc::Value& v);

}  // namespace gw::dist_autograd

#endif  // GRADWIRE_DIST_AUTOGRAD_OPTIMIZER_VALUE_H_
