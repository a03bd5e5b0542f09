#pragma once
// The batch assembler: a oneTBB arena decodes and augments samples straight into preallocated
// batch slots, and hands out batches strictly in sampler order.
//
// Memory is bounded: exactly `prefetch_depth` slots exist (allocated up front by the injected
// HostAllocator, sized for the largest side the loader may produce: max_image_size); a batch
// occupies its slot from the moment its first sample is scheduled until the consumer releases
// the Batch. When all slots are busy the workers wait: a slow consumer slows the loader, it never
// grows memory.

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/option.h"
#include "gpufeed/loader/batch.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/host_allocator.h"
#include "gpufeed/loader/thread_tuner.h"
#include "gpufeed/transforms/transform.h"
#include "gpufeed/transforms/views.h"
#include "gpufeed/sampler/sampler.h"
#include "gpufeed/sampler/shard_order.h"

namespace gpufeed::loader {

/// What the loader does when a sample cannot be read or decoded (a decode::DecodeError: the file
/// is missing, unreadable, empty, truncated, corrupt, unsupported or too large).
enum class ErrorPolicy {
  /// next() throws the error of the batch's first failing sample in sampler order (a
  /// decode::DecodeError naming the file and the reason), whatever the thread count.
  kRaise,
  /// The failing sample is replaced by the next sample of this rank's epoch order (wrapping
  /// around) that loads, within 63 candidates: that sample's own pixels and label, so batch
  /// shapes and the number of batches stay fixed and every thread count gives the same batches.
  /// Each replacement is reported in Batch::skipped and in epoch_summary(), logged as a warning,
  /// and summarised in one warning when the epoch ends. More than max_skips in one epoch, counted
  /// in sampler order, makes next() throw SkipLimitExceeded.
  kSkip,
};

/// "raise", "skip".
std::string_view to_string(ErrorPolicy policy);
/// Parses the names above; throws options::OptionError naming `on_error` otherwise.
ErrorPolicy parse_error_policy(std::string_view name);

/// Which order the fronts (gpufeed.DataLoader, the trainer) deal a shuffled epoch in: the
/// `shuffle_order` option (make_rank_sampler, gpufeed/loader/rank_sampler.h). The Loader itself
/// takes any sampler; these fields only choose the one a front builds.
enum class ShuffleOrder {
  /// kShards for remote shards (Dataset::remote(): a read is a request, and DistributedSampler's
  /// order costs one request per sample), kExact otherwise.
  kAuto,
  /// DistributedSampler's global order, index for index PyTorch's (sampler::ResumedDistributedSampler).
  kExact,
  /// The shard-aware order (sampler::ShardAwareSampler): whole shards mixed within a window,
  /// the same global list for every world size. Needs a dataset of shards (Dataset::shard_sizes).
  kShards,
};

/// "auto", "exact", "shards".
std::string_view to_string(ShuffleOrder order);
/// Parses the names above; throws options::OptionError naming `shuffle_order` otherwise.
ShuffleOrder parse_shuffle_order(std::string_view name);

/// The most threads a Loader (or gpufeed pack) runs: more is refused with std::invalid_argument
/// instead of failing inside the thread pool (pthread_create runs out of resources somewhere
/// above tens of thousands of threads, and the process aborts).
inline constexpr int kMaxNumWorkers = 1024;

/// LoaderOptions::num_workers = kAutoNumWorkers ("auto" in the CLI and Python): the loader picks
/// its thread count from measurements, the fewest threads that keep the consumer's data wait
/// under 1%, within the CPU budget, and adapts when the consumer's rate or the per-sample cost
/// changes (the rule: gpufeed/loader/thread_tuner.h). It starts with the whole budget; every
/// change is a ThreadDecision (Loader::thread_decisions()). Samples are identical for any count.
inline constexpr int kAutoNumWorkers = -1;

/// LoaderOptions::prefetch_depth = kAutoPrefetchDepth ("auto"): the loader starts with
/// kAutoPrefetchStart slots and adds one (allocating it, on the consumer's thread) whenever a
/// window of batches saw the consumer wait more than 1% while every slot was full at some point
/// (the loader had decoded as far ahead as the slots allow, then the consumer caught up: a
/// bursty consumer), up to kAutoPrefetchMax slots and at most 1/16 of the machine's physical
/// memory in slots. Each addition is a ThreadDecision whose prefetch_depth_to is one more.
inline constexpr int kAutoPrefetchDepth = -1;
inline constexpr int kAutoPrefetchStart = 3;
inline constexpr int kAutoPrefetchMax = 16;

/// What the autotuners (num_workers auto, prefetch_depth auto) observe for one batch next()
/// hands out: the input of LoaderOptions::tuner_observation.
struct TunerObservation {
  int64_t epoch = 0;         ///< the batch's epoch
  int64_t batch = 0;         ///< its index in the epoch
  int threads = 0;           ///< decode threads in force when it was handed out (Loader::num_threads())
  int prefetch_depth = 0;    ///< batch slots that exist then (Loader::prefetch_depth())
  /// The consumer's step before asking for this batch, seconds, its data wait excluded: the time
  /// since next() last returned, less the blocking wait_ready() slices since. Negative: unknown
  /// (the epoch's first batch: the gap before it is no step).
  double consumer_s = -1;
  /// The consumer's data wait for this batch, seconds: blocked in next() plus in wait_ready()
  /// slices since the last batch.
  double wait_s = 0;
  /// Worker thread time per sample (read + decode + resize), seconds, averaged over the samples
  /// decoded since the tuning window before this one ended; <= 0: unknown (none decoded yet).
  double sample_cost_s = 0;
};

/// Where the loader's samples are decoded (LoaderOptions::decode_device).
enum class DecodeDevice {
  kCpu,   ///< the workers decode every sample (libjpeg-turbo, torchvision-exact)
  kGpu,   ///< the workers read, probe and plan; the CUDA engine decodes JPEGs on the GPU (nvImageCodec)
  kAuto,  ///< each batch shared between the two, in the proportion the engine measures keeps both busy
};
std::string_view to_string(DecodeDevice device);
/// "cpu", "gpu" or "auto"; throws options::OptionError naming decode_device otherwise.
DecodeDevice parse_decode_device(std::string_view name);

/// Loader options, DataLoader's vocabulary where one exists.
struct LoaderOptions {
  int64_t batch_size = 256;   ///< samples per batch
  bool drop_last = false;     ///< drop the last, short batch (DataLoader's drop_last)
  int num_workers = 0;        ///< decode threads in the loader's arena; 0 = the CPU budget (gpufeed/cpu_budget.h: the affinity mask and cgroup quota); kAutoNumWorkers = chosen from measurements; at most kMaxNumWorkers
  int prefetch_depth = 3;     ///< batch slots that exist, held by the consumer included; >= 1, or kAutoPrefetchDepth
  uint64_t seed = 0;          ///< augmentation seed: sample i of epoch e draws from (seed, e, i)
  transforms::TransformOptions transform{};        ///< train or eval transform and its parameters
  /// Multi-crop (DINO, DINOv2): K views of every sample from one decode (transforms/views.h), in
  /// place of `transform`'s single output: Batch::views holds view k as [size, S_k, S_k, 3]
  /// uint8. Empty (the default): the single-view transform. Needs decode_device cpu,
  /// max_image_size 0 and a `transform` without augmentations (the views carry their own).
  transforms::ViewsOptions views{};
  decode::DecodeOptions decode{};      ///< pixel limit, truncated-data policy (scale/crop ignored)
  ErrorPolicy error_policy = ErrorPolicy::kRaise;
  int64_t max_skips = 100;    ///< skip policy: more skips than this in one epoch is an error
  /// Train transform: the largest output side Loader::set_image_size may set (progressive
  /// resizing, as FFCV's ResNet recipe changes RandomResizedCrop's size between epochs). The
  /// slots are allocated once, up front, for batch_size x max_image_size^2 x 3 bytes of images.
  /// 0: transform.output_size() (the size never grows). Otherwise must be >= transform.output_size().
  int max_image_size = 0;
  /// Decode the expected next epoch's first batches while the current one ends, so that epoch
  /// starts without a wait (Loader::start_epoch). Off for a loader used for one epoch only (the
  /// trainer's validation loader), where that work would be thrown away.
  bool prefetch_next_epoch = true;
  /// The shuffled order the fronts build (ShuffleOrder); shard_window and shard_partitions are
  /// sampler::ShardOrderOptions' window and partitions (its defaults), used by kShards only.
  ShuffleOrder shuffle_order = ShuffleOrder::kAuto;
  int64_t shard_window = sampler::ShardOrderOptions{}.window;
  int64_t shard_partitions = sampler::ShardOrderOptions{}.partitions;
  /// cpu: the workers decode. gpu/auto: JPEGs the GPU decodes (8-bit Huffman, grey or colour) are
  /// read, probed and planned by the workers and handed out in Batch::deferred for the CUDA engine
  /// (gpufeed/device/engine.h) to decode on the GPU; everything else is decoded by the workers.
  /// Needs a CUDA consumer (the engine); augmentations other than RandomResizedCrop and the flip
  /// are not done on the GPU, so gpu/auto refuse them.
  DecodeDevice decode_device = DecodeDevice::kCpu;
  /// decode_device auto: the most GPU time the decoder may take, as a fraction of the time between
  /// the consumer's batches (its training step), measured with CUDA events; the share moves down
  /// when the decoder passes it.
  double gpu_decode_budget = 0.25;
  /// Not an option (no flag or keyword): for tests and tools that replay measurements. Called
  /// once per batch next() hands out while num_workers or prefetch_depth is auto, on the
  /// consumer's thread with the loader's lock held (it must not call the Loader), with what the
  /// loader measured for that batch; the autotuners decide from what it returns (its epoch,
  /// batch, threads and prefetch_depth are ignored), so a test drives their decisions with
  /// measurements it chose. The batches and EpochSummary's waits are the measured ones whatever
  /// it returns. Null: the measurements are used (production).
  std::function<TunerObservation(const TunerObservation& measured)> tuner_observation{};

