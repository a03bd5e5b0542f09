#include "gpufeed/loader/thread_tuner.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace gpufeed::loader {

ThreadTuner::ThreadTuner(ThreadTunerOptions options, int start)
    : options_(options), threads_(std::clamp(start, 1, std::max(1, options.budget))) {
  options_.budget = std::max(1, options_.budget);
  options_.window = std::max(1, options_.window);
}

std::optional<ThreadDecision> ThreadTuner::observe(int64_t epoch, int64_t batch, int64_t samples, double consumer_s,
                                                   double wait_s, double sample_cost_s) {
  ++window_batches_;
  window_samples_ += samples;
  window_wait_s_ += std::max(0.0, wait_s);
  if (consumer_s >= 0) {
    steps_.push_back(consumer_s);
    window_step_s_ += consumer_s;
  }
  if (window_batches_ < options_.window) return std::nullopt;
  auto d = decide(epoch, batch, sample_cost_s);
  steps_.clear();
  window_samples_ = window_batches_ = 0;
  window_wait_s_ = window_step_s_ = 0;
  return d;
}

std::optional<ThreadDecision> ThreadTuner::decide(int64_t epoch, int64_t batch, double sample_cost_s) {
  ThreadDecision d;
  d.epoch = epoch;
  d.batch = batch;
  d.from = threads_;
  d.sample_cost_us = sample_cost_s * 1e6;
  const double busy = window_wait_s_ + window_step_s_;
  d.wait_fraction = busy > 0 ? window_wait_s_ / busy : 0;
  if (steps_.empty() || sample_cost_s <= 0) return std::nullopt;  // nothing measured yet
  std::vector<double> steps = steps_;
  std::nth_element(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(steps.size() / 2), steps.end());
  const double median = steps[steps.size() / 2];
  const double per_batch = static_cast<double>(window_samples_) / static_cast<double>(window_batches_);
  // A consumer that asks again at once (a bench, an input-bound trainer) takes all it gets.
  d.demand_per_s = median > 1e-6 ? per_batch / median : INFINITY;
  d.needed = d.demand_per_s * sample_cost_s;
  const double with_headroom = d.needed * (1 + options_.headroom);
  int target = std::isfinite(with_headroom)
                   ? static_cast<int>(std::clamp(std::ceil(with_headroom), 1.0, static_cast<double>(options_.budget)))
                   : options_.budget;
  const bool waited = d.wait_fraction > options_.max_wait_fraction;
  if (waited && target <= threads_ && threads_ < options_.budget) {
    target = threads_ + 1;
    floor_ = target;  // proved needed at this estimate
    floor_needed_ = d.needed;
  }
  if (target < floor_) {
    if (std::isfinite(d.needed) && d.needed < 0.75 * floor_needed_) {
      floor_ = 1;  // the load fell: the floor no longer holds
    } else {
      target = floor_;
    }
  }
  const std::string model =
      std::isfinite(d.needed)
          ? fmt::format("the consumer takes {:.0f} samples/s at {:.0f} us of thread time a sample: {:.2f} threads "
                        "needed", d.demand_per_s, d.sample_cost_us, d.needed)
          : fmt::format("the consumer asks for the next batch at once ({:.0f} us of thread time a sample)",
                        d.sample_cost_us);
  if (target > threads_) {
    lower_votes_ = 0;
    d.to = target;
    if (waited && !(with_headroom > threads_)) {
      d.why = fmt::format("data wait {:.1f}% of the window > {:g}%: one thread more ({})", d.wait_fraction * 100,
                          options_.max_wait_fraction * 100, model);
    } else if (target == options_.budget && !(with_headroom <= options_.budget)) {
      d.why = fmt::format("{}, more than the CPU budget of {}: input-bound, every thread", model, options_.budget);
    } else {
      d.why = fmt::format("{}, {} with {:.0f}% headroom", model, target, options_.headroom * 100);
    }
  } else if (target < threads_ && d.wait_fraction <= options_.max_wait_fraction / 10) {
    if (++lower_votes_ < options_.windows_to_lower) return std::nullopt;
    lower_votes_ = 0;
    d.to = target;
    d.why = fmt::format("{}, {} with {:.0f}% headroom ({} windows in a row)", model, target,
                        options_.headroom * 100, options_.windows_to_lower);
  } else {
    lower_votes_ = 0;
    return std::nullopt;
  }
  threads_ = d.to;
  d.number = decisions_++;
  return d;
}

}  // namespace gpufeed::loader
