#include "gpufeed/loader/loader.h"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "gpufeed/transforms/augment.h"
#include "gpufeed/cpu_budget.h"
#include "gpufeed/log.h"
#include "gpufeed/sampler/mixing.h"
#include "gpufeed/sampler/shard_order.h"
#include "epoch_schedule.h"
#include "fork_guard.h"
#include "read_ahead.h"
#include "worker_tuning.h"
#include "gpufeed/datasets/tbb_tsan.h"

namespace gpufeed::loader {
namespace {

using detail::EpochPlan;
using detail::EpochSchedule;
using detail::InFlight;
using detail::Slot;
using Clock = std::chrono::steady_clock;

// The shard-aware order (shuffle_order shards), also of mixed sources, tells the dataset's reader
// so: a remote one then reads whole shards under remote_read auto (RemoteShards::reader).
datasets::ReadOrder read_order(const sampler::Sampler& s) {
  const auto* mixing = dynamic_cast<const sampler::MixingSampler*>(&s);
  const bool shard_aware =
      dynamic_cast<const sampler::ShardAwareSampler*>(&s) != nullptr || (mixing && !mixing->options().exact_order);
  return shard_aware ? datasets::ReadOrder::kShardRuns : datasets::ReadOrder::kAny;
}

// ThreadSanitizer and oneTBB: Debian's libtbb is not instrumented, so TSan cannot see the ordering
// its scheduler provides between queueing a task and running it, or between a parallel_for's
// chunks and its return, and would report the task's first reads as races. Two measures make
// those orderings visible: the enqueue of a batch's task happens under tbb_handoff_mutex(), which
// the task takes before touching its captures (a real, uncontended lock per batch, in every
// build); parallel_for_ordered (tbb_tsan.h) orders a parallel_for's start before its chunks and
// its chunks before its return.
std::mutex& tbb_handoff_mutex() {
  static std::mutex m;
  return m;
}


// Per-thread decode state: the decoder (libjpeg handle), the file bytes and the decoded pixels.
// Buffers grow to the largest file/image seen and are then reused: no per-sample allocation.
struct Worker {
  decode::Decoder decoder;
  decode::ByteBuffer bytes;  // the file, grown without zero-filling
  decode::ImageBuffer image;
  transforms::Resizer resizer;     // filter tables and one row, reused
  transforms::AugmentPlan augment;  // the sample's augmentation draws, reused
  transforms::AugmentScratch augment_scratch;
  std::string source;  // the path as text for errors, reusing its capacity
};

Worker& thread_worker() {
  thread_local Worker worker;
  return worker;
}

// Per-thread state of the views path (LoaderOptions::views): its own decoder and buffers.
transforms::ViewsWorker& thread_views_worker() {
  thread_local transforms::ViewsWorker worker;
  return worker;
}

struct SampleCost {
  int64_t read_ns = 0, decode_ns = 0, resize_ns = 0, bytes = 0, pixels = 0, decodes = 0;
  int64_t index = -1, epoch = 0, start_ns = 0;  // for the sample observer
};

// Nanoseconds since `t`, and moves `t` to now: one clock read ends a stage and starts the next.
int64_t lap_ns(Clock::time_point& t) {
  const auto now = Clock::now();
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - t).count();
  t = now;
  return ns;
}

// Decodes, resizes and augments the file in `bytes` (already read) into `out`: probe, plan
// (plan_for), decode only the crop at the cheapest DCT scale that still covers the output, resize
// straight into `out`. Stage times go to `cost`, from `t0`.
// The most views a sample may have (a slot's row pointers live on the stack).
constexpr size_t kMaxViews = 128;
using ViewOuts = std::array<uint8_t*, kMaxViews>;

// With views: view k into outs[k] (decode_views_into: one decode, then each view's resize and
// augmentations; the decode's time is the decode stage's, the rest the resize stage's).
void decode_views_bytes_into(const decode::ByteBuffer& bytes, const std::string& source, int64_t index,
                             int64_t epoch, const LoaderOptions& o, std::span<uint8_t* const> outs, SampleCost& cost) {
  transforms::ViewsWorker& w = thread_views_worker();
  const int64_t decodes = w.decodes, decode_ns = w.decode_ns;
  const auto t0 = Clock::now();
  transforms::decode_views_into(bytes, source, o.views, o.decode, o.seed, epoch, index, outs, w);
  const int64_t total = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  cost.decodes += w.decodes - decodes;
  cost.decode_ns += w.decode_ns - decode_ns;
  cost.resize_ns += std::max<int64_t>(0, total - (w.decode_ns - decode_ns));
  cost.pixels = static_cast<int64_t>(w.image.width) * w.image.height;
}

// `view_outs`: with views, view k's row; else unused (`out` is the sample's row).
void decode_bytes_into(const decode::ByteBuffer& bytes, const std::string& source, int64_t index, int64_t epoch,
                       const LoaderOptions& o, uint8_t* out, SampleCost& cost, Clock::time_point& t0,
                       std::span<uint8_t* const> view_outs = {}) {
  if (!o.views.empty()) {
    decode_views_bytes_into(bytes, source, index, epoch, o, view_outs, cost);
    t0 = Clock::now();
    return;
  }
  Worker& w = thread_worker();
  const PlannedSample p = plan_for(decode::probe(bytes, source), o, epoch, index);
  const decode::DecodeResult decoded = w.decoder.decode(bytes, source, p.decode, w.image);
  ++cost.decodes;
  cost.decode_ns += lap_ns(t0);
  cost.pixels = static_cast<int64_t>(w.image.width) * w.image.height;

  // Straight into the slot's row, mirrored there when the plan flips.
  transforms::resize_sample(p.plan, decoded, w.image, w.resizer, out);
  // Then the augmentations, on the sample's row, continuing its stream (augment.h).
  const transforms::AugmentOptions& aug = o.transform.augment;
  if (o.transform.kind == transforms::TransformOptions::Kind::kTrain && aug.enabled()) {
    const int s = p.plan.output_size;
    transforms::SampleRng rng = *p.plan.rng;
    transforms::RngDrawSource draws(rng);
    transforms::plan_augment(aug, s, s, draws, w.augment);
    transforms::apply_augment(w.augment, out, s, s, w.augment_scratch);
  }
  cost.resize_ns += lap_ns(t0);
}

SampleCost start_cost(int64_t index, int64_t epoch, Clock::time_point t0) {
  SampleCost cost;
  cost.index = index;
  cost.epoch = epoch;
  cost.start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
  return cost;
}

void read_sample(const datasets::Dataset& dataset, datasets::SampleReader* reader, uint64_t tag,
                 const datasets::SampleRef& ref, int64_t index, decode::ByteBuffer& bytes) {
  if (reader != nullptr) {
    reader->read(tag, index, bytes);
  } else {
    dataset.read(index, ref, bytes);
  }
}

// The one place a sample becomes pixels: read, then decode_bytes_into.
// `reader`: the loader's SampleReader (plan `tag`), or null for dataset.read.
SampleCost transform_into(const datasets::Dataset& dataset, datasets::SampleReader* reader, uint64_t tag, const datasets::SampleRef& ref,
                          int64_t index, int64_t epoch, const LoaderOptions& o, uint8_t* out,
                          std::span<uint8_t* const> view_outs = {}) {
  Worker& w = thread_worker();
  auto t0 = Clock::now();
  SampleCost cost = start_cost(index, epoch, t0);
  read_sample(dataset, reader, tag, ref, index, w.bytes);
  cost.read_ns = lap_ns(t0);  // stages back to back, so a trace's spans nest exactly
  cost.bytes = static_cast<int64_t>(w.bytes.size());
  ref.source(w.source);
  decode_bytes_into(w.bytes, w.source, index, epoch, o, out, cost, t0, view_outs);
  return cost;
}

// load_sample's layout: the views back to back from `out`.
std::span<uint8_t* const> back_to_back(const LoaderOptions& o, uint8_t* out, ViewOuts& outs) {
  const std::vector<transforms::ViewOptions>& views = o.views.views;
  for (size_t k = 0; k < views.size(); ++k) {
    outs[k] = out;
    out += static_cast<size_t>(views[k].rrc.size) * views[k].rrc.size * 3;
  }
  return {outs.data(), views.size()};
}

// Whether the GPU decoder takes a file with header `info`: 8-bit baseline or progressive Huffman
// JPEG, grey or colour, in its stored orientation. Everything else (PNG, WebP, CMYK/YCCK, 12-bit,
// lossless or arithmetic-coded JPEG, an EXIF orientation to apply) is decoded on the CPU.
bool gpu_decodable(const decode::ImageInfo& info, const LoaderOptions& o) {
  return info.format == decode::ImageFormat::kJpeg && info.bits_per_sample == 8 &&
         (info.components == 1 || info.components == 3) && !info.lossless && !info.arithmetic &&
         !(o.decode.apply_exif_orientation && info.orientation != 1);
}

// decode_device gpu/auto: reads sample `index` into `d`, probes and plans it, and leaves it for
// the GPU (d.pending) when gpu_decodable; otherwise decodes it here into `out` as the CPU path.
SampleCost defer_into(const datasets::Dataset& dataset, datasets::SampleReader* reader, uint64_t tag,
                      const datasets::SampleRef& ref, int64_t index, int64_t epoch, const LoaderOptions& o,
                      DeferredSample& d, uint8_t* out) {
  auto t0 = Clock::now();
  SampleCost cost = start_cost(index, epoch, t0);
  d.pending = false;
  read_sample(dataset, reader, tag, ref, index, d.bytes);
  cost.read_ns = lap_ns(t0);
  cost.bytes = static_cast<int64_t>(d.bytes.size());
  ref.source(d.source);
  d.info = decode::probe(d.bytes, d.source);
  if (!gpu_decodable(d.info, o)) {
    decode_bytes_into(d.bytes, d.source, index, epoch, o, out, cost, t0);
    return cost;
  }
  d.plan = plan_for(d.info, o, epoch, index).plan;
  d.index = index;
  d.pending = true;
  cost.decode_ns = lap_ns(t0);  // the probe and the plan
  return cost;
}

// The threads a num_workers value asks for: itself, or the CPU budget for 0 and for auto (where
// the ThreadTuner starts from the whole budget and lowers it from measurements).
int worker_count(int requested) {
  return requested > 0 ? requested : gpufeed::cpu_budget();
}

// ---------------------------------------------------------------------------------------------
// The skip policy, both halves: the worker's replacement search (replace_failed) and the
// consumer's per-epoch account with its limit (SkipAccount::add_batch, in sampler order).

/// Replacement candidates tried after a failing sample: the next this many samples of the rank's
/// epoch order (loader.h promises 63).
constexpr int64_t kMaxReplacementCandidates = 63;

// kind and reason of a failure, as SkippedSample reports them.
void describe_failure(const std::exception_ptr& failure, SkippedSample& skip) {
  try {
    std::rethrow_exception(failure);
  } catch (const decode::DecodeError& e) {
    skip.kind = std::string(decode::to_string(e.kind()));
    skip.reason = e.reason();
  } catch (const std::exception& e) {
    skip.kind = "error";
    skip.reason = e.what();
  } catch (...) {
    skip.kind = "error";
    skip.reason = "unknown exception";
  }
}

// The epoch's account over the batches next() handed out.
struct SkipAccount {
  EpochSummary summary;
  bool ended = false;  // the limit stopped the epoch early

