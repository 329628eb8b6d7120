// Distributed backward across agents (threads of this process, real loopback
// connections): every gradient must equal the same model run locally, in float64.
#include "gradwire/dist_autograd/dist_autograd.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/match.h"
#include "agent_group.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/function.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/rpc/rref.h"
#include "gradwire/tensor/kernels.h"
#include "samples.h"

namespace gw::dist_autograd {
namespace {

using rpc::Agent;
using rpc::RRef;

constexpr double kTol = 1e-6;

// One weight per worker (float64 leaves), and the functions that use them.
struct World {
  std::vector<Tensor> weights;
  std::vector<std::shared_ptr<DistAutograd>> engines;
  std::unique_ptr<rpc::testing::AgentGroup> group;
  absl::Mutex mu;
  std::vector<Tensor> stashed;

  explicit World(int n, std::shared_ptr<rpc::FaultInjector> faults = nullptr, rpc::PeerLimits limits = {})
      : engines(static_cast<size_t>(n)) {
    for (int r = 0; r < n; ++r) {
      Generator gen(static_cast<uint64_t>(100 + r));
      weights.push_back(MulScalar(Tensor::Randn({4, 4}, gen, DType::kFloat64), 0.5).set_requires_grad(true));
    }
    rpc::AgentOptions o;
    o.default_timeout = absl::Seconds(30);
    o.transport_options.faults = std::move(faults);
    o.security.limits = limits;
    group = rpc::testing::AgentGroup::Start(n, [this](Agent& a) { return Register(a); }, o);
  }
  ~World() {
    if (group) (void)group->ShutdownAll();
  }

  absl::Status Register(Agent& a) {
    const int r = a.self().rank;
    if (absl::Status s = rpc::Assign(DistAutograd::Install(a), engines[static_cast<size_t>(r)]); !s.ok()) return s;
    Tensor w = weights[static_cast<size_t>(r)];
    Agent* self = &a;
    (void)a.Register("stage", [w](Tensor x) { return Tanh(MatMul(x, w)); });
    (void)a.Register("stage_then", [w, self](Tensor x, std::string next) {
      return self->Sync<Tensor>(next, "stage", Tanh(MatMul(x, w)));
    });
    (void)a.Register("bounce", [w, self](Tensor x, std::string back) -> absl::StatusOr<Tensor> {
      absl::StatusOr<Tensor> r = self->Sync<Tensor>(back, "stage", Tanh(MatMul(x, w)));
      if (!r.ok()) return r.status();
      return Tanh(MatMul(*r, w));
    });
    (void)a.Register("stash", [this](Tensor x) {
      absl::MutexLock lock(&mu);
      stashed.push_back(Sum(x));
      return true;
    });
    (void)a.Register("weight_rref", [w, self] { return self->Own(w); });
    // Two results in one reply: the first does not use this worker's weight, the second does.
    (void)a.Register("two_heads", [w](Tensor x) { return std::vector<Tensor>{Tanh(x), MatMul(x, w)}; });
    // Doubles x; its backward fails (to test how failures travel).
    (void)a.Register("fragile", [](Tensor x) {
      return autograd::Record("Fragile", {x}, kernels::MulScalar(x, 2.0), [](const Tensor&) -> std::vector<Tensor> {
        GW_CHECK(false, "Fragile", "backward failed on purpose");
        return {};
      });
    });
    return absl::OkStatus();
  }

