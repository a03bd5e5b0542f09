// num_workers = "auto"'s rule (gpufeed/loader/thread_tuner.h) on made-up measurements: the
// thread count it settles on for consumers of known speed, the feedback from data wait, and the
// hysteresis that keeps one slow step or a validation pause from taking threads away.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "gpufeed/loader/thread_tuner.h"

using gpufeed::loader::ThreadDecision;
using gpufeed::loader::ThreadTuner;
using gpufeed::loader::ThreadTunerOptions;

namespace {

// Feeds `batches` batches of `samples` with the given consumer step and wait; returns the
// decisions made.
std::vector<ThreadDecision> feed(ThreadTuner& t, int batches, int64_t samples, double step_s, double wait_s,
                                 double cost_s, int64_t epoch = 0) {
  std::vector<ThreadDecision> out;
  for (int b = 0; b < batches; ++b) {
    if (auto d = t.observe(epoch, b, samples, step_s, wait_s, cost_s)) out.push_back(*d);
  }
  return out;
}

ThreadTunerOptions budget(int n) {
  ThreadTunerOptions o;
  o.budget = n;
  return o;
}

}  // namespace

TEST(ThreadTuner, ASlowConsumerGetsDemandTimesCostWithHeadroomAfterTwoWindows) {
  // 32 samples every 10 ms = 3200 samples/s at 1 ms a sample: 3.2 threads, 4 with 25%.
  ThreadTuner t(budget(8), 8);
  EXPECT_TRUE(feed(t, 4, 32, 0.010, 0, 0.001).empty()) << "one window is not enough to lower";
  EXPECT_EQ(t.threads(), 8);
  const auto d = feed(t, 4, 32, 0.010, 0, 0.001);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].from, 8);
  EXPECT_EQ(d[0].to, 4);
  EXPECT_EQ(d[0].number, 0);
  EXPECT_EQ(d[0].batch, 3);
  EXPECT_NEAR(d[0].demand_per_s, 3200, 1e-6);
  EXPECT_NEAR(d[0].needed, 3.2, 1e-9);
  EXPECT_NEAR(d[0].sample_cost_us, 1000, 1e-6);
  EXPECT_NE(d[0].why.find("3.20 threads needed"), std::string::npos) << d[0].why;
  EXPECT_EQ(t.threads(), 4);
  // Steady: nothing more to decide.
  EXPECT_TRUE(feed(t, 40, 32, 0.010, 0, 0.001).empty());
}

TEST(ThreadTuner, OneThreadWhenOneIsEnoughAndTheWholeBudgetForAConsumerThatNeverWaitsToAsk) {
  ThreadTuner slow(budget(2), 2);
  const auto d = feed(slow, 8, 4, 0.050, 0, 0.002);  // 80 samples/s x 2 ms = 0.16 threads
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].to, 1);
  // The consumer speeds up past one thread (4 samples every 5 ms = 800/s x 2 ms = 1.6): up at
  // the end of the first window, no votes needed.
  const auto up = feed(slow, 4, 4, 0.005, 0, 0.002);
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0].to, 2);
  EXPECT_EQ(up[0].number, 1);

  ThreadTuner fast(budget(4), 1);
  const auto all = feed(fast, 4, 4, 0.0, 0.002, 0.002);  // asks again at once, and waits
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].to, 4);
  EXPECT_NE(all[0].why.find("input-bound"), std::string::npos) << all[0].why;
}

TEST(ThreadTuner, DataWaitAboveOnePercentAddsAThreadWhereTheEstimateSaysEnough) {
  // The estimate says 1 thread (0.5 needed), but the consumer waited 5% of the window.
  ThreadTuner t(budget(4), 1);
  const auto d = feed(t, 4, 10, 0.020, 0.001, 0.001);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].to, 2);
  EXPECT_NEAR(d[0].wait_fraction, 0.004 / 0.084, 1e-9);
  EXPECT_NE(d[0].why.find("data wait"), std::string::npos) << d[0].why;
  // Still waiting: one more again; at the budget it stays.
  EXPECT_EQ(feed(t, 4, 10, 0.020, 0.001, 0.001).at(0).to, 3);
  EXPECT_EQ(feed(t, 4, 10, 0.020, 0.001, 0.001).at(0).to, 4);
  EXPECT_TRUE(feed(t, 4, 10, 0.020, 0.001, 0.001).empty());
}

TEST(ThreadTuner, HysteresisOneLongPauseOrOneDisagreeingWindowKeepsTheThreads) {
  ThreadTuner t(budget(4), 4);
  // A validation pause of 5 s in each window: the median step is still 10 ms (4 samples, 1 ms a
  // sample: 0.4 threads), so the pause does not change the estimate.
  t.observe(0, 0, 4, 0.010, 0, 0.001);
  t.observe(0, 1, 4, 5.0, 0, 0.001);
  t.observe(0, 2, 4, 0.010, 0, 0.001);
  EXPECT_FALSE(t.observe(0, 3, 4, 0.010, 0, 0.001).has_value()) << "one vote";
  // The next window waits (0.5%): lowering needs a quiet window, so the vote starts again.
  EXPECT_TRUE(feed(t, 4, 4, 0.010, 0.00005, 0.001).empty());
  EXPECT_EQ(t.threads(), 4);
  EXPECT_TRUE(feed(t, 4, 4, 0.010, 0, 0.001).empty()) << "one vote after the reset";
  const auto d = feed(t, 4, 4, 0.010, 0, 0.001);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].to, 1);
}

TEST(ThreadTuner, NothingIsDecidedBeforeTheCostOrAConsumerStepIsKnown) {
  ThreadTuner t(budget(4), 3);
  EXPECT_TRUE(feed(t, 8, 4, 0.010, 0, 0.0).empty()) << "no sample decoded yet";
  EXPECT_TRUE(feed(t, 8, 4, -1.0, 0, 0.001).empty()) << "first batches of epochs only";
  EXPECT_EQ(t.threads(), 3);
  ThreadTuner clamped(budget(2), 9);
  EXPECT_EQ(clamped.threads(), 2);
}

TEST(ThreadTuner, ACountThatDataWaitProvedNeededIsKeptUntilTheLoadFallsByAQuarter) {
  // 10 samples every 20 ms at 0.6 ms a sample: 0.3 threads by the estimate, but the consumer
  // waits 2% with one thread (overheads the estimate leaves out): two threads.
  ThreadTuner t(budget(2), 1);
  ASSERT_EQ(feed(t, 4, 10, 0.020, 0.0004, 0.0006).at(0).to, 2);
  // Now no wait: the estimate alone (0.3) would go back to one, and wait again. It stays.
  EXPECT_TRUE(feed(t, 40, 10, 0.020, 0, 0.0006).empty());
  EXPECT_EQ(t.threads(), 2);
  // The consumer slows to 60 ms a batch (0.1 threads, under 0.75 x 0.3): back to one.
  const auto d = feed(t, 8, 10, 0.060, 0, 0.0006);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].to, 1);
}