  void reset(int64_t epoch) {
    summary = EpochSummary{};
    summary.epoch = epoch;
    ended = false;
  }
  // Adds a handed-out batch (its skips sorted by position); true when the epoch's skips now
  // exceed max_skips under kSkip. Counted in sampler order, so the same batch crosses the limit
  // for any thread count.
  bool add_batch(InFlight& f, const LoaderOptions& o) {
    std::sort(f.skipped.begin(), f.skipped.end(),
              [](const SkippedSample& a, const SkippedSample& b) { return a.position < b.position; });
    ++summary.batches;
    summary.samples += static_cast<int64_t>(f.indices.size());
    for (const SkippedSample& s : f.skipped) {
      ++summary.skipped_by_kind[s.kind];
      summary.skips.push_back(s);
    }
    summary.skipped += static_cast<int64_t>(f.skipped.size());
    return o.error_policy == ErrorPolicy::kSkip && summary.skipped > o.max_skips;
  }
};

// std::atomic<std::shared_ptr> (C++20) where the standard library has it (libstdc++ 12); libc++
// (zig's toolchain for the manylinux wheels: cmake/toolchains/zig.cmake) has not: the same load
// and store under a mutex. Counters reaches it only when an observer is set.
#if defined(__cpp_lib_atomic_shared_ptr)
template <class T>
using AtomicSharedPtr = std::atomic<std::shared_ptr<T>>;
#else
template <class T>
class AtomicSharedPtr {
 public:
  std::shared_ptr<T> load(std::memory_order) const {
    std::lock_guard lock(mutex_);
    return ptr_;
  }
  void store(std::shared_ptr<T> p, std::memory_order) {
    std::lock_guard lock(mutex_);
    ptr_.swap(p);  // the old pointer is released by p, after the lock
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<T> ptr_;
};
#endif

// ---------------------------------------------------------------------------------------------
// Counters: totals, per-stage histograms and the optional per-sample observer. Lock-free; every
// worker updates them after each sample.

struct Counters {
  using Histogram = std::array<std::atomic<int64_t>, LatencyHistogram::kBuckets>;
  Histogram read_hist{}, decode_hist{}, resize_hist{};
  // has_observer is read first (a plain relaxed load): libstdc++'s atomic<shared_ptr> load takes
  // a spin lock, which would put a lock shared by every worker on each sample's path.
  std::atomic<bool> has_observer{false};
  AtomicSharedPtr<const std::function<void(const SampleTiming&)>> observer;
  std::atomic<int64_t> samples{0}, skipped{0}, bytes_read{0}, read_ns{0}, decode_ns{0},
      resize_ns{0}, pixels{0}, decodes{0};