  Agent& agent(int r) { return (*group)[r]; }
  DistAutograd& engine(int r) { return *engines[static_cast<size_t>(r)]; }
  // Weight r as a fresh leaf for the local reference computation.
  Tensor LocalWeight(int r) const { return kernels::Clone(weights[static_cast<size_t>(r)]).set_requires_grad(true); }
};

Tensor Input() {
  Generator gen(7);
  return Tensor::Randn({3, 4}, gen, DType::kFloat64).set_requires_grad(true);
}

void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no gradient";
  ASSERT_TRUE(want.defined()) << what << ": no reference gradient";
  EXPECT_LT(kernels::MaxAbsDiff(got, want), kTol) << what;
}

TEST(DistAutogradTest, ChainAcrossThreeWorkersMatchesLocalGradients) {
  World w(3);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  {
    Context ctx(w.engine(0));
    Tensor y0 = Tanh(MatMul(x, w.weights[0]));
    absl::StatusOr<Tensor> y2 = w.agent(0).Sync<Tensor>("worker1", "stage_then", y0, std::string("worker2"));
    ASSERT_TRUE(y2.ok()) << y2.status();
    ASSERT_TRUE(y2->requires_grad());
    Tensor loss = Sum(Mul(*y2, *y2));
    absl::Status s = ctx.Backward({loss});
    ASSERT_TRUE(s.ok()) << s;

    Tensor lx = kernels::Clone(x).set_requires_grad(true);
    std::vector<Tensor> lw{w.LocalWeight(0), w.LocalWeight(1), w.LocalWeight(2)};
    Tensor ly = Tanh(MatMul(Tanh(MatMul(Tanh(MatMul(lx, lw[0])), lw[1])), lw[2]));
    Tensor local_loss = Sum(Mul(ly, ly));
    EXPECT_LT(std::abs(loss.item() - local_loss.item()), kTol);
    autograd::Backward({local_loss});
    ExpectClose(ctx.GradOf(x), lx.grad(), "x");
    ExpectClose(ctx.GradOf(w.weights[0]), lw[0].grad(), "w0");
    ExpectClose(w.engine(1).GradOf(ctx.id(), w.weights[1]), lw[1].grad(), "w1");
    ExpectClose(w.engine(2).GradOf(ctx.id(), w.weights[2]), lw[2].grad(), "w2");
    EXPECT_FALSE(x.grad().defined());  // gradients live in the context, not in .grad()
  }
  // Released everywhere.
  for (int r = 0; r < 3; ++r) EXPECT_EQ(w.engine(r).live_contexts(), 0u) << "worker" << r;
}

TEST(DistAutogradTest, FanOutAndATensorSentTwice) {
  World w(3);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  Context ctx(w.engine(0));
  Tensor a = *w.agent(0).Sync<Tensor>("worker1", "stage", x);
  Tensor b = *w.agent(0).Sync<Tensor>("worker2", "stage", x);
  Tensor c = *w.agent(0).Sync<Tensor>("worker1", "stage", x);  // x to worker1 a second time
  Tensor loss = Sum(Mul(Add(a, b), c));
  ASSERT_TRUE(ctx.Backward({loss}).ok());

  Tensor lx = kernels::Clone(x).set_requires_grad(true);
  Tensor l1 = w.LocalWeight(1), l2 = w.LocalWeight(2);
  Tensor la = Tanh(MatMul(lx, l1)), lb = Tanh(MatMul(lx, l2)), lc = Tanh(MatMul(lx, l1));
  autograd::Backward({Sum(Mul(Add(la, lb), lc))});
  ExpectClose(ctx.GradOf(x), lx.grad(), "x");
  ExpectClose(w.engine(1).GradOf(ctx.id(), w.weights[1]), l1.grad(), "w1 (used twice)");
  ExpectClose(w.engine(2).GradOf(ctx.id(), w.weights[2]), l2.grad(), "w2");
}

// x also goes to a call whose result never reaches the loss.
TEST(DistAutogradTest, UnusedSendFailsFastModeWithAReasonAndPassesSmartMode) {
  World w(3);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  Tensor lx = kernels::Clone(x).set_requires_grad(true);
  Tensor l1 = w.LocalWeight(1);
  autograd::Backward({Add(Sum(Tanh(MatMul(lx, l1))), Sum(Mul(lx, lx)))});
  for (Mode mode : {Mode::kFast, Mode::kSmart}) {
    SCOPED_TRACE(mode == Mode::kFast ? "FAST" : "SMART");
    Context ctx(w.engine(0));
    Tensor a = *w.agent(0).Sync<Tensor>("worker1", "stage", x);
    ASSERT_TRUE(w.agent(0).Sync<bool>("worker2", "stash", x).ok());  // result not used
    Tensor loss = Add(Sum(a), Sum(Mul(x, x)));
    BackwardOptions options;
    options.mode = mode;
    options.timeout = absl::Seconds(mode == Mode::kFast ? 2 : 30);
    absl::Status s = ctx.Backward({loss}, options);
    if (mode == Mode::kFast) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_NE(s.message().find("SMART mode"), std::string::npos) << s;
    } else {
      ASSERT_TRUE(s.ok()) << s;
      ExpectClose(ctx.GradOf(x), lx.grad(), "x");
      ExpectClose(w.engine(1).GradOf(ctx.id(), w.weights[1]), l1.grad(), "w1");
    }
  }
  // The statistics (a metrics endpoint's gradwire_dist_autograd_*) count both passes on
  // the worker that ran them, the failed one too, and the gradients that reached worker1.
  using rpc::testing::SampleValue;
  const std::vector<rpc::Sample> ran = w.agent(0).statistics().Collect();
  EXPECT_EQ(SampleValue(ran, "gradwire_dist_autograd_backward_passes_total"), 1);
  EXPECT_EQ(SampleValue(ran, "gradwire_dist_autograd_backward_passes_failed_total"), 1);
  EXPECT_EQ(SampleValue(ran, "gradwire_dist_autograd_backward_passes_running"), 0);
  EXPECT_GE(SampleValue(w.agent(1).statistics().Collect(), "gradwire_dist_autograd_gradients_received_total"), 2);
}

