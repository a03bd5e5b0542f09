// The loader's autotuning unit (loader/src/worker_tuning.h) without a loader: prefetch_depth
// auto's slot growth from handed-out batches, and the lanes that apply num_workers auto's count.
#include <gtest/gtest.h>

#include "epoch_schedule.h"
#include "gpufeed/loader/host_allocator.h"
#include "gpufeed/loader/loader.h"
#include "worker_tuning.h"

using namespace gpufeed::loader;

using namespace gpufeed::datasets;

using namespace gpufeed::transforms;
using detail::EpochPlan;
using detail::HandOut;
using detail::SlotRing;
using detail::WorkerTuning;

namespace {

LoaderOptions auto_depth() {
  LoaderOptions o;
  o.batch_size = 2;
  o.num_workers = 2;
  o.prefetch_depth = kAutoPrefetchDepth;
  return o;
}

// Batch `b` of epoch 5: 2 samples, a 10 ms consumer step and a 10 ms data wait (half the time).
HandOut waited(int64_t b) { return HandOut{.epoch = 5, .batch = b, .samples = 2, .consumer_s = 0.01, .wait_s = 0.01}; }

}  // namespace

TEST(WorkerTuning, GrowsOneSlotAtTheWindowsEndWhenTheConsumerWaitedAfterTheSlotsWereFull) {
  const LoaderOptions o = auto_depth();
  auto allocator = default_host_allocator();
  SlotRing ring(*allocator, kAutoPrefetchStart, o.batch_size, 8);
  WorkerTuning tuning(o, 2, ring);
  ASSERT_TRUE(tuning.observes());
  ASSERT_TRUE(tuning.grows_slots());
  ASSERT_FALSE(tuning.gates_lanes());
  // The window is max(4, slots) = 4 batches: nothing is decided before its end.
  tuning.observe(waited(0));
  tuning.saw_slots_full();
  tuning.observe(waited(1));
  tuning.observe(waited(2));
  EXPECT_EQ(ring.size(), 3);
  EXPECT_TRUE(tuning.decisions().empty());
  tuning.observe(waited(3));
  EXPECT_EQ(ring.size(), 4);
  EXPECT_EQ(ring.free_count(), 4);
  ASSERT_EQ(tuning.decisions().size(), 1u);
  const ThreadDecision& d = tuning.decisions()[0];
  EXPECT_EQ(d.number, 0);
  EXPECT_EQ(d.epoch, 5);
  EXPECT_EQ(d.batch, 3);
  EXPECT_EQ(d.from, 2);
  EXPECT_EQ(d.to, 2);
  EXPECT_EQ(d.prefetch_depth_from, 3);
  EXPECT_EQ(d.prefetch_depth_to, 4);
  EXPECT_DOUBLE_EQ(d.wait_fraction, 0.5);
  EXPECT_EQ(tuning.threads(), 2);
}

TEST(WorkerTuning, KeepsTheSlotsWhenTheyWereNeverFullOrTheConsumerNeverWaited) {
  const LoaderOptions o = auto_depth();
  auto allocator = default_host_allocator();
  SlotRing ring(*allocator, kAutoPrefetchStart, o.batch_size, 8);
  WorkerTuning tuning(o, 2, ring);
  for (int64_t b = 0; b < 8; ++b) tuning.observe(waited(b));  // waited, but the slots never filled
  EXPECT_EQ(ring.size(), 3);
  for (int64_t b = 8; b < 12; ++b) {
    tuning.saw_slots_full();
    tuning.observe(HandOut{.epoch = 5, .batch = b, .samples = 2, .consumer_s = 0.01, .wait_s = 0});
  }
  EXPECT_EQ(ring.size(), 3);
  EXPECT_TRUE(tuning.decisions().empty());
}

TEST(WorkerTuning, FixedCountsObserveNothing) {
  LoaderOptions o = auto_depth();
  o.prefetch_depth = 3;
  auto allocator = default_host_allocator();
  SlotRing ring(*allocator, 3, o.batch_size, 8);
  WorkerTuning tuning(o, 2, ring);
  EXPECT_FALSE(tuning.observes());
  EXPECT_FALSE(tuning.grows_slots());
  EXPECT_FALSE(tuning.gates_lanes());
}

TEST(WorkerTuning, ALaneWaitsForAFreeOneAndACancelledPlanGetsNone) {
  LoaderOptions o = auto_depth();
  o.num_workers = kAutoNumWorkers;
  o.prefetch_depth = 3;
  auto allocator = default_host_allocator();
  SlotRing ring(*allocator, 3, o.batch_size, 8);
  WorkerTuning tuning(o, 1, ring);  // one thread: one lane
  ASSERT_TRUE(tuning.gates_lanes());
  EXPECT_EQ(tuning.threads(), 1);
  EpochPlan running, stopped;
  stopped.cancelled = true;
  ASSERT_TRUE(tuning.take_lane(running));
  EXPECT_FALSE(tuning.take_lane(stopped));  // every lane taken: only cancellation ends the wait
  tuning.give_lane();
  EXPECT_TRUE(tuning.take_lane(running));
  tuning.give_lane();
}