  void account(const SampleCost& c) {
    samples.fetch_add(1, std::memory_order_relaxed);
    bytes_read.fetch_add(c.bytes, std::memory_order_relaxed);
    read_ns.fetch_add(c.read_ns, std::memory_order_relaxed);
    decode_ns.fetch_add(c.decode_ns, std::memory_order_relaxed);
    resize_ns.fetch_add(c.resize_ns, std::memory_order_relaxed);
    pixels.fetch_add(c.pixels, std::memory_order_relaxed);
    decodes.fetch_add(c.decodes, std::memory_order_relaxed);
    read_hist[LatencyHistogram::bucket_of_ns(c.read_ns)].fetch_add(1, std::memory_order_relaxed);
    decode_hist[LatencyHistogram::bucket_of_ns(c.decode_ns)].fetch_add(1, std::memory_order_relaxed);
    resize_hist[LatencyHistogram::bucket_of_ns(c.resize_ns)].fetch_add(1, std::memory_order_relaxed);
    if (!has_observer.load(std::memory_order_relaxed)) return;
    if (auto obs = observer.load(std::memory_order_acquire)) {
      SampleTiming t;
      t.index = c.index;
      t.epoch = c.epoch;
      t.thread = std::max(0, tbb::this_task_arena::current_thread_index());
      t.start_ns = c.start_ns;
      t.read_ns = c.read_ns;
      t.decode_ns = c.decode_ns;
      t.resize_ns = c.resize_ns;
      (*obs)(t);
    }
  }

  void set_observer(std::function<void(const SampleTiming&)> fn) {
    std::shared_ptr<const std::function<void(const SampleTiming&)>> p;
    if (fn) p = std::make_shared<const std::function<void(const SampleTiming&)>>(std::move(fn));
    const bool set = p != nullptr;
    observer.store(std::move(p), std::memory_order_release);
    has_observer.store(set, std::memory_order_release);
  }

  LoaderStats stats() const {
    LoaderStats s;
    s.samples = samples.load();
    s.skipped = skipped.load();
    s.bytes_read = bytes_read.load();
    s.read_s = static_cast<double>(read_ns.load()) * 1e-9;
    s.decode_s = static_cast<double>(decode_ns.load()) * 1e-9;
    s.resize_s = static_cast<double>(resize_ns.load()) * 1e-9;
    s.decoded_pixels = pixels.load();
    s.decodes = decodes.load();
    return s;
  }

  LoaderHistograms histograms() const {
    const auto copy = [](const Histogram& from, LatencyHistogram& to) {
      for (size_t k = 0; k < from.size(); ++k) to.counts[k] = from[k].load(std::memory_order_relaxed);
    };
    LoaderHistograms h;
    copy(read_hist, h.read);
    copy(decode_hist, h.decode);
    copy(resize_hist, h.resize);
    return h;
  }
};

}  // namespace

PlannedSample plan_for(const decode::ImageInfo& info, const LoaderOptions& options, int64_t epoch,
                       int64_t index) {
  // Plans are made in the frame the decoder returns: displayed when EXIF orientation is applied.
  const bool upright = options.decode.apply_exif_orientation && decode::orientation_swaps_axes(info.orientation);
  PlannedSample p;
  p.plan = transforms::plan_sample(options.transform, upright ? info.height : info.width,
                       upright ? info.width : info.height, options.seed, epoch, index);
  p.decode = transforms::decode_options_for(p.plan, info, options.decode);
  return p;
}

int64_t sample_bytes(const LoaderOptions& options) {
  if (options.views.empty()) return int64_t{options.transform.output_size()} * options.transform.output_size() * 3;
  int64_t bytes = 0;
  for (const transforms::ViewOptions& v : options.views.views) bytes += int64_t{v.rrc.size} * v.rrc.size * 3;
  return bytes;
}

void load_sample(const datasets::Dataset& dataset, int64_t index, int64_t epoch, const LoaderOptions& options,
                 uint8_t* out) {
  ViewOuts outs;
  transform_into(dataset, nullptr, 0, dataset.at(index), index, epoch, options, out, back_to_back(options, out, outs));
}

void load_sample(const datasets::Dataset& dataset, datasets::SampleReader& reader, uint64_t tag, int64_t index, int64_t epoch,
                 const LoaderOptions& options, uint8_t* out) {
  ViewOuts outs;
  transform_into(dataset, &reader, tag, dataset.at(index), index, epoch, options, out, back_to_back(options, out, outs));
}

// ---------------------------------------------------------------------------------------------
// The loader: a oneTBB arena runs one task per scheduled batch (a parallel_for over its samples,
// written straight into the batch's slot); next() hands batches out in schedule order.

struct Loader::Impl : std::enable_shared_from_this<Loader::Impl> {
  std::shared_ptr<const datasets::Dataset> dataset;
  // The dataset's reader and the plans' tags. Destroyed before the dataset (declared after it).
  detail::ReadAhead read_ahead;
  std::shared_ptr<sampler::Sampler> sampler;
  LoaderOptions options;
  std::shared_ptr<HostAllocator> allocator;
  int slot_side = 0;   // the slots hold batch_size samples of up to slot_side^2 x 3 bytes
  int next_size = 0;   // the output side the next start_epoch uses (set_image_size)
  detail::ForkGuard fork_guard;  // first: counted before the arena exists, until it is gone
  // oneTBB's market starts hardware_concurrency - 1 workers (it keeps a slot for the main thread);
  // the arena's tasks run only on workers (we enqueue, the consumer never joins), so allow one
  // worker per loader thread. The effective limit is the minimum over live global_controls.
  tbb::global_control parallelism;
  tbb::task_arena arena;
  // The consumer as the tuners measure it: when next() last returned, and the data wait since
  // then spent in blocking wait_ready() calls (the Python binding waits in those slices).
  Clock::time_point last_return{};
  bool have_return = false;
  double pending_wait_s = 0;