// A reply carrying two tensors of which only one reaches the loss. PyTorch records one
// send per message and its FAST mode sends zeros for the other, so it does not wait on it:
// the weight behind the unused tensor gets a zero gradient. SMART mode gives it none, as a
// local backward pass would.
TEST(DistAutogradTest, AReplyWhoseTensorsReachTheLossOnlyInPartDoesNotStallFastMode) {
  World w(2);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  Tensor lx = kernels::Clone(x).set_requires_grad(true);
  autograd::Backward({Sum(Tanh(lx))});
  for (Mode mode : {Mode::kFast, Mode::kSmart}) {
    SCOPED_TRACE(mode == Mode::kFast ? "FAST" : "SMART");
    Context ctx(w.engine(0));
    absl::StatusOr<std::vector<Tensor>> heads = w.agent(0).Sync<std::vector<Tensor>>("worker1", "two_heads", x);
    ASSERT_TRUE(heads.ok()) << heads.status();
    ASSERT_EQ(heads->size(), 2u);
    ASSERT_TRUE((*heads)[1].requires_grad());
    BackwardOptions options;
    options.mode = mode;
    options.timeout = absl::Seconds(10);
    absl::Status s = ctx.Backward({Sum((*heads)[0])}, options);
    ASSERT_TRUE(s.ok()) << s;
    ExpectClose(ctx.GradOf(x), lx.grad(), "x");
    Tensor gw1 = w.engine(1).GradOf(ctx.id(), w.weights[1]);
    if (mode == Mode::kFast) {
      ASSERT_TRUE(gw1.defined()) << "FAST mode sends zeros for the unused head, as PyTorch does";
      EXPECT_EQ(kernels::MaxAbsDiff(gw1, Tensor::Zeros(gw1.sizes(), gw1.dtype())), 0.0);
    } else {
      EXPECT_FALSE(gw1.defined()) << "SMART mode: no gradient reaches w1";
    }
  }
}

TEST(DistAutogradTest, CycleBetweenTwoWorkers) {
  World w(2);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  Context ctx(w.engine(0));
  // w0 -> w1 (bounce) -> w0 (stage) -> back on w1 -> w0
  absl::StatusOr<Tensor> y = w.agent(0).Sync<Tensor>("worker1", "bounce", x, std::string("worker0"));
  ASSERT_TRUE(y.ok()) << y.status();
  absl::Status s = ctx.Backward({Sum(Mul(*y, *y))});
  ASSERT_TRUE(s.ok()) << s;

  Tensor lx = kernels::Clone(x).set_requires_grad(true);
  Tensor l0 = w.LocalWeight(0), l1 = w.LocalWeight(1);
  Tensor ly = Tanh(MatMul(Tanh(MatMul(Tanh(MatMul(lx, l1)), l0)), l1));
  autograd::Backward({Sum(Mul(ly, ly))});
  ExpectClose(ctx.GradOf(x), lx.grad(), "x");
  ExpectClose(ctx.GradOf(w.weights[0]), l0.grad(), "w0");
  ExpectClose(w.engine(1).GradOf(ctx.id(), w.weights[1]), l1.grad(), "w1 (used twice)");
}

