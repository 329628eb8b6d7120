// W8, the gradient oracle: a two-worker model whose loss and every gradient must equal
// the same model run locally, and PyTorch's dist_autograd (reference numbers produced by
// dist_autograd/tests/make_reference.py with /usr/bin/python3, kept in tests/data).
#include <gtest/gtest.h>

#include "agent_group.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"
#include "w8_model.h"

namespace gw::dist_autograd {
namespace {

using w8::Ba;
using w8::Leaf;
using w8::Wa;
using w8::Wb;
using w8::X;

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
    if (a.self().rank == 1) (void)a.Register("out", [wb](Tensor h) { return MatMul(h, wb); });
    return rpc::Assign(DistAutograd::Install(a), engines[static_cast<size_t>(a.self().rank)]);
  });
  ASSERT_NE(group, nullptr);
  Tensor x = Leaf(X()), wa = Leaf(Wa()), ba = Leaf(Ba());
  {
    Context ctx(*engines[0]);
    absl::StatusOr<Tensor> out = (*group)[0].Sync<Tensor>("worker1", "out", w8::Hidden(x, wa, ba));
    ASSERT_TRUE(out.ok()) << out.status();
    Tensor loss = w8::Loss(*out);
    ASSERT_TRUE(ctx.Backward({loss}).ok());
    ExpectMatches(ref, "w8.loss", loss);
    ExpectMatches(ref, "w8.out", *out);
    ExpectMatches(ref, "w8.grad.x", ctx.GradOf(x));
    ExpectMatches(ref, "w8.grad.w_a", ctx.GradOf(wa));
    ExpectMatches(ref, "w8.grad.b_a", ctx.GradOf(ba));
    ExpectMatches(ref, "w8.grad.w_b", engines[1]->GradOf(ctx.id(), wb));  // on its owner

    // And the same model, locally.
    Tensor lx = Leaf(X()), lwa = Leaf(Wa()), lba = Leaf(Ba()), lwb = Leaf(Wb());
    autograd::Backward({w8::Loss(MatMul(w8::Hidden(lx, lwa, lba), lwb))});
    EXPECT_LT(kernels::MaxAbsDiff(ctx.GradOf(x), lx.grad()), 1e-12);
    EXPECT_LT(kernels::MaxAbsDiff(ctx.GradOf(wa), lwa.grad()), 1e-12);
    EXPECT_LT(kernels::MaxAbsDiff(ctx.GradOf(ba), lba.grad()), 1e-12);
    EXPECT_LT(kernels::MaxAbsDiff(engines[1]->GradOf(ctx.id(), wb), lwb.grad()), 1e-12);
  }
  EXPECT_TRUE(group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::dist_autograd