  // Guards ring, tuning's consumer side, schedule, ahead, epoch_step, skips, running_tasks, shutdown.
  std::mutex mu;
  std::condition_variable cv;
  detail::SlotRing ring;
  // num_workers auto's thread count (its lanes gate the workers) and prefetch_depth auto's slots.
  detail::WorkerTuning tuning;
  EpochSchedule schedule;  // the epoch next() hands out
  // The epoch expected next, planned while the current one's last batches are consumed and
  // scheduled into slots it leaves free (plan_ahead): start_epoch takes it over when it starts
  // that epoch from its first batch at the same image size, so the next epoch begins with
  // decoded batches instead of an empty pipeline. Otherwise it is cancelled.
  EpochSchedule ahead;
  int64_t epoch_step = 1;  // the last two start_epoch calls' epoch difference when 0 or 1, else 1
  SkipAccount skips;
  int running_tasks = 0;
  bool shutdown = false;
  Counters counters;
  // decode_device gpu/auto: the fraction of each batch's rows left to the GPU decoder
  // (Loader::set_gpu_decode_share; the CUDA engine's controller moves it under auto).
  std::atomic<double> gpu_share{0.0};
  std::atomic<bool> gpu_consumer{false};  // Loader::set_gpu_decode_share was called (the engine)

  Impl(std::shared_ptr<const datasets::Dataset> d, std::shared_ptr<sampler::Sampler> s, LoaderOptions o,
       std::shared_ptr<HostAllocator> a)
      : dataset(std::move(d)),
        read_ahead(*dataset, read_order(*s)),
        sampler(std::move(s)),
        options(std::move(o)),
        allocator(a ? std::move(a) : default_host_allocator()),
        slot_side(std::max(options.max_image_size, options.transform.output_size())),
        next_size(options.views.empty() ? options.transform.output_size() : options.views.views[0].rrc.size),
        parallelism(tbb::global_control::max_allowed_parallelism,
                    std::max<size_t>(tbb::global_control::active_value(
                                         tbb::global_control::max_allowed_parallelism),
                                     static_cast<size_t>(worker_count(options.num_workers)) + 1)),
        arena(worker_count(options.num_workers), /*reserved_for_masters=*/0),
        ring(*allocator, options.prefetch_depth == kAutoPrefetchDepth ? kAutoPrefetchStart : options.prefetch_depth,
             options.batch_size,
             options.views.empty() ? int64_t{slot_side} * slot_side * 3 : sample_bytes(options)),
        tuning(options, worker_count(options.num_workers), ring) {}

  // The consumer's half of handed-out batch `f` for the tuners: `consumer_s` its step before
  // asking (negative: unknown), `wait_s` its data wait.
  void tune(const InFlight& f, double consumer_s, double wait_s) {
    if (!tuning.observes()) return;
    tuning.observe(detail::HandOut{
        .epoch = f.plan->epoch,
        .batch = f.batch_index,
        .samples = static_cast<int64_t>(f.indices.size()),
        .consumer_s = consumer_s,
        .wait_s = wait_s,
        .worker_ns = counters.read_ns.load(std::memory_order_relaxed) +
                     counters.decode_ns.load(std::memory_order_relaxed) +
                     counters.resize_ns.load(std::memory_order_relaxed),
        .worker_samples = counters.samples.load(std::memory_order_relaxed)});
  }

  // Epoch `epoch`'s plan at the current image size (next_size): its batches in sampler order.
  // `indices` is the sampler's order of that epoch.
  std::shared_ptr<const EpochPlan> make_plan(int64_t epoch, const std::vector<int64_t>& indices) {
    return detail::make_epoch_plan(options, next_size, read_ahead.next_tag(), epoch, indices);
  }

  // Cancels the queued samples of `s` and waits until its tasks are done. Slots of unfinished
  // batches go back to the ring; slots held by the consumer stay with their Batch.
  void drain(std::unique_lock<std::mutex>& lk, EpochSchedule& s) {
    if (s.plan) {
      s.plan->cancelled.store(true, std::memory_order_relaxed);
      read_ahead.forget(*s.plan);  // wakes the tasks waiting for its reads
    }
    tuning.wake_lanes();
    cv.wait(lk, [&] { return std::all_of(s.pending.begin(), s.pending.end(), [](const auto& f) { return f->done; }); });
    for (auto& f : s.pending) ring.release(f->slot);
    s.pending.clear();
  }

  // Both epochs (the loader is shutting down, or the skip limit ended the epoch).
  void drain_all(std::unique_lock<std::mutex>& lk) {
    drain(lk, schedule);
    drain(lk, ahead);
    ahead = EpochSchedule{};
    cv.wait(lk, [&] { return running_tasks == 0; });
  }

  // The next epoch's plan, once the current epoch has nothing left to schedule: the epoch
  // epoch_step after it (a loader restarted on the same epoch, as a validation loader that is
  // never set_epoch'd, plans the same one again). On the consumer's thread only (next()): it
  // asks the sampler for that epoch's order, selecting it and then the current one again.
  void plan_ahead() {
    if (!options.prefetch_next_epoch || ahead.plan || !schedule.plan || schedule.more_to_schedule() || skips.ended ||
        shutdown) {
      return;
    }
    const int64_t current = sampler->epoch(), upcoming = schedule.epoch() + epoch_step;
    sampler->set_epoch(upcoming);
    std::vector<int64_t> indices = sampler->indices();
    sampler->set_epoch(current);
    ahead.plan = make_plan(upcoming, indices);  // announced batch by batch as pump schedules it
  }