TEST(DistAutogradTest, AParameterFetchedWithToHereGetsItsGradientOnItsOwner) {
  World w(2);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  absl::StatusOr<RRef<Tensor>> p = w.agent(0).Sync<RRef<Tensor>>("worker1", "weight_rref");
  ASSERT_TRUE(p.ok()) << p.status();
  {
    Context ctx(w.engine(0));
    absl::StatusOr<Tensor> fetched = p->ToHere();
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    ASSERT_TRUE(fetched->requires_grad());
    ASSERT_TRUE(ctx.Backward({Sum(Tanh(MatMul(x, *fetched)))}).ok());

    Tensor lx = kernels::Clone(x).set_requires_grad(true);
    Tensor l1 = w.LocalWeight(1);
    autograd::Backward({Sum(Tanh(MatMul(lx, l1)))});
    ExpectClose(w.engine(1).GradOf(ctx.id(), w.weights[1]), l1.grad(), "w1 on its owner");
    ExpectClose(ctx.GradOf(x), lx.grad(), "x");
    EXPECT_FALSE(w.weights[1].grad().defined());
  }
}

TEST(DistAutogradTest, ConcurrentContextsNeverMixGradients) {
  World w(3);
  ASSERT_NE(w.group, nullptr);
  Tensor lx = Input().set_requires_grad(false);
  std::vector<Tensor> grads(2);
  std::vector<absl::Status> results(2);
  std::vector<std::thread> trainers;
  for (int t = 0; t < 2; ++t) {
    trainers.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        Tensor x = kernels::Clone(lx).set_requires_grad(true);
        Context ctx(w.engine(0));
        absl::StatusOr<Tensor> y = w.agent(0).Sync<Tensor>("worker1", "stage_then", x, std::string("worker2"));
        if (!y.ok()) {
          results[t] = y.status();
          return;
        }
        results[t] = ctx.Backward({Sum(*y)});
        if (!results[t].ok()) return;
        grads[t] = w.engine(1).GradOf(ctx.id(), w.weights[1]);
      }
    });
  }
  for (auto& t : trainers) t.join();
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];
  Tensor x = kernels::Clone(lx).set_requires_grad(true);
  Tensor l1 = w.LocalWeight(1), l2 = w.LocalWeight(2);
  autograd::Backward({Sum(Tanh(MatMul(Tanh(MatMul(x, l1)), l2)))});
  // Each context saw exactly one pass: no gradient of the other trainer leaked in.
  ExpectClose(grads[0], l1.grad(), "w1, trainer 0");
  ExpectClose(grads[1], l1.grad(), "w1, trainer 1");
}

// A worker holds a peer's contexts until the peer releases them: PeerLimits::max_contexts
// bounds how many; past it the peer's call fails, and another peer's go on.
TEST(DistAutogradTest, APeerPastItsContextsGetsResourceExhaustedWhileOthersGoOn) {
  rpc::PeerLimits limits;
  limits.max_contexts = 2;
  World w(3, nullptr, limits);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  {
    Context c1(w.engine(0));
    ASSERT_TRUE(w.agent(0).Sync<Tensor>("worker1", "stage", x).ok());
    Context c2(w.engine(0));
    ASSERT_TRUE(w.agent(0).Sync<Tensor>("worker1", "stage", x).ok());
    Context c3(w.engine(0));
    absl::StatusOr<Tensor> past = w.agent(0).Sync<Tensor>("worker1", "stage", x);
    EXPECT_EQ(past.status().code(), absl::StatusCode::kResourceExhausted) << past.status();
    EXPECT_NE(past.status().message().find("max_contexts"), std::string::npos) << past.status();
    std::thread other([&] {
      Context theirs(w.engine(2));
      absl::StatusOr<Tensor> y = w.agent(2).Sync<Tensor>("worker1", "stage", x);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_TRUE(theirs.Backward({Sum(*y)}).ok());
    });
    other.join();
  }
  // Released contexts make room.
  ASSERT_TRUE(w.engine(1).AwaitContexts([](size_t live) { return live == 0; }, absl::Now() + absl::Seconds(20)));
  Context again(w.engine(0));
  EXPECT_TRUE(w.agent(0).Sync<Tensor>("worker1", "stage", x).ok());
}

