#pragma once
// num_workers = "auto": the rule that picks the loader's decode thread count from measurements.
//
// The loader feeds it one observation per batch next() hands out: how long the consumer worked
// on the previous batch before asking for this one (its step, data wait excluded), how long it
// waited for this one, and the thread time the loader's workers have spent per sample so far.
// Every `window` batches it decides (the loader's window is max(4, prefetch_depth) batches: the
// batches already decoded into the slots when a count changes were decoded at the old one, so a
// shorter window would judge a change by batches it did not make):
//
//   demand  = batch samples / median consumer step         (samples/s the consumer takes)
//   needed  = demand x thread time per sample               (threads, fractional)
//   target  = ceil(needed x (1 + headroom)), within [1, budget]
//
// and, as feedback where the estimate falls short, one thread more than now when the window's
// data wait was above `max_wait_fraction` of its time. A target above the current count applies
// at once; one below it applies only after `windows_to_lower` windows in a row agree and waited
// at most a tenth of max_wait_fraction (hysteresis: a trainer's validation pause or one slow
// step does not take threads away). A count that data wait proved too few stays too few: after
// such a rise the rule does not go below the new count until the estimate of threads needed has
// fallen by a quarter from what it was at the rise (the estimate leaves out the loader's
// per-batch overheads, which matter for tiny images, so it alone would lower again and
// oscillate). The budget is the process's CPU budget (gpufeed/cpu_budget.h).
//
// Samples never depend on the thread count (loader.h), so a decision changes only speed and CPU
// use. The rule is tf.data's AUTOTUNE idea (measure, then size the pool) with the consumer's
// rate as the target instead of the pipeline's maximum: the fewest threads that keep the
// consumer's data wait under 1%.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpufeed::loader {

/// One change of the thread count under num_workers = "auto", as the loader reports it
/// (Loader::thread_decisions(), the profiler's metrics, the CLI's epoch line).
struct ThreadDecision {
  int64_t number = 0;          ///< 0-based: the loader's how-many-th decision
  int64_t epoch = 0;           ///< the epoch of the batch after which it was decided
  int64_t batch = 0;           ///< that batch's index in its epoch
  int from = 0;                ///< threads before
  int to = 0;                  ///< threads after (= from for a change of prefetch_depth alone)
  int prefetch_depth_from = 0;  ///< batch slots before (prefetch_depth auto grows them; else fixed)
  int prefetch_depth_to = 0;    ///< batch slots after
  double sample_cost_us = 0;   ///< worker thread time per sample (read + decode + resize), microseconds
  double demand_per_s = 0;     ///< samples per second the consumer takes (batch / median step)
  double needed = 0;           ///< threads: demand x cost
  double wait_fraction = 0;    ///< the window's data wait / (wait + consumer steps)
  std::string why;             ///< one sentence: "consumer takes 410 samples/s at 2.3 ms a sample: ..."
};

/// The rule's constants (defaults as documented above).
struct ThreadTunerOptions {
  int budget = 1;                   ///< most threads (the CPU budget); >= 1
  int window = 4;                   ///< batches per decision; >= 1
  double headroom = 0.25;           ///< the target's margin over the estimate
  double max_wait_fraction = 0.01;  ///< data wait above this adds a thread
  int windows_to_lower = 2;         ///< windows in a row that must agree before fewer threads
};

/// The decision rule, without the loader: pure, deterministic given its observations.
class ThreadTuner {
 public:
  /// Starts at `start` threads (clamped to [1, budget]).
  ThreadTuner(ThreadTunerOptions options, int start);

  /// One handed-out batch: `samples` in it, `consumer_s` the consumer's step before asking for
  /// it (negative: unknown, e.g. the first batch after an epoch start), `wait_s` its data wait,
  /// `sample_cost_s` the current estimate of worker thread time per sample (<= 0: unknown).
  /// Returns a decision when the thread count changes; threads() is then its `to`.
  std::optional<ThreadDecision> observe(int64_t epoch, int64_t batch, int64_t samples, double consumer_s,
                                        double wait_s, double sample_cost_s);

  /// The current thread count.
  int threads() const { return threads_; }
  const ThreadTunerOptions& options() const { return options_; }

 private:
  std::optional<ThreadDecision> decide(int64_t epoch, int64_t batch, double sample_cost_s);

  ThreadTunerOptions options_;
  int threads_;
  std::vector<double> steps_;  // consumer steps of the window (known ones)
  int64_t window_samples_ = 0, window_batches_ = 0;
  double window_wait_s_ = 0, window_step_s_ = 0;
  int lower_votes_ = 0;
  int64_t decisions_ = 0;
  int floor_ = 1;              // the count data wait last proved needed
  double floor_needed_ = 0;    // the estimate at that rise
};

}  // namespace gpufeed::loader