  // Schedules batches while slots are free: the current epoch's, then the planned next one's.
  void pump(std::unique_lock<std::mutex>&) {
    if (shutdown) return;
    for (EpochSchedule* s : {&schedule, &ahead}) {
      while (s->more_to_schedule()) {
        Slot* slot = ring.acquire();
        if (!slot) return;
        auto f = std::make_shared<InFlight>();
        f->plan = s->plan;
        f->batch_index = s->next_submit;
        f->slot = slot;
        f->indices = s->plan->batches[static_cast<size_t>(s->next_submit)];
        read_ahead.announce_scheduled(*s, f->indices);  // an epoch planned ahead: one batch at a time
        ++s->next_submit;
        s->pending.push_back(f);
        enqueue(f.get());
      }
    }
  }

  void enqueue(InFlight* f) {
    ++running_tasks;
    // The task captures only plain pointers: the InFlight (and through it the epoch's plan) stays
    // owned by its schedule's pending list until drain() or next() has seen the task finish
    // (running_tasks, done), so it never frees anything after it says so. Its captures are
    // written under tbb_handoff_mutex() and read under it by the task.
    std::lock_guard<std::mutex> handoff(tbb_handoff_mutex());
    arena.enqueue([this, f, plan = f->plan.get()] {
      Impl* self;
      InFlight* batch;
      const EpochPlan* batch_plan;
      {
        std::lock_guard<std::mutex> handed_over(tbb_handoff_mutex());
        self = this;
        batch = f;
        batch_plan = plan;
      }
      self->run_batch(*batch, *batch_plan);
      // Notify under the lock: once running_tasks drops to 0 a draining destructor may free
      // the Impl (and cv) as soon as it can take mu, so the task must be done with both by then.
      std::lock_guard<std::mutex> g(self->mu);
      batch->done = true;
      --self->running_tasks;
      self->cv.notify_all();
    });
  }

  void run_batch(InFlight& f, const EpochPlan& p) {
    const auto n = f.indices.size();
    const int64_t base_pos = f.batch_index * p.options.batch_size;
    if (p.options.decode_device != DecodeDevice::kCpu) {
      if (f.slot->deferred.size() < n) f.slot->deferred.resize(static_cast<size_t>(p.options.batch_size));
      for (size_t k = 0; k < n; ++k) {
        f.slot->deferred[k].pending = false;
        f.slot->deferred[k].position = static_cast<int64_t>(k);
      }
    }
    datasets::detail::parallel_for_ordered(tbb::blocked_range<size_t>(0, n, 1), [&](const tbb::blocked_range<size_t>& r) {
      for (size_t k = r.begin(); k < r.end(); ++k) {
        if (cancelled(p)) break;
        if (!tuning.gates_lanes()) {
          run_sample(f, k, p, base_pos + static_cast<int64_t>(k));
        } else if (tuning.take_lane(p)) {
          struct Lane {
            detail::WorkerTuning& tuning;
            ~Lane() { tuning.give_lane(); }
          } lane{tuning};
          run_sample(f, k, p, base_pos + static_cast<int64_t>(k));
        }
      }
    });
  }

  // Loads dataset sample `index` into position k of the batch's slot; throws what loading throws.
  void load_into(InFlight& f, size_t k, int64_t index, const EpochPlan& p) {
    const datasets::SampleRef ref = dataset->at(index);
    uint8_t* out = f.slot->images + static_cast<size_t>(p.sample_bytes) * k;
    if (p.options.decode_device != DecodeDevice::kCpu && defer_to_gpu(k, f.indices.size())) {
      counters.account(defer_into(*dataset, read_ahead.reader(), p.tag, ref, index, p.epoch, p.options,
                                  f.slot->deferred[k], out));
    } else {
      // With views, view v's row k in its own [batch_size, S_v, S_v, 3] part of the slot.
      ViewOuts outs;
      for (size_t v = 0; v < p.view_offsets.size(); ++v)
        outs[v] = f.slot->images + p.view_offsets[v] + p.view_bytes[v] * static_cast<int64_t>(k);
      counters.account(transform_into(*dataset, read_ahead.reader(), p.tag, ref, index, p.epoch, p.options, out,
                                      {outs.data(), p.view_offsets.size()}));
    }
    f.slot->labels[k] = ref.label;
  }

  // Row k of n goes to the GPU: gpu_share of the rows, spread evenly over the batch.
  bool defer_to_gpu(size_t k, size_t n) const {
    const double share = gpu_share.load(std::memory_order_relaxed);
    if (share >= 1.0) return true;
    if (share <= 0.0 || n == 0) return false;
    return std::floor(static_cast<double>(k + 1) * share) > std::floor(static_cast<double>(k) * share);
  }

  void run_sample(InFlight& f, size_t k, const EpochPlan& p, int64_t pos) {
    const int64_t index = f.indices[k];
    try {
      load_into(f, k, index, p);
    } catch (...) {
      if (cancelled(p)) return;  // the epoch stopped (a read cancelled with it is no failure)
      if (options.error_policy == ErrorPolicy::kRaise) {
        f.fail(k, std::current_exception());
      } else {
        replace_failed(f, k, p, pos, std::current_exception());
      }
    }
  }

  // The skip policy's worker half: the replacement is the next sample of this rank's epoch order
  // that loads, a choice fixed by (epoch, position) and the files alone, so every run and every
  // thread count picks the same. (The limit is SkipAccount's, checked by next() in sampler order
  // for the same reason.)
  void replace_failed(InFlight& f, size_t k, const EpochPlan& p, int64_t pos, const std::exception_ptr& failure) {
    SkippedSample skip;
    skip.index = f.indices[k];
    skip.position = pos;
    if (skip.index >= 0 && skip.index < dataset->size()) skip.path = dataset->at(skip.index).source();
    describe_failure(failure, skip);
    gpufeed::log()->warn("skipping sample {} ({}): {}: {}", skip.index, skip.path, skip.kind,
                         skip.reason);
    const auto len = static_cast<int64_t>(p.order.size());
    const int64_t candidates = std::min(len - 1, kMaxReplacementCandidates);
    for (int64_t step = 1; step <= candidates; ++step) {
      if (cancelled(p)) return;
      const int64_t candidate = p.order[static_cast<size_t>((pos + step) % len)];
      try {
        load_into(f, k, candidate, p);
        skip.replaced_by = candidate;
        break;
      } catch (...) {
        // That candidate fails too (it is reported at its own position); try the next.
      }
    }
    if (skip.replaced_by < 0) {
      f.fail(k, std::make_exception_ptr(std::runtime_error(fmt::format(
                    "loader: no replacement loads for {} ({}: {}) among the next {} samples of "
                    "epoch {}",
                    skip.path, skip.kind, skip.reason, std::max<int64_t>(candidates, 0), p.epoch))));
    }
    f.add_skip(std::move(skip));
  }