TEST(DistAutogradTest, RetainGraphAllowsASecondPassThatAccumulates) {
  World w(2);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  Context ctx(w.engine(0));
  Tensor loss = Sum(*w.agent(0).Sync<Tensor>("worker1", "stage", x));
  BackwardOptions keep;
  keep.retain_graph = true;
  keep.timeout = absl::Seconds(3);
  absl::Status first = ctx.Backward({loss}, keep);
  ASSERT_TRUE(first.ok()) << first;
  Tensor once = kernels::Clone(w.engine(1).GradOf(ctx.id(), w.weights[1]));
  ASSERT_TRUE(ctx.Backward({loss}).ok());
  ExpectClose(w.engine(1).GradOf(ctx.id(), w.weights[1]), kernels::MulScalar(once, 2.0), "w1 after two passes");
}

TEST(DistAutogradTest, AFailureInARemoteBackwardFailsThePassNamingTheWorker) {
  World w(3);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  Context ctx(w.engine(0));
  // x -> worker1 (stage) -> worker2 (fragile): the failure is two hops away.
  Tensor a = *w.agent(0).Sync<Tensor>("worker1", "stage", x);
  absl::StatusOr<Tensor> b = w.agent(0).Sync<Tensor>("worker2", "fragile", a);
  ASSERT_TRUE(b.ok()) << b.status();
  const absl::Time start = absl::Now();
  absl::Status s = ctx.Backward({Sum(*b)});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("worker2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("backward failed on purpose"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not a timeout
}

TEST(DistAutogradTest, ContextsOfADeadCreatorAreReclaimed) {
  World w(2);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  {
    Context ctx(w.engine(0));
    ASSERT_TRUE(w.agent(0).Sync<Tensor>("worker1", "stage", x).ok());
    EXPECT_EQ(w.engine(1).live_contexts(), 1u);
    ASSERT_TRUE(w.agent(0).Shutdown(/*graceful=*/false).ok());  // the creator is gone
    EXPECT_TRUE(w.engine(1).AwaitContexts([](size_t live) { return live == 0; }, absl::Now() + absl::Seconds(10)))
        << w.engine(1).live_contexts() << " context(s) left";
  }  // releasing it afterwards fails fast and harmlessly
  w.group.reset();
}

// Elastic groups (rpc agent.h): a worker that leaves the job mid-context. The backward
// pass of a context that sent through it ends at once with an error saying it left, and
// its contexts on the others are reclaimed; nothing waits.
TEST(DistAutogradTest, AContextThroughAWorkerThatLeftEndsWithAClearError) {
  World w(3);
  ASSERT_NE(w.group, nullptr);
  Tensor x = Input();
  {
    Context ctx(w.engine(0));
    absl::StatusOr<Tensor> y = w.agent(0).Sync<Tensor>("worker1", "stage_then", x, std::string("worker2"));
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(w.engine(2).live_contexts(), 1u);
    ASSERT_TRUE(w.agent(2).Leave().ok());
    const absl::Time start = absl::Now();
    absl::Status s = ctx.Backward({Sum(Mul(*y, *y))}, BackwardOptions{.timeout = absl::Seconds(60)});
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "ended: worker2 is unavailable: it left the job")) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    // A new context does not reach it either.
    Context next(w.engine(0));
    absl::StatusOr<Tensor> again = w.agent(0).Sync<Tensor>("worker2", "stage", x);
    EXPECT_TRUE(absl::StrContains(again.status().message(), "left the job")) << again.status();
  }
  EXPECT_TRUE(w.engine(1).AwaitContexts([](size_t live) { return live == 0; }, absl::Now() + absl::Seconds(10)))
      << w.engine(1).live_contexts() << " context(s) left on worker1";
  std::thread t1([&] { EXPECT_TRUE(w.agent(1).Shutdown().ok()); });
  EXPECT_TRUE(w.agent(0).Shutdown().ok());
  t1.join();
  w.group.reset();
}

