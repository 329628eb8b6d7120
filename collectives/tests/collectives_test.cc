// The collectives on agents running on threads of this process: every collective
// against a straightforward reference on 2 to 5 ranks, sub-groups, concurrent groups,
// ranks that disagree, and a rank that never issues.
#include "gradwire/collectives/collectives.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "collectives_job.h"
#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/kernels.h"
#include "samples.h"

namespace gw::collectives {
namespace {

using testing::Job;

// Integer-valued data (exact in float32, float64 and int64 whatever the order of sums).
Tensor Data(int rank, int64_t n, DType dtype, uint64_t seed = 7) {
  Generator gen(seed * 1000 + static_cast<uint64_t>(rank));
  Tensor u = Tensor::Uniform({n}, -50, 50, gen, DType::kFloat64);
  std::vector<double> v = u.ToVector<double>();
  for (double& x : v) x = std::floor(x);
  return kernels::ToDType(Tensor::FromVector(v, {n}), dtype);
}

Tensor Reference(const std::vector<Tensor>& inputs, ReduceOp op) {
  Tensor acc = kernels::ToDType(inputs[0], DType::kFloat64);
  for (size_t i = 1; i < inputs.size(); ++i) {
    Tensor x = kernels::ToDType(inputs[i], DType::kFloat64);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc = kernels::Add(acc, x);
    if (op == ReduceOp::kMax) acc = kernels::Maximum(acc, x);
    if (op == ReduceOp::kMin) acc = kernels::Neg(kernels::Maximum(kernels::Neg(acc), kernels::Neg(x)));
  }
  if (op == ReduceOp::kAvg) acc = kernels::Div(acc, Tensor::Scalar(static_cast<double>(inputs.size()), DType::kFloat64));
  return acc;
}

void ExpectEqual(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  EXPECT_EQ(kernels::MaxAbsDiff(kernels::Reshape(kernels::ToDType(got, DType::kFloat64), {got.numel()}),
                                kernels::Reshape(want, {want.numel()})),
            0.0)
      << what;
}

class AllReduceTest : public ::testing::TestWithParam<int> {};

TEST_P(AllReduceTest, EverySizeDTypeAndOpMatchesTheReference) {
  const int n = GetParam();
  Job job = Job::Start(n);
  ASSERT_NE(job.agents, nullptr);
  GroupOptions options;
  options.piece_bytes = 8 << 10;  // many pieces per ring chunk
  auto groups = job.Groups({}, options);
  // 0 and 1 elements, fewer elements than ranks, small (recursive doubling), and large
  // (ring) sizes that do not divide evenly.
  const std::vector<int64_t> sizes = {0, 1, 3, 1000, 40'009};
  for (DType dtype : {DType::kFloat64, DType::kFloat32, DType::kInt64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      if (dtype == DType::kInt64 && op == ReduceOp::kAvg) continue;
      for (int64_t size : sizes) {
        std::vector<Tensor> inputs;
        for (int r = 0; r < n; ++r) inputs.push_back(Data(r, size, dtype));
        const Tensor want = Reference(inputs, op);
        std::vector<Tensor> outs(static_cast<size_t>(n));
        job.OnEveryRank([&](int r) {
          Tensor t = kernels::Clone(inputs[static_cast<size_t>(r)]);
          auto done = groups[static_cast<size_t>(r)]->AllReduce(t, op).Get(absl::Seconds(30));
          ASSERT_TRUE(done.ok()) << done.status();
          EXPECT_TRUE(done->is_same(t));  // in place
          outs[static_cast<size_t>(r)] = t;
        });
        const std::string what =
            absl::StrCat(n, " ranks, ", DTypeName(dtype), " ", ReduceOpName(op), ", ", size, " elements");
        for (int r = 0; r < n; ++r) {
          if (op == ReduceOp::kAvg && dtype == DType::kFloat32) {
            EXPECT_LE(kernels::MaxAbsDiff(kernels::ToDType(outs[static_cast<size_t>(r)], DType::kFloat64), want), 1e-5)
                << what;
          } else {
            ExpectEqual(outs[static_cast<size_t>(r)], want, what);
          }
          // Every member holds the same bits.
          EXPECT_EQ(kernels::MaxAbsDiff(outs[static_cast<size_t>(r)], outs[0]), 0.0) << what;
        }
      }
    }
  }
}

TEST_P(AllReduceTest, TheRingHandlesChunksWithNoElements) {
  const int n = GetParam();
  Job job = Job::Start(n);
  ASSERT_NE(job.agents, nullptr);
  GroupOptions options;
  options.small_bytes = 0;  // the ring even for 0 and 1 elements: chunks of 0 elements
  auto groups = job.Groups({}, options);
  for (int64_t size : {0, 1, 3, 7}) {
    std::vector<Tensor> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(Data(r, size, DType::kFloat64));
    const Tensor want = Reference(inputs, ReduceOp::kSum);
    job.OnEveryRank([&](int r) {
      Tensor t = kernels::Clone(inputs[static_cast<size_t>(r)]);
      auto done = groups[static_cast<size_t>(r)]->AllReduce(t).Get(absl::Seconds(30));
      ASSERT_TRUE(done.ok()) << done.status();
      ExpectEqual(t, want, absl::StrCat(n, " ranks, ring, ", size, " elements"));
    });
  }
}

TEST_P(AllReduceTest, MaxAndMinOfNaNAndSignedZerosAreTheSameBitsOnEveryMember) {
  const int n = GetParam();
  Job job = Job::Start(n);
  ASSERT_NE(job.agents, nullptr);
  auto groups = job.Groups();
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<std::vector<double>> outs(static_cast<size_t>(n));
    job.OnEveryRank([&](int r) {
      const double nan = std::nan("");
      Tensor t = Tensor::FromVector<double>({r == 1 ? nan : 1.0, r % 2 == 0 ? 0.0 : -0.0, r == 0 ? nan : 2.0}, {3});
      ASSERT_TRUE(groups[static_cast<size_t>(r)]->AllReduce(t, op).Get(absl::Seconds(30)).ok());
      outs[static_cast<size_t>(r)] = t.ToVector<double>();
    });
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(std::memcmp(outs[static_cast<size_t>(r)].data(), outs[0].data(), 3 * sizeof(double)), 0)
          << ReduceOpName(op) << " on rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduceTest, ::testing::Values(2, 3, 4, 5));

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, BroadcastAllGatherReduceScatterAllToAllAndBarrier) {
  const int n = GetParam();
  Job job = Job::Start(n);
  ASSERT_NE(job.agents, nullptr);
  GroupOptions options;
  options.small_bytes = 4 << 10;  // both the small and the large algorithms below
  auto groups = job.Groups({}, options);
  for (int64_t size : {int64_t{0}, int64_t{5}, int64_t{3001}}) {
    const std::string what = absl::StrCat(n, " ranks, ", size, " elements");
    // Broadcast from every root, into a [size, 1] tensor.
    for (int root = 0; root < n; ++root) {
      Tensor want = Data(root, size, DType::kFloat64);
      job.OnEveryRank([&](int r) {
        Tensor t = kernels::Reshape(Data(r, size, DType::kFloat64), {size, 1});
        auto done = groups[static_cast<size_t>(r)]->Broadcast(t, root).Get(absl::Seconds(30));
        ASSERT_TRUE(done.ok()) << done.status();
        ExpectEqual(t, want, absl::StrCat(what, ", broadcast from ", root, " to ", r));
      });
    }
    // AllGather.
    job.OnEveryRank([&](int r) {
      auto got = groups[static_cast<size_t>(r)]->AllGather(Data(r, size, DType::kInt64)).Get(absl::Seconds(30));
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), static_cast<size_t>(n));
      for (int s = 0; s < n; ++s) {
        ExpectEqual((*got)[static_cast<size_t>(s)], kernels::ToDType(Data(s, size, DType::kInt64), DType::kFloat64),
                    absl::StrCat(what, ", allgather on ", r, " of ", s));
      }
    });
    // ReduceScatter: block b has size + b elements.
    job.OnEveryRank([&](int r) {
      std::vector<Tensor> inputs;
      for (int b = 0; b < n; ++b) inputs.push_back(Data(r * 10 + b, size + b, DType::kFloat64));
      auto got = groups[static_cast<size_t>(r)]->ReduceScatter(inputs, ReduceOp::kSum).Get(absl::Seconds(30));
      ASSERT_TRUE(got.ok()) << got.status();
      std::vector<Tensor> column;
      for (int s = 0; s < n; ++s) column.push_back(Data(s * 10 + r, size + r, DType::kFloat64));
      ExpectEqual(*got, Reference(column, ReduceOp::kSum), absl::StrCat(what, ", reduce_scatter on ", r));
    });
    // AllToAll: member s sends member d a tensor of s + d rows of `size`-derived data.
    job.OnEveryRank([&](int r) {
      std::vector<Tensor> inputs;
      for (int d = 0; d < n; ++d) inputs.push_back(Data(r * 100 + d, size + r + d, DType::kFloat32));
      auto got = groups[static_cast<size_t>(r)]->AllToAll(inputs).Get(absl::Seconds(30));
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), static_cast<size_t>(n));
      for (int s = 0; s < n; ++s) {
        ExpectEqual((*got)[static_cast<size_t>(s)],
                    kernels::ToDType(Data(s * 100 + r, size + s + r, DType::kFloat32), DType::kFloat64),
                    absl::StrCat(what, ", all_to_all from ", s, " to ", r));
      }
    });
  }
  // A barrier completes on every member.
  job.OnEveryRank([&](int r) { EXPECT_TRUE(groups[static_cast<size_t>(r)]->Barrier().Get(absl::Seconds(30)).ok()); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::Values(2, 3, 4, 5));

// A training loop's last allreduce, then Close() (or the end of the program) on every
// rank at once: a collective that completed on one rank completes on every rank, whatever
// that rank does next (its close used to overtake its answers to the peers' last pieces,
// which then failed "worker0 is unavailable: it closed group"). Both algorithms: 4 KiB
// (recursive doubling) up to 64 MiB (the ring, in 4 MiB pieces).
class CloseAfterLastCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(CloseAfterLastCollectiveTest, TheLastAllReduceCompletesOnEveryRankWhenEachClosesAtOnce) {
  const int n = GetParam();
  Job job = Job::Start(n);
  ASSERT_NE(job.agents, nullptr);
  struct Case {
    int64_t bytes;
    int times;
  };
  for (const Case c : {Case{4 << 10, 40}, Case{1 << 20, 10}, Case{64 << 20, 2}}) {
    const int64_t numel = c.bytes / 4;
    for (int round = 0; round < c.times; ++round) {
      GroupOptions options;
      options.name = absl::StrCat("close-", c.bytes, "-", round);
      auto groups = job.Groups({}, options);
      job.OnEveryRank([&](int r) {
        ProcessGroup& g = *groups[static_cast<size_t>(r)];
        Tensor t = Tensor::Full({numel}, static_cast<double>(r + 1));
        auto first = g.AllReduce(t).Get(absl::Seconds(60));  // a step of the loop
        ASSERT_TRUE(first.ok()) << first.status();
        auto last = g.AllReduce(t).Get(absl::Seconds(60));  // the last one, then Close at once
        g.Close();
        groups[static_cast<size_t>(r)].reset();  // and the group is gone before the others' closes arrive
        ASSERT_TRUE(last.ok()) << n << " ranks, " << c.bytes << " bytes, round " << round << ", rank " << r << ": "
                               << last.status();
        const float want = static_cast<float>(n * (n + 1) / 2 * n);
        const std::vector<float> v = t.ToVector<float>();
        EXPECT_EQ(v.front(), want);
        EXPECT_EQ(v.back(), want);
      });
      if (::testing::Test::HasFailure()) return;
    }
  }
  // The members' closes that arrived after a group was gone were dropped, not held for a
  // group "not made yet" (they would fill the layer's bound on early messages): an
  // all_to_all on a fresh group (every pair exchanges, after those closes on each
  // connection) then leaves nothing held.
  auto flush = job.Groups({}, GroupOptions{.name = "flush"});
  job.OnEveryRank([&](int r) {
    std::vector<Tensor> inputs(static_cast<size_t>(n), Tensor::Ones({2}));
    EXPECT_TRUE(flush[static_cast<size_t>(r)]->AllToAll(inputs).Get(absl::Seconds(30)).ok());
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(job.layers[static_cast<size_t>(r)]->early(), 0u) << "rank " << r;
  // What the closes did to a later collective: each member fails it naming a closer.
  auto groups = job.Groups({}, GroupOptions{.name = "after"});
  groups[0]->Close();
  job.OnEveryRank([&](int r) {
    if (r == 0) return;
    auto next = groups[static_cast<size_t>(r)]->AllReduce(Tensor::Ones({4})).Get(absl::Seconds(30));
    EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable) << next.status();
    EXPECT_NE(next.status().message().find("worker0"), std::string::npos) << next.status();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CloseAfterLastCollectiveTest, ::testing::Values(2, 3, 4, 5));

// The end of a program: the last allreduce, Close, then the agent's graceful Shutdown, on
// every rank at once (bench_collectives' members end this way).
TEST(CollectivesTest, TheLastAllReduceCompletesOnEveryRankThatThenShutsDown) {
  for (int round = 0; round < 3; ++round) {
    Job job = Job::Start(3);
    ASSERT_NE(job.agents, nullptr);
    auto groups = job.Groups();
    job.OnEveryRank([&](int r) {
      Tensor t = Tensor::Full({int64_t{1} << 18}, static_cast<double>(r));  // 1 MiB: the ring
      auto last = groups[static_cast<size_t>(r)]->AllReduce(t).Get(absl::Seconds(60));
      groups[static_cast<size_t>(r)]->Close();
      EXPECT_TRUE(last.ok()) << "round " << round << ", rank " << r << ": " << last.status();
      EXPECT_EQ(t.ToVector<float>().back(), 3.0f);
      EXPECT_TRUE((*job.agents)[r].Shutdown().ok());
    });
  }
}

TEST(CollectivesTest, CollectivesRunInIssueOrderAndOverlapTheCaller) {
  Job job = Job::Start(3);
  ASSERT_NE(job.agents, nullptr);
  auto groups = job.Groups();
  job.OnEveryRank([&](int r) {
    std::vector<Tensor> tensors;
    std::vector<Future<Tensor>> pending;
    for (int i = 0; i < 20; ++i) {
      tensors.push_back(Tensor::Full({i % 2 == 0 ? 7 : 70'000}, r + i, DType::kFloat64));
      pending.push_back(groups[static_cast<size_t>(r)]->AllReduce(tensors.back()));
    }
    for (int i = 0; i < 20; ++i) {
      auto done = pending[static_cast<size_t>(i)].Get(absl::Seconds(30));
      ASSERT_TRUE(done.ok()) << done.status();
      EXPECT_EQ(done->ToVector<double>()[0], 0 + 1 + 2 + 3 * i) << "collective " << i;
    }
  });
}

TEST(CollectivesTest, SubGroupsAndConcurrentGroupsDoNotMix) {
  Job job = Job::Start(4);
  ASSERT_NE(job.agents, nullptr);
  auto world = job.Groups();
  auto low = job.Groups({0, 1, 2});
  auto high = job.Groups({1, 2, 3});
  auto twin = job.Groups({1, 2, 3});  // a second group over the same ranks
  EXPECT_EQ(low[0]->rank(), 0);
  EXPECT_EQ(high[3]->rank(), 2);
  EXPECT_EQ(high[1]->size(), 3);
  job.OnEveryRank([&](int r) {
    const auto i = static_cast<size_t>(r);
    for (int round = 0; round < 5; ++round) {
      std::vector<std::pair<Future<Tensor>, double>> pending;
      auto add = [&](const std::shared_ptr<ProcessGroup>& g, double value, double want, int64_t size) {
        if (g) pending.emplace_back(g->AllReduce(Tensor::Full({size}, value, DType::kFloat64)), want);
      };
      add(world[i], r, 0 + 1 + 2 + 3, 20'000);
      add(low[i], 10 * r, 10 * (0 + 1 + 2), 9);
      add(high[i], 100 * r, 100 * (1 + 2 + 3), 20'000);
      add(twin[i], 1000 * r, 1000 * (1 + 2 + 3), 9);
      for (auto& [f, want] : pending) {
        auto done = f.Get(absl::Seconds(30));
        ASSERT_TRUE(done.ok()) << done.status();
        EXPECT_EQ(done->ToVector<double>().back(), want);
      }
    }
  });
}

TEST(CollectivesTest, NonContiguousTensorsAreReducedInPlace) {
  Job job = Job::Start(2);
  ASSERT_NE(job.agents, nullptr);
  auto groups = job.Groups();
  job.OnEveryRank([&](int r) {
    Tensor base = kernels::Reshape(Tensor::Arange(0, 12, 1, DType::kFloat64), {3, 4});
    Tensor t = kernels::Transpose(base, 0, 1);  // a view, not contiguous
    ASSERT_FALSE(t.is_contiguous());
    ASSERT_TRUE(groups[static_cast<size_t>(r)]->AllReduce(t).Get(absl::Seconds(30)).ok());
    EXPECT_EQ(kernels::MaxAbsDiff(base, kernels::MulScalar(kernels::Reshape(Tensor::Arange(0, 12, 1, DType::kFloat64), {3, 4}), 2)), 0.0);
  });
}

TEST(CollectivesTest, RanksThatDisagreeFailOnEveryMemberNamingThemAndTheGroupGoesOn) {
  for (int64_t odd_size : {int64_t{6}, int64_t{100'000}}) {  // small and ring algorithms
    Job job = Job::Start(3);
    ASSERT_NE(job.agents, nullptr);
    auto groups = job.Groups();
    job.OnEveryRank([&](int r) {
      auto& g = *groups[static_cast<size_t>(r)];
      const int64_t size = r == 2 ? odd_size : 5;
      auto bad = g.AllReduce(Tensor::Ones({size}, DType::kFloat32)).Get(absl::Seconds(30));
      ASSERT_FALSE(bad.ok());
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
      EXPECT_NE(bad.status().message().find("rank 2 (worker2)"), std::string::npos) << bad.status();
      EXPECT_NE(bad.status().message().find(absl::StrCat("[", odd_size, "]")), std::string::npos) << bad.status();
      // A dtype that differs, too.
      auto dtype = g.AllReduce(Tensor::Ones({4}, r == 1 ? DType::kFloat64 : DType::kFloat32)).Get(absl::Seconds(30));
      ASSERT_FALSE(dtype.ok());
      EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument) << dtype.status();
      EXPECT_NE(dtype.status().message().find("float64"), std::string::npos) << dtype.status();
      // An int64 average is refused everywhere, even though only rank 0 asks for it wrongly.
      auto avg = g.AllReduce(Tensor::Ones({4}, DType::kInt64), r == 0 ? ReduceOp::kAvg : ReduceOp::kSum)
                     .Get(absl::Seconds(30));
      EXPECT_EQ(avg.status().code(), absl::StatusCode::kInvalidArgument) << avg.status();
      // The group still works.
      auto good = g.AllReduce(Tensor::Ones({5}, DType::kFloat32)).Get(absl::Seconds(30));
      ASSERT_TRUE(good.ok()) << good.status();
      EXPECT_EQ(good->ToVector<float>()[0], 3.0f);
    });
  }
}

TEST(CollectivesTest, ABroadcastWhoseMembersDisagreeFailsOnTheRootToo) {
  Job job = Job::Start(2);
  ASSERT_NE(job.agents, nullptr);
  auto groups = job.Groups();
  job.OnEveryRank([&](int r) {
    auto done = groups[static_cast<size_t>(r)]->Broadcast(Tensor::Ones({r == 0 ? 4 : 5}), 0).Get(absl::Seconds(30));
    EXPECT_EQ(done.status().code(), absl::StatusCode::kInvalidArgument) << "rank " << r << ": " << done.status();
  });
}

TEST(CollectivesTest, AMemberThatClosesTheGroupFailsTheOthersAtOnce) {
  Job job = Job::Start(3);
  ASSERT_NE(job.agents, nullptr);
  auto groups = job.Groups();
  groups[2]->Close();  // tells the others: their next collective fails naming worker2
  job.OnEveryRank([&](int r) {
    if (r == 2) return;
    const absl::Time start = absl::Now();
    auto done = groups[static_cast<size_t>(r)]->AllReduce(Tensor::Ones({4})).Get(absl::Seconds(30));
    EXPECT_EQ(done.status().code(), absl::StatusCode::kUnavailable) << done.status();
    EXPECT_NE(done.status().message().find("worker2"), std::string::npos) << done.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // not the 60 s deadline
  });
}

TEST(CollectivesTest, AMemberThatNeverIssuesMakesTheOthersFailByTheDeadlineNamingIt) {
  Job job = Job::Start(3);
  ASSERT_NE(job.agents, nullptr);
  GroupOptions options;
  options.timeout = absl::Milliseconds(800);
  auto groups = job.Groups({}, options);
  job.OnEveryRank([&](int r) {
    if (r == 1) return;  // never issues
    auto done = groups[static_cast<size_t>(r)]->AllReduce(Tensor::Ones({8})).Get(absl::Seconds(30));
    ASSERT_FALSE(done.ok());
    // Rank 0 waits for rank 1 (its partner) and times out naming it; rank 2 (folded into
    // rank 0) waits for rank 0 and times out naming that one. Whichever deadline fires
    // first is told to the others, so each member names rank 1 or rank 0. (Telling which
    // member froze is the heartbeats' job, not a collective's deadline.)
    EXPECT_EQ(done.status().code(), absl::StatusCode::kDeadlineExceeded) << done.status();
    const std::string message(done.status().message());
    EXPECT_TRUE(message.find("nothing from rank 1 (worker1)") != std::string::npos ||
                message.find("nothing from rank 0 (worker0)") != std::string::npos)
        << message;
  });
  // The group is broken for good: the next collective fails at once.
  auto next = groups[0]->AllReduce(Tensor::Ones({8})).Get(absl::Seconds(5));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kDeadlineExceeded) << next.status();
}

// What a metrics endpoint shows of a collective that a member never issues: the members
// that issued it run it (its number and for how long), the one that did not has issued
// nothing; once the deadline fails it, it counts as completed and failed.
TEST(CollectivesTest, TheStatisticsShowWhoIssuedTheCollectiveTheOthersWaitFor) {
  Job job = Job::Start(3);
  ASSERT_NE(job.agents, nullptr);
  GroupOptions options;
  options.name = "ddp";
  options.timeout = absl::Seconds(2);
  auto groups = job.Groups({}, options);
  Future<Tensor> at0 = groups[0]->AllReduce(Tensor::Ones({8}));
  Future<Tensor> at2 = groups[2]->AllReduce(Tensor::Ones({8}));
  using rpc::testing::SampleValue;
  const std::map<std::string, std::string> ddp = {{"group", "ddp"}};
  // Rank 0's group thread takes collective #0 and waits for rank 1 in it.
  EXPECT_EQ(rpc::testing::AwaitSampleValue([&] { return (*job.agents)[0].statistics().Collect(); },
                                           "gradwire_collectives_running", ddp, 0),
            0);
  const std::vector<rpc::Sample> waiting = (*job.agents)[0].statistics().Collect();
  EXPECT_EQ(SampleValue(waiting, "gradwire_collectives_issued_total", ddp), 1);
  EXPECT_EQ(SampleValue(waiting, "gradwire_collectives_completed_total", ddp), 0);
  EXPECT_GT(SampleValue(waiting, "gradwire_collectives_running_seconds", ddp), 0);
  const std::vector<rpc::Sample> idle = (*job.agents)[1].statistics().Collect();
  EXPECT_EQ(SampleValue(idle, "gradwire_collectives_issued_total", ddp), 0);
  EXPECT_EQ(SampleValue(idle, "gradwire_collectives_running", ddp), -1);
  EXPECT_FALSE(at0.Get(absl::Seconds(30)).ok());
  EXPECT_FALSE(at2.Get(absl::Seconds(30)).ok());
  const std::vector<rpc::Sample> after = (*job.agents)[0].statistics().Collect();
  EXPECT_EQ(SampleValue(after, "gradwire_collectives_completed_total", ddp), 1);
  EXPECT_EQ(SampleValue(after, "gradwire_collectives_failed_total", ddp), 1);
  EXPECT_EQ(SampleValue(after, "gradwire_collectives_running", ddp), -1);
}

TEST(CollectivesTest, AGroupMadeLateOnOneMemberGetsTheDataSentBeforeIt) {
  Job job = Job::Start(2);
  ASSERT_NE(job.agents, nullptr);
  auto early = job.layers[0]->NewGroup();
  ASSERT_TRUE(early.ok());
  Future<Tensor> pending = (*early)->AllReduce(Tensor::Full({3}, 2.0));
  // Rank 0's data reaches rank 1 before its group exists, and waits there for it.
  ASSERT_TRUE(job.layers[1]->AwaitEarly(1, absl::Now() + absl::Seconds(30)));
  auto late = job.layers[1]->NewGroup();
  ASSERT_TRUE(late.ok());
  auto mine = (*late)->AllReduce(Tensor::Full({3}, 5.0)).Get(absl::Seconds(30));
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->ToVector<float>()[0], 7.0f);
  auto theirs = pending.Get(absl::Seconds(30));
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_EQ(theirs->ToVector<float>()[2], 7.0f);
  EXPECT_EQ(job.layers[1]->early(), 0u);  // handed to the group
}

TEST(CollectivesTest, BadGroupsAndInputsAreRefused) {
  Job job = Job::Start(3);
  ASSERT_NE(job.agents, nullptr);
  EXPECT_EQ(job.layers[0]->NewGroup({0, 7}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.layers[0]->NewGroup({0, 0, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.layers[0]->NewGroup({1, 2}).status().code(), absl::StatusCode::kInvalidArgument);
  auto installed_twice = Collectives::Install((*job.agents)[0]);
  EXPECT_EQ(installed_twice.status().code(), absl::StatusCode::kAlreadyExists);
  auto groups = job.Groups();
  job.OnEveryRank([&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    EXPECT_EQ(g.Broadcast(Tensor::Ones({2}), 3).Get(absl::Seconds(30)).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(g.ReduceScatter({Tensor::Ones({2})}).Get(absl::Seconds(30)).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(g.AllReduce(Tensor::Ones({2}, DType::kBool)).Get(absl::Seconds(30)).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(g.Barrier().Get(absl::Seconds(30)).ok());
  });
  groups[0]->Close();
  EXPECT_EQ(groups[0]->Barrier().Get(absl::Seconds(5)).status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace gw::collectives
