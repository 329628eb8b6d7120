// Internal: the owners' side of DistributedOptimizer (registered by DistAutograd::Install).
#ifndef GRADWIRE_DIST_AUTOGRAD_SRC_OPTIMIZER_HOST_H_
#define GRADWIRE_DIST_AUTOGRAD_SRC_OPTIMIZER_HOST_H_

#include <functional>

#include "absl/status/status.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/global_id.h"

namespace gw::dist_autograd {

// grad_of(context_id, param): this worker's gradient of `param` in that context.
absl::Status InstallOptimizerHost(rpc::Agent& agent, std::function<Tensor(rpc::GlobalId, const Tensor&)> grad_of);

}  // namespace gw::dist_autograd

#endif  // GRADWIRE_DIST_AUTOGRAD_SRC_OPTIMIZER_HOST_H_
