#pragma once
// The sampler a front (gpufeed.DataLoader, the trainer) deals a rank's epochs with: the
// `shuffle_order` option resolved against the dataset (docs/DATASETS.md, "Shuffle order"; the
// choice of names and default: docs/DESIGN-NOTES.md, "loader: shuffle_order").

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/sampler/resume.h"

namespace gpufeed::loader {

/// The order `requested` means for `dataset` (never kAuto): kAuto is kShards for remote data
/// (Dataset::remote()) made of shards, kExact otherwise. Throws options::OptionError naming
/// `shuffle_order` and `data_name` for kShards on a dataset without shards (empty
/// Dataset::shard_sizes()). Several sources (datasets::MixedDataset) are mixed by pieces of
/// shards, a source without shards counting each sample as a shard (sampler/mixing.h): kAuto is
/// kShards when some source is remote, kExact otherwise, and kShards is always accepted.
ShuffleOrder resolve_shuffle_order(const datasets::Dataset& dataset, ShuffleOrder requested,
                                   std::string_view data_name);

/// How a rank's batches mix classes in epoch 0 (every sample's label from Dataset::at): the mean
/// number of distinct labels per batch of options.batch_size over this rank's first
/// `max_batches` batches under the shard-aware order (`shards`) and under the exact order
/// (`exact`, DistributedSampler's), for the same rank, seed and shuffle. A shard-aware figure far
/// below the exact one means the shards hold their samples grouped by class (an ImageFolder
/// packed in its order) and a window of shard_window shards cannot mix them: the cure is shards
/// written shuffled (`gpufeed pack --shuffle`). The dataset must have shards.
struct ClassMixing {
  double shards = 0;    ///< distinct labels per batch, shard-aware order
  double exact = 0;     ///< distinct labels per batch, DistributedSampler's order
  int64_t batches = 0;  ///< batches measured (full batches only; 0 when the rank has none)
};
ClassMixing class_mixing(const datasets::Dataset& dataset, const LoaderOptions& options,
                         const sampler::DistributedSamplerOptions& distributed, int64_t max_batches = 32);

/// Weighted mixing of a dataset's sources (sampler::MixingOptions' weights and epoch_size;
/// docs/DATASETS.md, "Mixing several sources"): gpufeed.DataLoader's `weights` and `epoch_size`.
struct Mixing {
  /// Relative weight of each source (one per source, finite and > 0); empty: each source's size.
  std::vector<double> weights;
  /// Samples per epoch over all sources (>= 0); std::nullopt: the sources' total size.
  std::optional<int64_t> epoch_size;
  /// Either is set: the sampler mixes even a single dataset (epoch_size resamples it).
  bool given() const { return !weights.empty() || epoch_size.has_value(); }
};

/// This rank's sampler: options.shuffle_order resolved (resolve_shuffle_order); kExact is
/// sampler::ResumedDistributedSampler(dataset.size(), distributed), kShards is
/// sampler::ShardAwareSampler(dataset.shard_sizes(), distributed's num_replicas, rank, shuffle,
/// seed and drop_last, options.shard_window and shard_partitions). Both deal DistributedSampler's
/// total_size positions per epoch and resume alike (sampler/resume.h). When kExact was asked for
/// explicitly on remote data, logs one warning with the requests an epoch will make (one per
/// sample) against the shard count. Under kShards with shuffle, logs one warning when
/// class_mixing's shard-aware figure is below half the exact one (both figures, and the cures).
/// A datasets::MixedDataset, or `mixing` given, gets sampler::MixingSampler instead: the sources'
/// shard sizes (one shard per sample for a source without shards), mixing's weights and
/// epoch_size, the shard-aware fields as above, and exact_order for kExact; its epochs hold
/// epoch_size samples (DistributedSampler(epoch_size)'s size and total_size) where the others
/// hold dataset.size(). Throws what resolve_shuffle_order and the samplers throw
/// (std::invalid_argument naming `weights` or `epoch_size` for a refused value).
std::shared_ptr<sampler::ResumableSampler> make_rank_sampler(const datasets::Dataset& dataset,
                                                             const LoaderOptions& options,
                                                             const sampler::DistributedSamplerOptions& distributed,
                                                             std::string_view data_name, const Mixing& mixing = {});

/// Each source's samples per epoch (k_s, sampler::mixing_counts) when make_rank_sampler's sampler
/// mixes (a datasets::MixedDataset or mixing.given()), else std::nullopt. Cheap: no epoch list
/// is built. Throws what make_rank_sampler throws for the weights and epoch_size.
std::optional<std::vector<int64_t>> mixing_counts(const datasets::Dataset& dataset, const LoaderOptions& options,
                                                  const sampler::DistributedSamplerOptions& distributed,
                                                  const Mixing& mixing);

/// The samples one epoch of make_rank_sampler's sampler covers across all ranks, before
/// DistributedSampler's padding or drop_last: mixing's epoch_size when the sampler mixes
/// (a datasets::MixedDataset or mixing.given()) and it is set, else dataset.size().
int64_t epoch_samples(const datasets::Dataset& dataset, const Mixing& mixing);

}  // namespace gpufeed::loader
