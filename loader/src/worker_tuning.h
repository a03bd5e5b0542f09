#pragma once
// The loader's autotuning (private to loader/src): num_workers = auto's thread count, applied to
// the workers through lanes, and prefetch_depth auto's slot growth. The loader tells it each
// batch next() hands out (observe); its workers ask it for a lane per sample (take_lane).
//
// Lanes: under num_workers = auto the arena keeps the whole CPU budget and `threads()` lanes gate
// it: a worker takes a lane for each sample it decodes and waits (asleep, using no CPU) while all
// are taken, so at most threads() samples are decoded at once and a decision takes effect at the
// next sample. (One arena per count, switched between batches, left the new arena without a worker
// for tens of milliseconds after each switch.)
//
// Locking: the lanes have their own mutex; everything else (observe, saw_slots_full, decisions)
// is the consumer's side, called under the loader's mutex, which also guards the SlotRing it grows.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "epoch_schedule.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/thread_tuner.h"

namespace gpufeed::loader::detail {

/// One batch next() hands out, as the tuners see it.
struct HandOut {
  int64_t epoch = 0;
  int64_t batch = 0;        ///< its index in its epoch
  int64_t samples = 0;      ///< in the batch
  double consumer_s = -1;   ///< the consumer's step before asking for it (negative: unknown)
  double wait_s = 0;        ///< the consumer's data wait for it
  int64_t worker_ns = 0;    ///< the workers' thread time over all samples so far (read + decode + resize)
  int64_t worker_samples = 0;  ///< the samples those were spent on
};

class WorkerTuning {
 public:
  /// `options`: the loader's (kept by reference: num_workers, prefetch_depth, tuner_observation),
  /// `threads` the thread count to start from, `ring` the slots prefetch_depth auto grows.
  WorkerTuning(const LoaderOptions& options, int threads, SlotRing& ring);

  /// The thread count in force (any thread).
  int threads() const { return threads_.load(std::memory_order_relaxed); }

  // The workers' side.
  /// Whether samples are gated by lanes (num_workers = auto).
  bool gates_lanes() const { return tuner_.has_value(); }
  /// A lane for one sample of plan `p`; false when `p` was cancelled while waiting.
  bool take_lane(const EpochPlan& p);
  void give_lane();
  /// Wakes the workers waiting for a lane (a plan was cancelled); nothing without lanes.
  void wake_lanes();

  // The consumer's side, under the loader's mutex.
  /// Whether observe() has anything to tune (num_workers or prefetch_depth auto).
  bool observes() const { return tuner_.has_value() || depth_max_ > 0; }
  /// A handed-out batch: may change threads() (waking the lanes) or grow the ring by one slot,
  /// each logged and recorded as a ThreadDecision.
  void observe(const HandOut& h);
  /// Whether the ring may grow (prefetch_depth auto, below its most).
  bool grows_slots() const { return depth_max_ > 0; }
  /// A slot came back while every other slot held a decoded batch and there was more to schedule.
  void saw_slots_full() { slots_were_full_ = true; }
  /// The decisions so far, oldest first (the last kMaxDecisions).
  const std::vector<ThreadDecision>& decisions() const { return decisions_; }

  static constexpr size_t kMaxDecisions = 1024;

 private:
  TunerObservation measure(const HandOut& h, bool window_ended);
  void tune_threads(const HandOut& h, const TunerObservation& seen);
  void grow_if_bursty(const HandOut& h, bool full);
  void record(ThreadDecision d);

  const LoaderOptions& options_;
  SlotRing& ring_;
  std::atomic<int> threads_;
  std::mutex lanes_mu_;
  std::condition_variable lanes_cv_;
  int lanes_taken_ = 0;  // guarded by lanes_mu_
  std::optional<ThreadTuner> tuner_;  // num_workers = auto only
  std::vector<ThreadDecision> decisions_;
  int64_t decisions_made_ = 0;
  int64_t cost_ns_seen_ = 0, cost_samples_seen_ = 0;  // worker totals when the last window ended
  double sample_cost_s_ = 0;                          // worker thread time per sample, last window
  int64_t tuned_batches_ = 0;
  int window_ = 4;  // batches per tuning window: max(4, the slots at construction)
  // prefetch_depth auto: the most slots, and this window's consumer wait, steps and whether the
  // loader found every slot full while it had batches to schedule.
  int depth_max_ = 0;
  double depth_wait_s_ = 0, depth_step_s_ = 0;
  bool slots_were_full_ = false, slots_were_full_before_ = false;
};

}  // namespace gpufeed::loader::detail
