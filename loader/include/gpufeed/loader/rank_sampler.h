#pragma once
// The sampler a front (gpufeed.DataLoader, the trainer) deals a rank's epochs with: the
// `shuffle_order` option resolved against the dataset (docs/DATASETS.md, "Shuffle order"; the
// choice of names and default: docs/DESIGN-NOTES.md, "loader: shuffle_order").

#include <memory>
#include <string_view>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/sampler/resume.h"

namespace gpufeed::loader {

/// The order `requested` means for `dataset` (never kAuto): kAuto is kShards for remote data
/// (Dataset::remote()) made of shards, kExact otherwise. Throws options::OptionError naming
/// `shuffle_order` and `data_name` for kShards on a dataset without shards (empty
/// Dataset::shard_sizes()).
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

/// This rank's sampler: options.shuffle_order resolved (resolve_shuffle_order); kExact is
/// sampler::ResumedDistributedSampler(dataset.size(), distributed), kShards is
/// sampler::ShardAwareSampler(dataset.shard_sizes(), distributed's num_replicas, rank, shuffle,
/// seed and drop_last, options.shard_window and shard_partitions). Both deal DistributedSampler's
/// total_size positions per epoch and resume alike (sampler/resume.h). When kExact was asked for
/// explicitly on remote data, logs one warning with the requests an epoch will make (one per
/// sample) against the shard count. Under kShards with shuffle, logs one warning when
/// class_mixing's shard-aware figure is below half the exact one (both figures, and the cures). Throws what resolve_shuffle_order and the samplers throw.
std::shared_ptr<sampler::ResumableSampler> make_rank_sampler(const datasets::Dataset& dataset,
                                                             const LoaderOptions& options,
                                                             const sampler::DistributedSamplerOptions& distributed,
                                                             std::string_view data_name);

}  // namespace gpufeed::loader
