// Internal: one optimizer step composed of gw::kernels' element-wise ops (a pass over the
// parameter each), for parameters the fused CPU loops of functional.cc cannot reach: those
// on a GPU. It runs on any device, so its tests compare it with the fused loops on the CPU.
//
// Contract
//   - The same arithmetic as Update (functional.h), each step rounded separately (the fused
//     loops may differ by an ulp per step), the same state buffers by name, made on the
//     parameter's device.
//   - REQUIRES: Update's checks passed; grads on param's device; count >= 1.
#ifndef GRADWIRE_OPTIM_SRC_COMPOSED_STEP_H_
#define GRADWIRE_OPTIM_SRC_COMPOSED_STEP_H_

#include <vector>

#include "gradwire/optim/functional.h"

namespace gw::optim::internal {

// param -= step of `config` with the gradient (grads[0] + ... + grads[k-1]) / count.
void ComposedStep(const OptimizerConfig& config, const Tensor& param, const std::vector<Tensor>& grads, int64_t count,
                  ParamState& state);

}  // namespace gw::optim::internal

#endif  // GRADWIRE_OPTIM_SRC_COMPOSED_STEP_H_
