// W8, the gradient oracle: a two-worker model whose loss and every gradient must equal
// the same model run locally, and PyTorch's dist_autograd (reference numbers produced by
// dist_autograd/tests/make_reference.py with /usr/bin/python3, kept in tests/data).
#include <gtest/gtest.h>

#include <cmath>

#include "agent_group.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"

namespace gw::dist_autograd {
namespace {

// The model's fixed values (the same formulas as make_reference.py).
Tensor Values(int64_t rows, int64_t cols, const std::function<double(int64_t, int64_t)>& f) {
  std::vector<double> v;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) v.push_back(f(i, j));
  }
  return Reshape(Tensor::FromVector<double>(v), {rows, cols});
}
Tensor X() { return Values(4, 6, [](int64_t i, int64_t j) { return std::sin(0.3 * static_cast<double>(i * 6 + j) + 0.1); }); }
Tensor Wa() { return Values(6, 5, [](int64_t i, int64_t j) { return 0.2 * std::cos(0.7 * static_cast<double>(i * 5 + j) + 0.2); }); }
Tensor Ba() { return Reshape(Values(1, 5, [](int64_t, int64_t j) { return 0.05 * static_cast<double>(j - 2); }), {5}); }
Tensor Wb() { return Values(5, 3, [](int64_t i, int64_t j) { return 0.3 * std::sin(0.5 * static_cast<double>(i * 3 + j) + 0.3); }); }
Tensor Target() { return Values(4, 3, [](int64_t i, int64_t j) { return 0.1 * static_cast<double>(i - j); }); }

Tensor Leaf(const Tensor& t) { return kernels::Contiguous(t).set_requires_grad(true); }

void ExpectMatches(const std::map<std::string, std::vector<double>>& ref, const std::string& name, const Tensor& t) {
  ASSERT_TRUE(ref.count(name)) << name;
  ASSERT_TRUE(t.defined()) << name << ": no gradient";
  const std::vector<double> got = t.ToVector<double>();
  const std::vector<double>& want = ref.at(name);
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << name << "[" << i << "]";
}

TEST(GradOracleTest, TwoWorkerModelMatchesLocalAndPyTorchDistAutograd) {
  const auto ref = gw::testing::ReadReference(GRADWIRE_SOURCE_DIR "/dist_autograd/tests/data/w8_reference.txt");
  ASSERT_FALSE(ref.empty()) << "missing dist_autograd/tests/data/w8_reference.txt";
  Tensor wb = Leaf(Wb());  // lives on worker1
  std::vector<std::shared_ptr<DistAutograd>> engines(2);
  auto group = rpc::testing::AgentGroup::Start(2, [&](rpc::Agent& a) {
    engines[static_cast<size_t>(a.self().rank)] = DistAutograd::Install(a);
    if (a.self().rank == 1) (void)a.Register("out", [wb](Tensor h) { return MatMul(h, wb); });
  });
  ASSERT_NE(group, nullptr);
  Tensor x = Leaf(X()), wa = Leaf(Wa()), ba = Leaf(Ba());
  {
    Context ctx(*engines[0]);
    Tensor h = Tanh(Add(MatMul(x, wa), ba));
    absl::StatusOr<Tensor> out = (*group)[0].Sync<Tensor>("worker1", "out", h);
    ASSERT_TRUE(out.ok()) << out.status();
    Tensor diff = Sub(*out, Target());
    Tensor loss = Mean(Mul(diff, diff));
    ASSERT_TRUE(ctx.Backward({loss}).ok());
    ExpectMatches(ref, "w8.loss", loss);
    ExpectMatches(ref, "w8.out", *out);
    ExpectMatches(ref, "w8.grad.x", ctx.GradOf(x));
    ExpectMatches(ref, "w8.grad.w_a", ctx.GradOf(wa));
    ExpectMatches(ref, "w8.grad.b_a", ctx.GradOf(ba));
    ExpectMatches(ref, "w8.grad.w_b", engines[1]->GradOf(ctx.id(), wb));  // on its owner

    // And the same model, locally.
    Tensor lx = Leaf(X()), lwa = Leaf(Wa()), lba = Leaf(Ba()), lwb = Leaf(Wb());
    Tensor ldiff = Sub(MatMul(Tanh(Add(MatMul(lx, lwa), lba)), lwb), Target());
    autograd::Backward({Mean(Mul(ldiff, ldiff))});
    EXPECT_LT(kernels::MaxAbsDiff(ctx.GradOf(x), lx.grad()), 1e-12);
    EXPECT_LT(kernels::MaxAbsDiff(ctx.GradOf(wa), lwa.grad()), 1e-12);
    EXPECT_LT(kernels::MaxAbsDiff(ctx.GradOf(ba), lba.grad()), 1e-12);
    EXPECT_LT(kernels::MaxAbsDiff(engines[1]->GradOf(ctx.id(), wb), lwb.grad()), 1e-12);
  }
  EXPECT_TRUE(group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::dist_autograd