  /// The rules a Loader needs of these options: batch_size >= 1; prefetch_depth >= 1 or
  /// kAutoPrefetchDepth; num_workers in 0..kMaxNumWorkers or kAutoNumWorkers; a transform output
  /// size >= 1; max_image_size 0 or >= that size; the augmentations' (AugmentOptions::validate);
  /// views valid (ViewsOptions::validate) and, when given, with decode_device cpu, no
  /// max_image_size and no augmentation in `transform`.
  /// Throws std::invalid_argument naming the field and its value. The one place these rules
  /// live: Loader's constructor calls it, and so does loader_options_schema() after a front
  /// has set its options.
  void validate() const;
};

/// LoaderOptions' user-facing fields, transform and augmentations included (gpufeed/option.h):
/// batch_size, drop_last, num_workers, prefetch_depth, seed, on_error, max_skips, strict_decode,
/// max_image_size, views and local_crops_number (a preset of transforms::views_preset), then
/// transform_options_schema()'s. The CLI's --batch-size ... and
/// gpufeed.DataLoader's keywords are generated from it.
const options::Schema<LoaderOptions>& loader_options_schema();

/// One epoch's account, over the batches next() has returned so far (the whole epoch once next()
/// has returned std::nullopt): the skip policy's, and the consumer's wait.
struct EpochSummary {
  int64_t epoch = 0;      ///< the epoch start_epoch() began
  int64_t batches = 0;    ///< batches next() returned in it (batches before a resume point excluded)
  int64_t samples = 0;    ///< samples in those batches
  int64_t skipped = 0;    ///< samples replaced under kSkip (= skips.size())
  bool complete = false;  ///< next() returned std::nullopt: the epoch ran to its end
  /// Time next() blocked waiting for these batches to be decoded, seconds: the consumer's data
  /// wait as the loader sees it. `first_wait_s` is its part for the epoch's first batch, which
  /// the loader decodes ahead, while the previous epoch's last batches are consumed, when that
  /// epoch is started as it expected (see Loader::start_epoch).
  double wait_s = 0;
  double first_wait_s = 0;
  std::map<std::string, int64_t> skipped_by_kind;  ///< count per SkippedSample::kind
  std::vector<SkippedSample> skips;                ///< every replaced sample, in sampler order

