// The front's sampler from `shuffle_order` (gpufeed/loader/rank_sampler.h).
#include "gpufeed/loader/rank_sampler.h"

#include <fmt/format.h>

#include "gpufeed/log.h"
#include "gpufeed/option.h"
#include "gpufeed/sampler/shard_order.h"

namespace gpufeed::loader {
namespace {

// DistributedSampler's order over remote data reads one sample per request, from every shard in
// turn: said once, at open, with the figures that make it costly. The URL is not printed (a
// presigned one carries its signature).
void warn_exact_on_remote(const datasets::Dataset& dataset, size_t shards) {
  gpufeed::log()->warn(
      "shuffle_order exact on remote data: an epoch makes about {} requests (one per sample) over {} shards; "
      "shuffle_order shards (the default for remote data) keeps each shard's samples together",
      dataset.size(), shards);
}

}  // namespace

std::string_view to_string(ShuffleOrder order) {
  switch (order) {
    case ShuffleOrder::kExact:
      return "exact";
    case ShuffleOrder::kShards:
      return "shards";
    case ShuffleOrder::kAuto:
      break;
  }
  return "auto";
}

ShuffleOrder parse_shuffle_order(std::string_view name) {
  if (name == "auto") return ShuffleOrder::kAuto;
  if (name == "exact") return ShuffleOrder::kExact;
  if (name == "shards") return ShuffleOrder::kShards;
  throw options::OptionError("shuffle_order", fmt::format("must be auto, exact or shards, not '{}'", name));
}

ShuffleOrder resolve_shuffle_order(const datasets::Dataset& dataset, ShuffleOrder requested,
                                   std::string_view data_name) {
  const bool has_shards = !dataset.shard_sizes().empty();
  if (requested == ShuffleOrder::kAuto)
    return dataset.remote() && has_shards ? ShuffleOrder::kShards : ShuffleOrder::kExact;
  if (requested == ShuffleOrder::kShards && !has_shards)
    throw options::OptionError(
        "shuffle_order", fmt::format("shards needs a dataset of shards (WebDataset .tar files, local or remote); "
                                     "{} is not one: use exact (or auto)",
                                     data_name));
  return requested;
}

std::shared_ptr<sampler::ResumableSampler> make_rank_sampler(const datasets::Dataset& dataset,
                                                             const LoaderOptions& options,
                                                             const sampler::DistributedSamplerOptions& distributed,
                                                             std::string_view data_name) {
  const ShuffleOrder order = resolve_shuffle_order(dataset, options.shuffle_order, data_name);
  if (order == ShuffleOrder::kExact) {
    if (options.shuffle_order == ShuffleOrder::kExact && dataset.remote())
      warn_exact_on_remote(dataset, dataset.shard_sizes().size());
    return std::make_shared<sampler::ResumedDistributedSampler>(dataset.size(), distributed);
  }
  sampler::ShardOrderOptions so;
  so.num_replicas = distributed.num_replicas;
  so.rank = distributed.rank;
  so.shuffle = distributed.shuffle;
  so.seed = distributed.seed;
  so.drop_last = distributed.drop_last;
  so.window = options.shard_window;
  so.partitions = options.shard_partitions;
  return std::make_shared<sampler::ShardAwareSampler>(dataset.shard_sizes(), so);
}

}  // namespace gpufeed::loader
