#pragma once
// The batch assembler: a oneTBB arena decodes and augments samples straight into preallocated
// batch slots, and hands out batches strictly in sampler order.
//
// Memory is bounded: exactly `prefetch_depth` slots exist (allocated up front by the injected
// HostAllocator); a batch occupies its slot from the moment its first sample is scheduled until
// the consumer releases the Batch. When all slots are busy the workers wait: a slow consumer
// slows the loader, it never grows memory.

#include <cstdint>
#include <memory>
#include <optional>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/loader/batch.h"
#include "gpufeed/loader/dataset.h"
#include "gpufeed/loader/host_allocator.h"
#include "gpufeed/loader/transform.h"
#include "gpufeed/sampler/sampler.h"

namespace gpufeed::loader {

/// What the loader does when a sample cannot be read or decoded.
enum class ErrorPolicy {
  kRaise,  ///< next() throws the sample's decode::DecodeError (path and reason in what())
  kSkip,   ///< replace it deterministically by the next good sample of the same batch list, count
           ///< and report it in Batch::skipped; more than max_skips per epoch is an error
};

/// Loader options, DataLoader's vocabulary where one exists.
struct LoaderOptions {
  int64_t batch_size = 256;   ///< samples per batch
  bool drop_last = false;     ///< drop the last, short batch (DataLoader's drop_last)
  int num_workers = 0;        ///< decode threads in the loader's arena; 0 = all hardware threads
  int prefetch_depth = 3;     ///< batch slots that exist, held by the consumer included; >= 1
  uint64_t seed = 0;          ///< augmentation seed: sample i of epoch e draws from (seed, e, i)
  TransformOptions transform{};        ///< train or eval transform and its parameters
  decode::DecodeOptions decode{};      ///< pixel limit, truncated-data policy (scale/crop ignored)
  ErrorPolicy error_policy = ErrorPolicy::kRaise;
  int64_t max_skips = 100;    ///< skip policy: more skips than this in one epoch is an error
};

/// Loader-side counters, summed over the loader's life.
struct LoaderStats {
  int64_t samples = 0;        ///< samples written into slots
  int64_t skipped = 0;        ///< samples replaced under the skip policy
  int64_t bytes_read = 0;     ///< file bytes read
  double read_s = 0;          ///< summed over threads: reading files
  double decode_s = 0;        ///< summed over threads: probe + decode
  double resize_s = 0;        ///< summed over threads: resize + flip into the slot
  int64_t decoded_pixels = 0; ///< pixels the decoder produced (DCT scaling and crops shrink this)
};

/// Turns a Dataset and a Sampler into batches of [N, S, S, 3] uint8 images and [N] int64 labels.
///
///   Loader loader(dataset, sampler, options);
///   loader.start_epoch(e);                       // calls sampler->set_epoch(e)
///   while (auto batch = loader.next()) use(*batch);
///
/// Batches come out in sampler order whatever the thread count, and each sample's pixels depend
/// only on (seed, epoch, index, file): 1 thread and 16 threads give identical batches.
/// Not thread-safe: one consumer thread calls start_epoch/next. Destroying the loader mid-epoch
/// cancels pending samples and joins its tasks before returning.
class Loader {
 public:
  /// Allocates all slots up front. Throws std::invalid_argument for a null dataset/sampler or
  /// bad options (batch_size < 1, prefetch_depth < 1).
  Loader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<sampler::Sampler> sampler,
         LoaderOptions options, std::shared_ptr<HostAllocator> allocator = nullptr);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Begins epoch `epoch`: sets the sampler's epoch and starts decoding from batch
  /// `start_batch` (for mid-epoch resume: the batches before it are not produced). Cancels and
  /// waits for whatever the previous epoch still had in flight.
  void start_epoch(int64_t epoch, int64_t start_batch = 0);

  /// The next batch in sampler order, blocking until it is ready; std::nullopt when the epoch is
  /// exhausted (or no epoch was started). Under kRaise, rethrows the first error of the batch
  /// (decode::DecodeError naming the file and the reason) and the loader stays usable for
  /// start_epoch and destruction.
  std::optional<Batch> next();

  /// Batches per epoch (len(DataLoader)).
  int64_t num_batches() const;
  /// The epoch and the number of batches next() has returned in it, for checkpoints.
  sampler::SamplerState state() const;
  /// The options in force.
  const LoaderOptions& options() const;
  /// The dataset.
  const Dataset& dataset() const;
  /// Counters so far.
  LoaderStats stats() const;
  /// Skips counted in the current epoch.
  int64_t epoch_skips() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// Decodes and transforms one sample exactly as the loader's workers do, into `out`
/// ([S, S, 3] uint8, S = options.transform.output_size()). For tests and tools; uses a
/// thread-local decoder. Throws decode::DecodeError.
void load_sample(const Dataset& dataset, int64_t index, int64_t epoch, const LoaderOptions& options,
                 uint8_t* out);

}  // namespace gpufeed::loader