  /// "epoch E: B batches, N samples, K skipped (corrupt 2, io 1)" and, when K > 0, one
  /// "  path: kind: reason" line per skip.
  std::string to_string() const;
};

/// Thrown by Loader::next() under ErrorPolicy::kSkip when the epoch's skips, counted in sampler
/// order, exceed LoaderOptions::max_skips: a flood of bad files is an error, not a quiet epoch.
/// The epoch ends there (later next() calls return std::nullopt until start_epoch).
class SkipLimitExceeded : public std::runtime_error {
 public:
  /// `summary` covers the batches up to and including the one that crossed the limit.
  SkipLimitExceeded(EpochSummary summary, int64_t max_skips);
  /// The epoch's account up to the batch that crossed the limit.
  const EpochSummary& summary() const noexcept { return summary_; }
  /// The limit in force.
  int64_t max_skips() const noexcept { return max_skips_; }

 private:
  EpochSummary summary_;
  int64_t max_skips_;
};

/// Loader-side counters, summed over the loader's life.
struct LoaderStats {
  int64_t samples = 0;        ///< samples written into slots
  int64_t skipped = 0;        ///< samples replaced under the skip policy, in batches next() returned
  int64_t bytes_read = 0;     ///< file bytes read
  double read_s = 0;          ///< summed over threads: reading files
  double decode_s = 0;        ///< summed over threads: probe + decode
  double resize_s = 0;        ///< summed over threads: resize + flip into the slot
  int64_t decoded_pixels = 0; ///< pixels the decoder produced (DCT scaling and crops shrink this)
  /// Decoder::decode calls that produced pixels: one per sample written, views or not (a sample
  /// with K views is decoded once, but for the rare samples whose views
  /// transforms::decode_views_separately decodes one by one), replacements under the skip policy
  /// included; samples left to the GPU decoder (decode_device gpu/auto) are not counted.
  int64_t decodes = 0;
};

/// Per-sample stage times in power-of-two microsecond buckets: counts[0] holds times below 1 us,
/// counts[k] times in [2^(k-1), 2^k) us, the last bucket everything from 2^(kBuckets-2) us up.
struct LatencyHistogram {
  static constexpr int kBuckets = 26;  ///< the last bucket starts at 2^24 us (about 16.8 s)
  std::array<int64_t, kBuckets> counts{};