  void release(Slot* slot) {
    std::unique_lock<std::mutex> lk(mu);
    if (tuning.grows_slots() && detail::idle_for_slots(ring, schedule, ahead)) tuning.saw_slots_full();
    ring.release(slot);
    pump(lk);
  }

  // The end of the epoch: std::nullopt for next(), the summary warning once.
  std::optional<Batch> epoch_exhausted() {
    if (schedule.plan && !skips.ended && !skips.summary.complete) {
      skips.summary.complete = true;
      if (skips.summary.skipped > 0) gpufeed::log()->warn("loader: {}", skips.summary.to_string());
    }
    return std::nullopt;
  }

  // The skip limit was crossed by batch `f`: the epoch ends here (in-flight batches are
  // cancelled, nothing more is scheduled) and next() throws.
  [[noreturn]] void end_epoch_at_skip_limit(std::unique_lock<std::mutex>& lk, InFlight& f) {
    EpochSummary at_limit = skips.summary;
    skips.ended = true;
    ring.release(f.slot);
    drain_all(lk);
    schedule.next_submit = schedule.total();
    gpufeed::log()->error("loader: {}", at_limit.to_string());
    throw SkipLimitExceeded(std::move(at_limit), options.max_skips);
  }

  Batch hand_out(InFlight& f) {
    Batch b;
    b.images = f.slot->images;
    b.labels = f.slot->labels;
    b.size = static_cast<int64_t>(f.indices.size());
    b.height = b.width = f.plan->side();
    for (size_t v = 0; v < f.plan->view_offsets.size(); ++v) {
      const int side = f.plan->options.views.views[v].rrc.size;
      b.views.push_back({f.slot->images + f.plan->view_offsets[v], side, side});
    }
    b.epoch = f.plan->epoch;
    b.batch_index = f.batch_index;
    b.indices = std::move(f.indices);
    b.skipped = std::move(f.skipped);
    for (size_t k = 0; k < f.slot->deferred.size() && k < b.indices.size(); ++k) {
      if (f.slot->deferred[k].pending) b.deferred.push_back(&f.slot->deferred[k]);
    }
    b.epoch_plan = f.plan;
    b.lease = std::shared_ptr<void>(f.slot, [owner = shared_from_this()](void* p) {
      // In a fork() child the loader's mutex may belong to a thread that stayed in the parent.
      if (owner->fork_guard.in_forked_child()) return;
      owner->release(static_cast<Slot*>(p));
    });
    return b;
  }
};

void LoaderOptions::validate() const {
  if (batch_size < 1) throw std::invalid_argument("Loader: batch_size must be >= 1");
  if (prefetch_depth < 1 && prefetch_depth != kAutoPrefetchDepth)
    throw std::invalid_argument("Loader: prefetch_depth must be >= 1 or kAutoPrefetchDepth");
  if (transform.output_size() < 1) throw std::invalid_argument("Loader: output size must be >= 1");
  if (shard_window < 1) throw std::invalid_argument(fmt::format("Loader: shard_window must be >= 1, not {}", shard_window));
  if (shard_partitions < 1)
    throw std::invalid_argument(fmt::format("Loader: shard_partitions must be >= 1, not {}", shard_partitions));
  if (max_image_size < 0 ||
      (max_image_size > 0 && max_image_size < transform.output_size())) {
    throw std::invalid_argument(fmt::format(
        "Loader: max_image_size {} is below the transform's output size {} (0 = the output size)",
        max_image_size, transform.output_size()));
  }
  transform.augment.validate();
  if (!views.empty()) {
    views.validate();
    if (views.views.size() > kMaxViews)
      throw std::invalid_argument(fmt::format("Loader: {} views; at most {}", views.views.size(), kMaxViews));
    if (decode_device != DecodeDevice::kCpu)
      throw std::invalid_argument(fmt::format(
          "Loader: views are decoded and augmented by the CPU workers; decode_device {} does not make them",
          to_string(decode_device)));
    if (max_image_size != 0)
      throw std::invalid_argument("Loader: max_image_size (progressive resizing) does not apply to views, whose sizes are their own");
    if (transform.kind != transforms::TransformOptions::Kind::kTrain || transform.augment.enabled())
      throw std::invalid_argument(
          "Loader: with views, each view carries its own augmentations; the transform must be the plain train "
          "transform (no eval transform, no augmentation given beside the views)");
  }
  if (decode_device != DecodeDevice::kCpu && transform.kind == transforms::TransformOptions::Kind::kTrain &&
      transform.augment.enabled()) {
    throw std::invalid_argument(fmt::format(
        "Loader: decode_device {} does the crop, resize and flip on the GPU but no other augmentation; "
        "use decode_device cpu with these augmentations",
        to_string(decode_device)));
  }
  if (gpu_decode_budget <= 0 || gpu_decode_budget > 1)
    throw std::invalid_argument(fmt::format("Loader: gpu_decode_budget {} must be in (0, 1]", gpu_decode_budget));
  if ((num_workers < 0 && num_workers != kAutoNumWorkers) || num_workers > kMaxNumWorkers)
    throw std::invalid_argument(fmt::format("Loader: num_workers {} must be in 0..{} (0 = the CPU budget) or "
                                            "kAutoNumWorkers ({})",
                                            num_workers, kMaxNumWorkers, kAutoNumWorkers));
}

Loader::Loader(std::shared_ptr<const datasets::Dataset> dataset, std::shared_ptr<sampler::Sampler> sampler,
               LoaderOptions options, std::shared_ptr<HostAllocator> allocator) {
  detail::check_fork_safe();
  if (!dataset) throw std::invalid_argument("Loader: dataset is null");
  if (!sampler) throw std::invalid_argument("Loader: sampler is null");
  options.validate();
  // No cv::setNumThreads here: Debian's OpenCV runs its parallel loops on oneTBB, where
  // cv::setNumThreads(n) installs a process-wide tbb::global_control(max_allowed_parallelism, n)
  // that would starve our arena (n = 0 leaves it no worker at all). Its loops nest inside our
  // tasks on the same TBB workers instead: one parallel layer, no extra threads.
  if (const CpuBudget& budget = cpu_budget_info(); options.num_workers > budget.cpus) {
    // DataLoader warns the same way: more decode threads than the CPUs the process may use only
    // add switching.
    gpufeed::log()->warn("loader: num_workers {} exceeds this process's CPU budget of {}", options.num_workers,
                         budget.describe());
  }
  impl_ = std::make_shared<Impl>(std::move(dataset), std::move(sampler), std::move(options),
                                 std::move(allocator));
}

Loader::~Loader() {
  if (impl_->fork_guard.in_forked_child()) {
    // Inherited through fork(): its tasks ran on threads that stayed in the parent, so draining
    // would wait forever. Its state is left as it is (a fork child's copy, freed at its exit).
    new std::shared_ptr<Impl>(std::move(impl_));
    return;
  }
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->shutdown = true;
  impl_->drain_all(lk);
  // impl_ may outlive us while the consumer still holds Batches: their leases keep it alive.
}

void Loader::start_epoch(int64_t epoch, int64_t start_batch) {
  Impl& m = *impl_;
  m.fork_guard.check_usable();
  std::unique_lock<std::mutex> lk(m.mu);
  m.drain(lk, m.schedule);  // what the previous epoch still has in flight
  const std::shared_ptr<const EpochPlan>& planned = m.ahead.plan;
  const bool take_ahead = planned && planned->epoch == epoch && start_batch == 0 &&
                          (planned->options.transform.kind != transforms::TransformOptions::Kind::kTrain ||
                           planned->side() == m.next_size);
  if (m.schedule.plan) {
    const int64_t step = epoch - m.schedule.epoch();
    m.epoch_step = step == 0 || step == 1 ? step : 1;
  }
  m.sampler->set_epoch(epoch);
  if (take_ahead) {
    m.schedule = std::move(m.ahead);  // its batches are decoding, or decoded, already
    m.read_ahead.announce_rest(m.schedule, m.schedule.announced);  // the rest of its order, now that it runs
  } else {
    m.drain(lk, m.ahead);
    // No task of this epoch runs yet: its size is fixed here, before its first task is enqueued.
    m.schedule = EpochSchedule{};
    m.schedule.plan = m.make_plan(epoch, m.sampler->indices());
    m.schedule.next_submit = std::clamp<int64_t>(start_batch, 0, m.schedule.total());
    m.schedule.consumed = m.schedule.next_submit;
    m.read_ahead.announce_rest(m.schedule, m.schedule.next_submit);
  }
  m.ahead = EpochSchedule{};
  m.skips.reset(epoch);
  m.have_return = false;  // the gap before this epoch's first next() is no consumer step
  m.pending_wait_s = 0;
  m.pump(lk);
}

std::optional<Batch> Loader::next() {
  Impl& m = *impl_;
  m.fork_guard.check_usable();
  if (m.options.decode_device != DecodeDevice::kCpu && !m.gpu_consumer.load(std::memory_order_relaxed)) {
    throw std::logic_error(fmt::format(
        "Loader: decode_device {} leaves JPEGs for the GPU decoder, which only the CUDA engine runs: give the "
        "batches a CUDA device (device='cuda' / --device cuda), or use decode_device cpu",
        to_string(m.options.decode_device)));
  }
  const auto asked = Clock::now();
  std::unique_lock<std::mutex> lk(m.mu);
  m.pump(lk);
  EpochSchedule& s = m.schedule;
  if (s.pending.empty()) {
    if (s.more_to_schedule()) {
      throw std::logic_error("Loader::next: all " + std::to_string(m.ring.size()) +
                             " slots are held by unreleased Batches; release one first or raise "
                             "prefetch_depth");
    }
    return m.epoch_exhausted();
  }
  std::shared_ptr<InFlight> f = s.pending.front();
  // The data wait: blocked here, plus in wait_ready() slices since the last batch.
  double waited = m.pending_wait_s;
  if (!f->done) {
    const auto t0 = Clock::now();
    m.cv.wait(lk, [&] { return f->done; });
    waited += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  m.skips.summary.wait_s += waited;
  if (f->batch_index == 0) m.skips.summary.first_wait_s = waited;
  const double consumer_s =
      m.have_return ? std::max(0.0, std::chrono::duration<double>(asked - m.last_return).count() - m.pending_wait_s)
                    : -1.0;
  m.pending_wait_s = 0;
  m.tune(*f, consumer_s, waited);
  s.pending.pop_front();
  ++s.consumed;
  m.plan_ahead();  // once this epoch is all scheduled, its free slots start the next one
  m.pump(lk);
  m.last_return = Clock::now();  // the consumer's next step starts now
  m.have_return = true;
  if (f->error) {
    m.ring.release(f->slot);
    m.pump(lk);
    std::rethrow_exception(f->error);
  }
  // Counted as handed out: a skip in an epoch decoded ahead and never started is not one.
  m.counters.skipped.fetch_add(static_cast<int64_t>(f->skipped.size()), std::memory_order_relaxed);
  if (m.skips.add_batch(*f, m.options)) m.end_epoch_at_skip_limit(lk, *f);
  return m.hand_out(*f);
}

bool Loader::wait_ready(std::chrono::nanoseconds timeout) {
  Impl& m = *impl_;
  m.fork_guard.check_usable();
  std::unique_lock<std::mutex> lk(m.mu);
  m.pump(lk);
  if (m.schedule.pending.empty()) return true;
  std::shared_ptr<InFlight> f = m.schedule.pending.front();
  if (f->done || timeout.count() <= 0) return f->done;
  // A blocking wait is the consumer's data wait (next() adds it to the batch's).
  const auto t0 = Clock::now();
  const bool ready = m.cv.wait_for(lk, timeout, [&] { return f->done; });
  m.pending_wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
  return ready;
}

void Loader::set_image_size(int size) {
  Impl& m = *impl_;
  if (!m.options.views.empty()) {
    throw std::invalid_argument(fmt::format(
        "Loader::set_image_size({}): each view has its own fixed size (LoaderOptions::views)", size));
  }
  if (m.options.transform.kind != transforms::TransformOptions::Kind::kTrain) {
    throw std::invalid_argument(fmt::format(
        "Loader::set_image_size({}): the eval transform's size is fixed (Resize {} + CenterCrop {})",
        size, m.options.transform.eval.resize, m.options.transform.eval.crop));
  }
  if (size < 1 || size > m.slot_side) {
    throw std::invalid_argument(fmt::format(
        "Loader::set_image_size({}): the size must be in [1, {}], the slots' side "
        "(LoaderOptions::max_image_size {}, transform output size {})",
        size, m.slot_side, m.options.max_image_size, m.options.transform.output_size()));
  }
  m.fork_guard.check_usable();
  std::lock_guard<std::mutex> g(m.mu);
  m.next_size = size;
}

int Loader::image_size() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->schedule.plan ? impl_->schedule.plan->side() : impl_->next_size;
}

int64_t Loader::num_batches() const {
  sampler::BatchSampler bs(impl_->sampler, impl_->options.batch_size, impl_->options.drop_last);
  return bs.size();
}

sampler::SamplerState Loader::state() const {
  impl_->fork_guard.check_usable();
  std::lock_guard<std::mutex> g(impl_->mu);
  return {impl_->schedule.epoch(), impl_->schedule.consumed};
}

const LoaderOptions& Loader::options() const { return impl_->options; }

void Loader::set_gpu_decode_share(double share) {
  impl_->gpu_share.store(std::clamp(share, 0.0, 1.0), std::memory_order_relaxed);
  impl_->gpu_consumer.store(true, std::memory_order_relaxed);
}

double Loader::gpu_decode_share() const { return impl_->gpu_share.load(std::memory_order_relaxed); }

std::optional<SkippedSample> Loader::decode_deferred_on_cpu(const Batch& batch, const DeferredSample& d, uint8_t* out) {
  Impl& m = *impl_;
  const auto* plan = static_cast<const EpochPlan*>(batch.epoch_plan.get());
  if (plan == nullptr) throw std::invalid_argument("Loader::decode_deferred_on_cpu: the batch has no epoch plan");
  try {
    auto t0 = Clock::now();
    SampleCost cost = start_cost(d.index, plan->epoch, t0);
    decode_bytes_into(d.bytes, d.source, d.index, plan->epoch, plan->options, out, cost, t0);
    m.counters.account(cost);
    return std::nullopt;
  } catch (...) {
    if (m.options.error_policy == ErrorPolicy::kRaise) throw;
    // The skip policy, as a worker applies it: the next samples of this rank's epoch order, on
    // the CPU, the first that loads takes the row.
    SkippedSample skip;
    skip.index = d.index;
    skip.position = batch.batch_index * plan->options.batch_size + d.position;
    skip.path = d.source;
    describe_failure(std::current_exception(), skip);
    gpufeed::log()->warn("skipping sample {} ({}): {}: {}", skip.index, skip.path, skip.kind, skip.reason);
    const auto len = static_cast<int64_t>(plan->order.size());
    const int64_t candidates = std::min(len - 1, kMaxReplacementCandidates);
    for (int64_t step = 1; step <= candidates && skip.replaced_by < 0; ++step) {
      const int64_t candidate = plan->order[static_cast<size_t>((skip.position + step) % len)];
      try {
        const datasets::SampleRef ref = m.dataset->at(candidate);
        m.counters.account(transform_into(*m.dataset, nullptr, plan->tag, ref, candidate, plan->epoch, plan->options, out));
        skip.replaced_by = candidate;
      } catch (...) {
        // that candidate fails too; the next
      }
    }
    if (skip.replaced_by < 0) {
      throw std::runtime_error(fmt::format("loader: no replacement loads for {} ({}: {}) among the next {} samples of epoch {}",
                                           skip.path, skip.kind, skip.reason, std::max<int64_t>(candidates, 0), plan->epoch));
    }
    {
      std::lock_guard<std::mutex> g(m.mu);
      if (!m.skips.ended && m.skips.summary.epoch == plan->epoch) {
        ++m.skips.summary.skipped;
        ++m.skips.summary.skipped_by_kind[skip.kind];
        m.skips.summary.skips.push_back(skip);
      }
    }
    return skip;
  }
}

int Loader::num_threads() const { return impl_->tuning.threads(); }

int Loader::prefetch_depth() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->ring.size();
}

