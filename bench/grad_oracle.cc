// Benchmark W8 `grad_oracle` of BENCHMARKS.md for gradwire: the two-worker
// model of dist_autograd/tests/w8_model.h (two agents on threads of this process, real
// loopback connections) under distributed autograd, compared with the same model run
// locally and with PyTorch's dist_autograd (dist_autograd/tests/data/w8_reference.txt).
//
//   grad_oracle [--quick]        (--quick changes nothing: the run is already short)
#include <thread>

#include "bench_util.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/agent.h"
#include "reference.h"
#include "w8_model.h"

namespace w8 = gw::dist_autograd::w8;

namespace {

double MaxDiff(const gw::Tensor& a, const std::vector<double>& b) {
  const std::vector<double> v = a.ToVector<double>();
  if (v.size() != b.size()) return 1e300;
  double worst = 0;
  for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(v[i] - b[i]));
  return worst;
}

}  // namespace

int main() {
  auto store = gw::rpc::StoreServer::Start("127.0.0.1", 0, gw::rpc::Security::FromEnv().value_or(gw::rpc::Security{}));
  if (!store.ok()) return 1;
  gw::Tensor wb = w8::Leaf(w8::Wb());
  std::vector<std::shared_ptr<gw::dist_autograd::DistAutograd>> engines(2);
  std::vector<absl::StatusOr<std::shared_ptr<gw::rpc::Agent>>> agents(2);
  std::vector<std::thread> starting;
  for (int r = 0; r < 2; ++r) {
    starting.emplace_back([&, r] {
      gw::rpc::AgentOptions o;
      o.rank = r;
      o.world_size = 2;
      o.rendezvous = (*store)->address();
      o.host_store = false;
      agents[static_cast<size_t>(r)] = gw::rpc::Agent::Start(o, [&, r](gw::rpc::Agent& a) {
        if (r == 1) (void)a.Register("out", [wb](gw::Tensor h) { return gw::MatMul(h, wb); });
        return gw::rpc::Assign(gw::dist_autograd::DistAutograd::Install(a), engines[static_cast<size_t>(r)]);
      });
    });
  }
  for (auto& t : starting) t.join();
  if (!agents[0].ok() || !agents[1].ok()) return 1;

  const auto ref = gw::testing::ReadReference(GRADWIRE_SOURCE_DIR "/dist_autograd/tests/data/w8_reference.txt");
  gw::Tensor x = w8::Leaf(w8::X()), wa = w8::Leaf(w8::Wa()), ba = w8::Leaf(w8::Ba());
  gw::Tensor lx = w8::Leaf(w8::X()), lwa = w8::Leaf(w8::Wa()), lba = w8::Leaf(w8::Ba()), lwb = w8::Leaf(w8::Wb());
  gw::autograd::Backward({w8::Loss(gw::MatMul(w8::Hidden(lx, lwa, lba), lwb))});
  {
    gw::dist_autograd::Context ctx(*engines[0]);
    absl::StatusOr<gw::Tensor> out = (*agents[0])->Sync<gw::Tensor>("worker1", "out", w8::Hidden(x, wa, ba));
    if (!out.ok()) return 1;
    gw::Tensor loss = w8::Loss(*out);
    if (!ctx.Backward({loss}).ok()) return 1;
    const std::vector<std::pair<gw::Tensor, gw::Tensor>> grads{
        {ctx.GradOf(x), lx.grad()}, {ctx.GradOf(wa), lwa.grad()}, {ctx.GradOf(ba), lba.grad()},
        {engines[1]->GradOf(ctx.id(), wb), lwb.grad()}};
    const char* names[] = {"w8.grad.x", "w8.grad.w_a", "w8.grad.b_a", "w8.grad.w_b"};
    double vs_local = 0, vs_pytorch = MaxDiff(loss, ref.count("w8.loss") ? ref.at("w8.loss") : std::vector<double>{});
    for (size_t i = 0; i < grads.size(); ++i) {
      vs_local = std::max(vs_local, MaxDiff(grads[i].first, grads[i].second.ToVector<double>()));
      vs_pytorch = std::max(vs_pytorch, MaxDiff(grads[i].first, ref.count(names[i]) ? ref.at(names[i]) : std::vector<double>{}));
    }
    gw::bench::Report("grad_oracle", "loss", loss.item(), "1");
    gw::bench::Report("grad_oracle", "max_abs_diff_dist_vs_local", vs_local, "1");
    gw::bench::Report("grad_oracle", "max_abs_diff_vs_pytorch", vs_pytorch, "1");
  }
  for (auto& a : agents) (void)(*a)->Shutdown();
  (*store)->Shutdown();
  return 0;
}
