// Unit: the composed optimizer step (what updates parameters on a GPU) against the fused
// CPU loops, on the CPU where both run: every optimizer and option, several steps, the
// parameter and every state buffer, one gradient and an average of several.
#include "composed_step.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradwire/tensor/kernels.h"

namespace gw::optim {
namespace {

struct Case {
  std::string name;
  OptimizerConfig config;
};

std::vector<Case> Cases() {
  return {
      {"sgd", Sgd{.lr = 0.1}},
      {"sgd_momentum_dampening_decay", Sgd{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}},
      {"sgd_nesterov_maximize", Sgd{.lr = 0.05, .momentum = 0.8, .nesterov = true, .maximize = true}},
      {"adam", Adam{.lr = 0.01}},
      {"adam_l2_amsgrad", Adam{.lr = 0.01, .weight_decay = 0.05, .amsgrad = true}},
      {"adamw_maximize", AdamW{.lr = 0.02, .weight_decay = 0.1, .maximize = true}},
      {"adagrad", Adagrad{.lr = 0.1, .lr_decay = 0.01, .weight_decay = 0.02, .initial_accumulator_value = 0.1}},
  };
}

class ComposedStepTest : public ::testing::TestWithParam<Case> {};

TEST_P(ComposedStepTest, EqualsTheFusedLoopsStepByStep) {
  const OptimizerConfig& config = GetParam().config;
  Generator gen(11);
  const Tensor start = Tensor::Randn({37, 5}, gen, DType::kFloat64);
  const Tensor fused = kernels::Clone(start), composed = kernels::Clone(start);
  ParamState fused_state, composed_state;
  for (int step = 0; step < 6; ++step) {
    std::vector<Tensor> grads;
    for (int k = 0; k < (step % 2 == 0 ? 1 : 3); ++k) grads.push_back(Tensor::Randn({37, 5}, gen, DType::kFloat64));
    const int64_t count = static_cast<int64_t>(grads.size());
    if (count == 1) {
      Update(config, fused, grads[0], fused_state);
    } else {
      UpdateWithAverage(config, fused, grads, count, fused_state);
    }
    internal::ComposedStep(config, composed, grads, count, composed_state);
    EXPECT_LT(kernels::MaxAbsDiff(fused, composed), 1e-12) << "step " << step;
    EXPECT_EQ(composed_state.step, fused_state.step);
    ASSERT_EQ(composed_state.buffers.size(), fused_state.buffers.size()) << "step " << step;
    for (const auto& [name, buffer] : fused_state.buffers) {
      ASSERT_TRUE(composed_state.buffers.contains(name)) << name;
      EXPECT_LT(kernels::MaxAbsDiff(buffer, composed_state.buffers.at(name)), 1e-12) << name << ", step " << step;
    }
  }
  EXPECT_GT(kernels::MaxAbsDiff(start, composed), 1e-3);  // it moved
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ComposedStepTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace gw::optim
