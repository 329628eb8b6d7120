// Unit: ConsistencyClock, the consistency protocol of one shard, without data or RPC:
// which data operations each push causes, when pulls may be served, and who is lagging.
#include "consistency_clock.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace gw::param_server::internal {
namespace {

// Records the data operations a push asked for, as letters: a(ccumulate), s(tep), n(ow),
// d(rop).
struct Recorder {
  std::string log;
  bool throw_on_accumulate = false;
  ConsistencyClock::Ops Ops() {
    return {[this] {
              if (throw_on_accumulate) throw std::runtime_error("bad gradient");
              log += 'a';
            },
            [this] { log += 's'; }, [this] { log += 'n'; }, [this] { log += 'd'; }};
  }
};

TEST(ConsistencyClockTest, SyncAppliesAStepOnceEveryTrainerPushedItAndCountsEachPushOnce) {
  ConsistencyClock clock(Consistency::kSync, 3, 0);
  Recorder r;
  EXPECT_TRUE(clock.Readable(0));
  EXPECT_FALSE(clock.Readable(1));
  ASSERT_TRUE(clock.Push(0, 0, r.Ops()).ok());
  ASSERT_TRUE(clock.Push(0, 2, r.Ops()).ok());
  ASSERT_TRUE(clock.Push(0, 2, r.Ops()).ok());  // a retry: counted once
  EXPECT_EQ(r.log, "aa");
  EXPECT_FALSE(clock.Readable(1));
  EXPECT_EQ(clock.Lagging(1), std::vector<int>{1});
  ASSERT_TRUE(clock.Push(0, 1, r.Ops()).ok());
  EXPECT_EQ(r.log, "aaas");  // the last push applies the step
  EXPECT_EQ(clock.applied(), 1);
  EXPECT_TRUE(clock.Readable(1));
  EXPECT_TRUE(clock.pushed().empty());
  ASSERT_TRUE(clock.Push(0, 1, r.Ops()).ok());  // a late retry of step 0: nothing
  EXPECT_EQ(r.log, "aaas");
  absl::Status ahead = clock.Push(5, 0, r.Ops());
  EXPECT_EQ(ahead.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ahead.message(), "push for step 5 while step 1 is being aggregated");
  EXPECT_EQ(clock.Push(1, 3, r.Ops()).code(), absl::StatusCode::kInvalidArgument);  // no trainer 3
  EXPECT_EQ(clock.Push(0, -1, r.Ops()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConsistencyClockTest, AFailedAccumulateDoesNotCountTheTrainer) {
  ConsistencyClock clock(Consistency::kSync, 2, 0);
  Recorder r;
  r.throw_on_accumulate = true;
  EXPECT_THROW((void)clock.Push(0, 0, r.Ops()), std::runtime_error);
  EXPECT_TRUE(clock.pushed().empty());
  r.throw_on_accumulate = false;
  ASSERT_TRUE(clock.Push(0, 0, r.Ops()).ok());  // its retry counts
  ASSERT_TRUE(clock.Push(0, 1, r.Ops()).ok());
  EXPECT_EQ(r.log, "aas");
}

TEST(ConsistencyClockTest, ARestoredClockJoinsTrainersThatAreAhead) {
  ConsistencyClock clock(Consistency::kSync, 2, 0);
  clock.Restore(/*applied=*/3, {{0, {}}, {1, {}}}, {1});  // checkpoint taken with trainer 1 in step 3
  EXPECT_TRUE(clock.restored());
  Recorder r;
  // The trainers are at step 7 (the steps in between were lost with the server).
  ASSERT_TRUE(clock.Push(7, 0, r.Ops()).ok());
  EXPECT_EQ(r.log, "da");  // the checkpoint's partial step is dropped, the push joins step 7
  EXPECT_EQ(clock.applied(), 7);
  ASSERT_TRUE(clock.Push(7, 1, r.Ops()).ok());
  EXPECT_EQ(r.log, "daas");
  EXPECT_FALSE(clock.restored());  // once a step completed, a later clock is an error again
  EXPECT_EQ(clock.Push(10, 0, r.Ops()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ConsistencyClockTest, AsyncAppliesEveryPushAtOnce) {
  ConsistencyClock clock(Consistency::kAsync, 2, 0);
  Recorder r;
  ASSERT_TRUE(clock.Push(0, 0, r.Ops()).ok());
  ASSERT_TRUE(clock.Push(0, 0, r.Ops()).ok());  // no identity: applied again
  ASSERT_TRUE(clock.Push(9, 77, r.Ops()).ok()); // any clock, any trainer
  EXPECT_EQ(r.log, "nnn");
  EXPECT_TRUE(clock.Readable(1000));
  EXPECT_TRUE(clock.Lagging(1000).empty());
}

TEST(ConsistencyClockTest, BoundedStalenessLetsATrainerRunAtMostSAhead) {
  ConsistencyClock clock(Consistency::kBoundedStaleness, 2, /*staleness=*/2);
  Recorder r;
  // Trainer 0 races ahead; trainer 1 has pushed nothing.
  for (int64_t c = 0; c < 4; ++c) ASSERT_TRUE(clock.Push(c, 0, r.Ops()).ok());
  EXPECT_EQ(r.log, "nnnn");
  EXPECT_TRUE(clock.Readable(2));   // needs everyone at clock >= 0
  EXPECT_FALSE(clock.Readable(3));  // needs trainer 1 at clock 1
  EXPECT_EQ(clock.Lagging(3), std::vector<int>{1});
  ASSERT_TRUE(clock.Push(0, 1, r.Ops()).ok());
  EXPECT_TRUE(clock.Readable(3));
  ASSERT_TRUE(clock.Push(0, 1, r.Ops()).ok());  // a retry: not applied again
  EXPECT_EQ(r.log, "nnnnn");
  EXPECT_EQ(clock.trainers().at(0).next, 4);
  EXPECT_EQ(clock.trainers().at(1).next, 1);
  EXPECT_EQ(clock.Push(0, 2, r.Ops()).code(), absl::StatusCode::kInvalidArgument);
}

// Elastic trainers: a synchronous table takes a trainer at a step boundary only, and a
// step completes with the trainers that take part in it.
TEST(ConsistencyClockTest, SyncTrainersJoinAtAStepBoundaryAndLeaveAfterTheirLastPush) {
  ConsistencyClock clock(Consistency::kSync, 2, 0);
  Recorder r;
  ASSERT_TRUE(clock.Push(0, 0, r.Ops()).ok());
  EXPECT_EQ(clock.JoinHint(), 0);
  EXPECT_EQ(clock.Join(5, 0, r.Ops()), 0);  // the open step: it waits for trainer 5 too
  ASSERT_TRUE(clock.Push(0, 1, r.Ops()).ok());
  EXPECT_EQ(r.log, "aa");
  EXPECT_EQ(clock.Lagging(1), std::vector<int>{5});
  // Another server had passed step 0 meanwhile: the client asks again with step 1, and
  // step 0 here completes without trainer 5.
  EXPECT_EQ(clock.Join(5, 1, r.Ops()), 1);
  EXPECT_EQ(r.log, "aas");
  EXPECT_EQ(clock.applied(), 1);
  EXPECT_EQ(clock.Join(6, 0, r.Ops()), 1);  // step 0 is over: ask again with 1
  EXPECT_EQ(clock.Push(0, 6, r.Ops()).code(), absl::StatusCode::kOk);  // a late retry of step 0: nothing
  EXPECT_EQ(clock.Push(1, 6, r.Ops()).code(), absl::StatusCode::kInvalidArgument);  // never admitted
  // Step 1: three trainers.
  for (int t : {0, 1}) ASSERT_TRUE(clock.Push(1, t, r.Ops()).ok());
  EXPECT_EQ(clock.taking_part(), 3);
  ASSERT_TRUE(clock.Push(1, 5, r.Ops()).ok());
  EXPECT_EQ(r.log, "aasaaas");
  // Trainer 1 pushes step 2, then leaves after it; trainer 0 leaves after step 1 (it
  // never pushes step 2): step 2 completes with 1 and 5.
  ASSERT_TRUE(clock.Push(2, 1, r.Ops()).ok());
  clock.Leave(1, 2, r.Ops());
  clock.Leave(0, 1, r.Ops());
  EXPECT_EQ(clock.Lagging(3), std::vector<int>{5});
  ASSERT_TRUE(clock.Push(2, 5, r.Ops()).ok());
  EXPECT_EQ(r.log, "aasaaasaas");
  EXPECT_EQ(clock.applied(), 3);
  EXPECT_EQ(clock.taking_part(), 1);
  absl::Status gone = clock.Push(3, 1, r.Ops());
  EXPECT_EQ(gone.code(), absl::StatusCode::kInvalidArgument) << gone;
  // The last one leaving while the others already pushed completes the open step.
  ConsistencyClock two(Consistency::kSync, 2, 0);
  ASSERT_TRUE(two.Push(0, 0, r.Ops()).ok());
  two.Leave(1, -1, r.Ops());
  EXPECT_EQ(two.applied(), 1);
}

TEST(ConsistencyClockTest, BoundedStalenessTrainersJoinAtTheFrontAndStopHoldingOthersBackWhenTheyLeave) {
  ConsistencyClock clock(Consistency::kBoundedStaleness, 2, /*staleness=*/0);
  Recorder r;
  for (int64_t c = 0; c < 3; ++c) ASSERT_TRUE(clock.Push(c, 0, r.Ops()).ok());
  ASSERT_TRUE(clock.Push(0, 1, r.Ops()).ok());
  EXPECT_EQ(clock.JoinHint(), 3);
  EXPECT_EQ(clock.Join(2, 3, r.Ops()), 3);
  EXPECT_EQ(clock.Lagging(3), std::vector<int>{1});  // not the newcomer
  clock.Leave(1, 0, r.Ops());
  EXPECT_TRUE(clock.Readable(3));
  ASSERT_TRUE(clock.Push(3, 2, r.Ops()).ok());
  EXPECT_EQ(clock.Push(1, 1, r.Ops()).code(), absl::StatusCode::kInvalidArgument);  // it left
}

// A restored bounded-staleness table takes each trainer's first push at whatever clock it
// is (a resumed job starts at the checkpoint's step, possibly behind the restored
// clocks); after it, a push long passed is refused again.
TEST(ConsistencyClockTest, ARestoredBoundedStalenessTableTakesEachTrainersFirstPushWhereItIs) {
  ConsistencyClock clock(Consistency::kBoundedStaleness, 2, 2);
  Recorder r;
  clock.Restore(0, {{0, {0, ConsistencyClock::kForever, 10}}, {1, {0, ConsistencyClock::kForever, 9}}}, {});
  ASSERT_TRUE(clock.Push(4, 0, r.Ops()).ok());
  ASSERT_TRUE(clock.Push(4, 1, r.Ops()).ok());
  EXPECT_EQ(r.log, "nn") << "both applied, though behind the restored clocks";
  ASSERT_TRUE(clock.Push(4, 0, r.Ops()).ok());  // a retry of it: not applied again
  EXPECT_EQ(r.log, "nn");
  EXPECT_EQ(clock.Push(1, 0, r.Ops()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(clock.Push(5, 0, r.Ops()).ok());
  EXPECT_EQ(r.log, "nnn");
}

}  // namespace
}  // namespace gw::param_server::internal