  /// Bucket of a duration in nanoseconds (negative counts as 0).
  static int bucket_of_ns(int64_t ns) {
    const auto us = static_cast<uint64_t>(ns > 0 ? ns / 1000 : 0);
    return std::min(kBuckets - 1, static_cast<int>(std::bit_width(us)));
  }
  /// Lower edge of bucket k, microseconds (0 for bucket 0).
  static double lower_us(int k) { return k <= 0 ? 0.0 : static_cast<double>(uint64_t{1} << (k - 1)); }
  /// Samples counted.
  int64_t total() const {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    return n;
  }
  /// Approximate q-quantile (q in [0, 1]) in microseconds: the geometric middle of the bucket
  /// holding it (0.5 us for bucket 0); 0 when empty.
  double quantile_us(double q) const {
    const int64_t n = total();
    if (n == 0) return 0;
    const auto rank = static_cast<int64_t>(std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(n)));
    int64_t seen = 0;
    for (int k = 0; k < kBuckets; ++k) {
      seen += counts[static_cast<size_t>(k)];
      if (seen >= std::max<int64_t>(rank, 1)) return k == 0 ? 0.5 : lower_us(k) * std::sqrt(2.0);
    }
    return lower_us(kBuckets - 1) * std::sqrt(2.0);
  }
};

