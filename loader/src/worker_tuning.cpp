#include "worker_tuning.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gpufeed/log.h"

namespace gpufeed::loader::detail {

WorkerTuning::WorkerTuning(const LoaderOptions& options, int threads, SlotRing& ring)
    : options_(options), ring_(ring), threads_(threads), window_(std::max(4, ring.size())) {
  if (options.num_workers == kAutoNumWorkers) {
    tuner_.emplace(ThreadTunerOptions{.budget = threads, .window = window_}, threads);
  }
  if (options.prefetch_depth == kAutoPrefetchDepth) {
    const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    const auto fit = static_cast<int>(memory / 16 / static_cast<double>(ring.slot_bytes()));
    depth_max_ = std::clamp(fit, kAutoPrefetchStart, kAutoPrefetchMax);
  }
}

bool WorkerTuning::take_lane(const EpochPlan& p) {
  std::unique_lock<std::mutex> lk(lanes_mu_);
  lanes_cv_.wait(lk, [&] { return lanes_taken_ < threads_.load(std::memory_order_relaxed) || cancelled(p); });
  if (cancelled(p)) return false;
  ++lanes_taken_;
  return true;
}

void WorkerTuning::give_lane() {
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    --lanes_taken_;
  }
  lanes_cv_.notify_one();
}

void WorkerTuning::wake_lanes() {
  if (!tuner_) return;
  { std::lock_guard<std::mutex> g(lanes_mu_); }
  lanes_cv_.notify_all();
}

void WorkerTuning::observe(const HandOut& h) {
  if (!observes()) return;
  const bool window_ended = ++tuned_batches_ % window_ == 0;
  const TunerObservation seen = measure(h, window_ended);
  if (tuner_) tune_threads(h, seen);
  if (depth_max_ == 0) return;
  depth_wait_s_ += std::max(0.0, seen.wait_s);
  if (seen.consumer_s >= 0) depth_step_s_ += seen.consumer_s;
  if (!window_ended) return;
  // The burst that drains what the slots held can fall in the window after the one in which
  // they were full: either counts.
  const bool full = slots_were_full_ || slots_were_full_before_;
  slots_were_full_before_ = slots_were_full_;
  grow_if_bursty(h, full);
  depth_wait_s_ = depth_step_s_ = 0;
  slots_were_full_ = false;
}

// What the tuners observe for batch `h`: the consumer's step and wait, and the workers' thread
// time per sample since the last window ended; LoaderOptions::tuner_observation's instead when
// it is set (tests, tools replaying measurements).
TunerObservation WorkerTuning::measure(const HandOut& h, bool window_ended) {
  if (h.worker_samples > cost_samples_seen_) {
    sample_cost_s_ = static_cast<double>(h.worker_ns - cost_ns_seen_) * 1e-9 /
                     static_cast<double>(h.worker_samples - cost_samples_seen_);
  }
  if (window_ended) {  // the window ended: the next one's costs
    cost_ns_seen_ = h.worker_ns;
    cost_samples_seen_ = h.worker_samples;
  }
  TunerObservation measured;
  measured.epoch = h.epoch;
  measured.batch = h.batch;
  measured.threads = threads();
  measured.prefetch_depth = ring_.size();
  measured.consumer_s = h.consumer_s;
  measured.wait_s = h.wait_s;
  measured.sample_cost_s = sample_cost_s_;
  if (!options_.tuner_observation) return measured;
  TunerObservation given = options_.tuner_observation(measured);
  given.epoch = measured.epoch;
  given.batch = measured.batch;
  given.threads = measured.threads;
  given.prefetch_depth = measured.prefetch_depth;
  return given;
}

void WorkerTuning::tune_threads(const HandOut& h, const TunerObservation& seen) {
  auto d = tuner_->observe(seen.epoch, seen.batch, h.samples, seen.consumer_s, seen.wait_s, seen.sample_cost_s);
  if (!d) return;
  threads_.store(d->to, std::memory_order_relaxed);
  wake_lanes();
  gpufeed::log()->info("loader: num_workers auto: {} -> {} threads after batch {} of epoch {}: {}", d->from, d->to,
                       d->batch, d->epoch, d->why);
  d->prefetch_depth_from = d->prefetch_depth_to = ring_.size();
  record(std::move(*d));
}

// prefetch_depth auto, at a window's end: one slot more when the consumer waited over 1% of the
// window and the loader had, at some release in it or in the window before, every other slot
// holding a decoded batch with more to schedule (`full`: it had run as far ahead as the slots
// allow, so more slots would have held more decoded batches for the burst that followed).
void WorkerTuning::grow_if_bursty(const HandOut& h, bool full) {
  const double busy = depth_wait_s_ + depth_step_s_;
  const double waited = busy > 0 ? depth_wait_s_ / busy : 0;
  if (!(waited > 0.01 && full && ring_.size() < depth_max_)) return;
  const int before = ring_.size();
  if (!ring_.grow()) {
    gpufeed::log()->warn("loader: prefetch_depth auto: the allocator refused slot {}; staying at {}", before + 1,
                         before);
    depth_max_ = before;
    return;
  }
  ThreadDecision d;
  d.epoch = h.epoch;
  d.batch = h.batch;
  d.from = d.to = threads();
  d.prefetch_depth_from = before;
  d.prefetch_depth_to = before + 1;
  d.wait_fraction = waited;
  d.why = fmt::format("data wait {:.1f}% of the window after the loader had filled every slot: a slot more "
                      "({} of at most {})", waited * 100, before + 1, depth_max_);
  gpufeed::log()->info("loader: prefetch_depth auto: {} -> {} slots after batch {} of epoch {}: {}", before,
                       before + 1, d.batch, d.epoch, d.why);
  record(std::move(d));  // next() pumps the new slot right after
}

void WorkerTuning::record(ThreadDecision d) {
  d.number = decisions_made_++;
  if (decisions_.size() == kMaxDecisions) decisions_.erase(decisions_.begin());
  decisions_.push_back(std::move(d));
}

}  // namespace gpufeed::loader::detail