std::vector<ThreadDecision> Loader::thread_decisions() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->tuning.decisions();
}
const datasets::Dataset& Loader::dataset() const { return *impl_->dataset; }
int64_t Loader::epoch_skips() const {
  impl_->fork_guard.check_usable();
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->skips.summary.skipped;
}

EpochSummary Loader::epoch_summary() const {
  impl_->fork_guard.check_usable();
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->skips.summary;
}

std::string EpochSummary::to_string() const {
  std::string text = "epoch " + std::to_string(epoch) + ": " + std::to_string(batches) +
                     " batches, " + std::to_string(samples) + " samples, " +
                     std::to_string(skipped) + " skipped";
  if (!skipped_by_kind.empty()) {
    text += " (";
    bool first = true;
    for (const auto& [kind, n] : skipped_by_kind) {
      text += (first ? "" : ", ") + kind + " " + std::to_string(n);
      first = false;
    }
    text += ")";
  }
  for (const SkippedSample& s : skips) text += "\n  " + s.path + ": " + s.kind + ": " + s.reason;
  return text;
}

SkipLimitExceeded::SkipLimitExceeded(EpochSummary summary, int64_t max_skips)
    : std::runtime_error("loader: " + std::to_string(summary.skipped) + " samples skipped in epoch " +
                         std::to_string(summary.epoch) + ", more than max_skips=" +
                         std::to_string(max_skips) +
                         (summary.skips.empty() ? std::string()
                                                : "; the last: " + summary.skips.back().path + ": " +
                                                      summary.skips.back().kind + ": " +
                                                      summary.skips.back().reason)),
      summary_(std::move(summary)),
      max_skips_(max_skips) {}

LoaderHistograms Loader::histograms() const { return impl_->counters.histograms(); }

SlotCounts Loader::slot_counts() const {
  Impl& m = *impl_;
  m.fork_guard.check_usable();
  std::lock_guard<std::mutex> g(m.mu);
  SlotCounts c;
  for (const EpochSchedule* s : {&m.schedule, &m.ahead}) {
    for (const auto& f : s->pending) (f->done ? c.ready : c.in_flight) += 1;
  }
  c.free = m.ring.free_count();
  c.held = m.ring.size() - c.ready - c.in_flight - c.free;
  return c;
}

void Loader::set_sample_observer(std::function<void(const SampleTiming&)> observer) {
  impl_->counters.set_observer(std::move(observer));
}

LoaderStats Loader::stats() const { return impl_->counters.stats(); }

}  // namespace gpufeed::loader