/// Per-sample histograms of the three stages a worker times (see LoaderStats for the sums).
struct LoaderHistograms {
  LatencyHistogram read;    ///< reading the file's bytes
  LatencyHistogram decode;  ///< probe + decode
  LatencyHistogram resize;  ///< resize + flip into the slot
};

/// Where the loader's slots are at one moment. The four counts add up to prefetch_depth.
struct SlotCounts {
  int ready = 0;      ///< batches complete and waiting for next()
  int in_flight = 0;  ///< batches whose samples are still being decoded
  int held = 0;       ///< returned by next() and not yet released by the consumer
  int free = 0;       ///< idle: nothing left to schedule, or the epoch has not started
};

/// One sample's trip through a worker thread, reported to a sample observer.
struct SampleTiming {
  int64_t index = -1;     ///< dataset index
  int64_t epoch = 0;
  int thread = 0;         ///< the worker's index in the loader's arena, 0-based
  int64_t start_ns = 0;   ///< std::chrono::steady_clock time (since its epoch) reading began
  int64_t read_ns = 0;    ///< reading took this long; decode and resize follow back to back
  int64_t decode_ns = 0;
  int64_t resize_ns = 0;
};

/// Turns a Dataset and a Sampler into batches of [N, S, S, 3] uint8 images and [N] int64 labels.
///
///   Loader loader(dataset, sampler, options);
///   loader.set_image_size(s);                    // optional, train: S of the next epoch started
///   loader.start_epoch(e);                       // calls sampler->set_epoch(e)
///   while (auto batch = loader.next()) use(*batch);
///
/// Batches come out in sampler order whatever the thread count, and each sample's pixels depend
/// only on (seed, epoch, index, file, S): 1 thread and 16 threads give identical batches, and a
/// sample at side S is byte-equal to the same sample of a loader built with rrc.size = S.
/// Not thread-safe: one consumer thread calls start_epoch/next. Destroying the loader mid-epoch
/// cancels pending samples and joins its tasks before returning.
class Loader {
 public:
  /// Allocates all slots up front, for max(options.max_image_size, transform.output_size()).
  /// Throws std::invalid_argument for a null dataset/sampler or bad options (batch_size < 1,
  /// prefetch_depth < 1, num_workers < 0 other than kAutoNumWorkers, 0 < max_image_size <
  /// transform.output_size()),
  /// std::runtime_error naming the sizes when the slots cannot be allocated. Logs a warning
  /// when num_workers exceeds the process's CPU budget (as DataLoader does), saying what the
  /// budget is made of (affinity mask, cgroup quota).
  Loader(std::shared_ptr<const datasets::Dataset> dataset, std::shared_ptr<sampler::Sampler> sampler,
         LoaderOptions options, std::shared_ptr<HostAllocator> allocator = nullptr);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Begins epoch `epoch`: sets the sampler's epoch and starts decoding from batch
  /// `start_batch` (for mid-epoch resume on the same world size: the batches before it are not
  /// produced; to resume an epoch that another number of ranks began, give the loader a
  /// sampler::ResumedDistributedSampler (gpufeed/sampler/resume.h) and start at batch 0: this
  /// rank's part of the positions the old ranks had not consumed, each delivered once). Cancels and
  /// waits for whatever the previous epoch still had in flight. The epoch's batches have side
  /// image_size(), the size set_image_size last set (else transform.output_size()).
  ///
  /// No stall at epoch starts: once every batch of the current epoch is scheduled, the loader
  /// plans the epoch it expects next (the epoch after it; the same epoch again when the last two
  /// start_epoch calls gave the same one, as for a validation loader) at the size
  /// set_image_size last set, and decodes its first batches into the slots the current epoch
  /// leaves free. start_epoch(that epoch, 0) at that size takes them over, so its first next()
  /// finds them decoded; any other start_epoch cancels them. Samples are the same either way;
  /// a loader never asked for that epoch wastes at most prefetch_depth batches of work. The
  /// sampler's order of the expected epoch is read on the consumer's thread (in next()), by
  /// selecting that epoch and then the current one again with set_epoch. For progressive
  /// resizing, set the next epoch's size during the current one (it applies to epochs started
  /// later only).
  void start_epoch(int64_t epoch, int64_t start_batch = 0);