// ------------------------------------------------------------------ under faults

// The chain of ChainAcrossThreeWorkersMatchesLocalGradients, `rounds` times; returns how
// many rounds gave exact gradients. A round that fails must fail in time, naming a worker.
int RunChains(World& w, int rounds, absl::Duration call_timeout) {
  Tensor x = Input();
  std::vector<Tensor> lw{w.LocalWeight(0), w.LocalWeight(1), w.LocalWeight(2)};
  Tensor lx = kernels::Clone(x).set_requires_grad(true);
  Tensor ly = Tanh(MatMul(Tanh(MatMul(Tanh(MatMul(lx, lw[0])), lw[1])), lw[2]));
  autograd::Backward({Sum(Mul(ly, ly))});
  int exact = 0;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const absl::Time start = absl::Now();
    absl::Status s;
    {
      Context ctx(w.engine(0));
      absl::StatusOr<Tensor> y2 = w.agent(0).Sync<Tensor>("worker1", "stage_then", Tanh(MatMul(x, w.weights[0])),
                                                          std::string("worker2"), rpc::CallOptions{call_timeout});
      s = y2.status();
      if (s.ok()) s = ctx.Backward({Sum(Mul(*y2, *y2))}, BackwardOptions{.timeout = call_timeout});
      if (s.ok()) {
        ++exact;
        ExpectClose(ctx.GradOf(x), lx.grad(), "x");
        ExpectClose(ctx.GradOf(w.weights[0]), lw[0].grad(), "w0");
        ExpectClose(w.engine(1).GradOf(ctx.id(), w.weights[1]), lw[1].grad(), "w1");
        ExpectClose(w.engine(2).GradOf(ctx.id(), w.weights[2]), lw[2].grad(), "w2");
      }
    }  // released
    EXPECT_LT(absl::Now() - start, 2 * call_timeout + absl::Seconds(12)) << s;  // forward, backward, release
    if (!s.ok()) {
      EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded ||
                  s.code() == absl::StatusCode::kNotFound)
          << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "worker")) << "names no worker: " << s;
    }
  }
  return exact;
}

void ExpectNoContextsLeft(World& w) {
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(w.engine(r).AwaitContexts([](size_t live) { return live == 0; }, absl::Now() + absl::Seconds(20)))
        << "worker" << r << " keeps " << w.engine(r).live_contexts() << " context(s)";
  }
}

TEST(DistAutogradFaultTest, BackwardUnderRecoverableLinkFaultsIsExact) {
  auto faults = rpc::testing::InjectFaults("drop:0.05,delay:0ms-1ms,duplicate:0.05,reorder:4,seed:31");
  World w(3, faults);
  ASSERT_NE(w.group, nullptr);
  EXPECT_EQ(RunChains(w, 20, absl::Seconds(20)), 20);
  ExpectNoContextsLeft(w);
  rpc::testing::ExpectRepairedWithoutCloses(*faults);
}

TEST(DistAutogradFaultTest, UnderClosingConnectionsEveryPassEndsInTimeAndNoContextIsLeft) {
  auto faults = rpc::testing::InjectFaults("close_after:25,seed:32");
  World w(3, faults);
  ASSERT_NE(w.group, nullptr);
  const int exact = RunChains(w, 40, absl::Seconds(5));
  const rpc::FaultStats stats = faults->stats();
  EXPECT_GT(exact, 0) << stats.ToString();
  EXPECT_LT(exact, 40) << "no pass met a closing connection; " << stats.ToString();
  EXPECT_GE(stats.connections_closed, 3u) << stats.ToString();
  faults->Set(rpc::FaultSpec{});
  ExpectNoContextsLeft(w);
}

}  // namespace
}  // namespace gw::dist_autograd