  /// Progressive resizing (FFCV's ResNet recipe: RandomResizedCrop's output size changes between
  /// epochs): the train transform's output side, pixels, for the epochs started from now on
  /// (rrc.size = `size`; the epoch in progress and the batches already handed out keep theirs;
  /// Batch::height/width tell consumers). A resumed epoch gets the size set before its
  /// start_epoch, so a caller resumes with its schedule's size for that epoch. Throws
  /// std::invalid_argument naming both sizes when `size` exceeds the slots' side
  /// (LoaderOptions::max_image_size), when size < 1, or for an eval transform (its
  /// Resize/CenterCrop are fixed).
  void set_image_size(int size);
  /// The output side of the epoch started last; before any start_epoch, the side the first
  /// epoch will have.
  int image_size() const;

  /// The next batch in sampler order, blocking until it is ready; std::nullopt when the epoch is
  /// exhausted (or no epoch was started). Under kRaise, throws the error of the batch's first
  /// failing sample in sampler order (decode::DecodeError naming the file and the reason); the
  /// batch is dropped, a later call returns the following batch, and the loader stays usable for
  /// start_epoch and destruction. Under kSkip, throws SkipLimitExceeded past max_skips, and
  /// std::runtime_error naming the file when none of its 63 replacement candidates loads.
  std::optional<Batch> next();

  /// Waits up to `timeout` (0: does not wait) until next() can return without blocking: the next
  /// batch is complete (or failed), or there is none to wait for (epoch exhausted, no epoch
  /// started, every slot held). True when next() would return at once. Lets a caller wait in
  /// short slices (the Python binding checks for Ctrl-C between them) and lets the CUDA
  /// prefetcher take only batches that are already decoded.
  bool wait_ready(std::chrono::nanoseconds timeout);

  /// Batches per epoch (len(DataLoader)).
  int64_t num_batches() const;
  /// The epoch and the number of batches next() has returned in it, for checkpoints.
  sampler::SamplerState state() const;
  /// The options the loader was built with (transform.rrc.size as given there: image_size()
  /// is the current epoch's side).
  const LoaderOptions& options() const;

  /// decode_device gpu/auto: the fraction of each batch's rows the workers leave to the GPU
  /// (Batch::deferred), spread evenly over the batch, clamped to [0, 1]; applies to batches not
  /// yet started. The CUDA engine calls it (1 under gpu; its controller's share under auto): until
  /// something has, next() under decode_device gpu/auto throws std::logic_error, since nothing
  /// would decode the deferred rows. Ignored under cpu.
  void set_gpu_decode_share(double share);
  double gpu_decode_share() const;
  /// Decodes deferred row `d` of `batch` on the calling thread as the workers would have (the CPU
  /// path, from d.bytes), into `out` ([S, S, 3] uint8): the fallback for a sample the GPU could not
  /// decode. Under on_error raise a failure throws (decode::DecodeError naming the file); under
  /// skip the next samples of the epoch order are tried, the first that loads fills `out`, and the
  /// skip is returned (and counted in the epoch's summary). Throws std::runtime_error when no
  /// replacement loads.
  std::optional<SkippedSample> decode_deferred_on_cpu(const Batch& batch, const DeferredSample& d, uint8_t* out);
  /// The decode threads the loader runs now: options().num_workers, for 0 the process's CPU
  /// budget (gpufeed/cpu_budget.h) when the loader was built, for kAutoNumWorkers the count
  /// its last ThreadDecision chose (the budget before the first). Thread-safe.
  int num_threads() const;
  /// num_workers = kAutoNumWorkers or prefetch_depth = kAutoPrefetchDepth: every change of the
  /// thread count or of the slots so far, oldest first (the last 1024); empty otherwise.
  /// Thread-safe.
  std::vector<ThreadDecision> thread_decisions() const;
  /// The batch slots that exist now: options().prefetch_depth, or under kAutoPrefetchDepth the
  /// kAutoPrefetchStart it began with plus those added since. Thread-safe.
  int prefetch_depth() const;
  /// The dataset.
  const datasets::Dataset& dataset() const;
  /// Counters so far.
  LoaderStats stats() const;
  /// Skips in the batches next() has returned in the current epoch (epoch_summary().skipped).
  int64_t epoch_skips() const;
  /// The current epoch's skip account so far (see EpochSummary). Thread-safe.
  EpochSummary epoch_summary() const;
  /// Histograms of per-sample read/decode/resize times so far (successful samples only).
  LoaderHistograms histograms() const;
  /// A snapshot of the slots (takes the loader's lock briefly).
  SlotCounts slot_counts() const;
  /// Calls `observer` on the worker thread after each successfully loaded sample (profilers,
  /// traces). It runs concurrently on every worker, so it must be thread-safe and quick. May be
  /// set or replaced (an empty function removes it) at any time.
  void set_sample_observer(std::function<void(const SampleTiming&)> observer);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// One sample's plan as the loader's workers make it from the file's header: the transform's
/// box, region and flip (plan_sample), and the decode's DCT scale and crop window
/// (decode_options_for).
struct PlannedSample {
  transforms::SamplePlan plan;
  decode::DecodeOptions decode;
};

/// Plans sample `index` of `epoch` for a source with header `info` (decode::probe) exactly as the
/// loader does: in the frame the decoder returns (width and height swapped when
/// options.decode.apply_exif_orientation and the EXIF orientation transposes, 5..8), with
/// options.transform, options.seed and options.decode. The one place a sample's work is planned:
/// the loader, the benchmark's decode floor and anything else that must replay the loader's work
/// call it. Pure function of its arguments; throws what plan_sample throws.
PlannedSample plan_for(const decode::ImageInfo& info, const LoaderOptions& options, int64_t epoch,
                       int64_t index);

/// The bytes one sample takes in a slot: S x S x 3 (S = transform.output_size()), or with views
/// the sum of their S_k x S_k x 3.
int64_t sample_bytes(const LoaderOptions& options);

/// Decodes and transforms one sample exactly as the loader's workers do, into `out`
/// ([S, S, 3] uint8, S = options.transform.output_size(); with options.views the K views back to
/// back, view k [S_k, S_k, 3], sample_bytes(options) in all). For tests and tools; uses a
/// thread-local decoder. Throws decode::DecodeError.
void load_sample(const datasets::Dataset& dataset, int64_t index, int64_t epoch, const LoaderOptions& options,
                 uint8_t* out);
/// The same, its bytes read through `reader` (dataset.reader()) as plan `tag`'s (announce the
/// index first): once the reader forgets `tag`, a read waiting there throws decode::DecodeError
/// kIo ("cancelled"), so another thread can abandon a stalled remote read.
void load_sample(const datasets::Dataset& dataset, datasets::SampleReader& reader, uint64_t tag, int64_t index, int64_t epoch,
                 const LoaderOptions& options, uint8_t* out);

}  // namespace gpufeed::loader
