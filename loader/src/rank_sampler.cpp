// The front's sampler from `shuffle_order` (gpufeed/loader/rank_sampler.h).
#include "gpufeed/loader/rank_sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpufeed/datasets/mixed.h"
#include "gpufeed/datasets/remote.h"
#include "gpufeed/log.h"
#include "gpufeed/option.h"
#include "gpufeed/sampler/mixing.h"
#include "gpufeed/sampler/shard_order.h"

namespace gpufeed::loader {
namespace {

// DistributedSampler's order over remote data reads one sample per request, from every shard in
// turn: said once, at open, with the figures that make it costly. The URL is not printed (a
// presigned one carries its signature).
void warn_exact_on_remote(int64_t samples, size_t shards) {
  gpufeed::log()->warn(
      "shuffle_order exact on remote data: an epoch makes about {} requests (one per sample) over {} shards; "
      "shuffle_order shards (the default for remote data) keeps each shard's samples together",
      samples, shards);
}

// The fields sampler::ShardOrderOptions and sampler::MixingOptions share (same names), from the
// loader's options and the rank's DistributedSampler options.
template <class O>
O order_options(const LoaderOptions& options, const sampler::DistributedSamplerOptions& distributed) {
  O so;
  so.num_replicas = distributed.num_replicas;
  so.rank = distributed.rank;
  so.shuffle = distributed.shuffle;
  so.seed = distributed.seed;
  so.drop_last = distributed.drop_last;
  so.window = options.shard_window;
  so.partitions = options.shard_partitions;
  return so;
}

// The mean count of distinct labels over the first `batches` full batches of `order`.
double labels_per_batch(const datasets::Dataset& dataset, const std::vector<int64_t>& order, int64_t batch_size,
                        int64_t batches) {
  int64_t distinct = 0;
  std::vector<int64_t> labels;
  for (int64_t b = 0; b < batches; ++b) {
    labels.clear();
    for (int64_t k = 0; k < batch_size; ++k) labels.push_back(dataset.at(order[static_cast<size_t>(b * batch_size + k)]).label);
    std::sort(labels.begin(), labels.end());
    distinct += std::unique(labels.begin(), labels.end()) - labels.begin();
  }
  return batches > 0 ? static_cast<double>(distinct) / static_cast<double>(batches) : 0.0;
}

// Shards that keep a class together defeat a window of a few shards: said once, at open, with
// the figures measured on this dataset's labels.
void warn_if_classes_unmixed(const datasets::Dataset& dataset, const LoaderOptions& options,
                             const sampler::DistributedSamplerOptions& distributed) {
  if (!distributed.shuffle) return;
  const ClassMixing m = class_mixing(dataset, options, distributed);
  if (m.batches == 0 || !(m.shards < 0.5 * m.exact)) return;
  gpufeed::log()->warn(
      "shuffle_order shards: a batch of {} holds {:.1f} classes on average where DistributedSampler's order "
      "holds {:.1f} (the first {} batches of this rank): the shards keep each class's samples together and the "
      "order mixes shard_window = {} shards at a time; write the shards shuffled (gpufeed pack --shuffle), raise "
      "shard_window, or use shuffle_order exact",
      options.batch_size, m.shards, m.exact, m.batches, options.shard_window);
}

// The datasets a sampler draws from: a MixedDataset's sources in its order, else the dataset itself.
std::vector<const datasets::Dataset*> sources_of(const datasets::Dataset& dataset) {
  std::vector<const datasets::Dataset*> out;
  if (const auto* mixed = dynamic_cast<const datasets::MixedDataset*>(&dataset)) {
    for (const auto& s : mixed->sources()) out.push_back(s.get());
  } else {
    out.push_back(&dataset);
  }
  return out;
}

// A window of shard_window shards needs more units (whole shards, or remote_chunk MiB chunks of
// larger ones) than the shard reader holds at once (remote_shards_in_flight): units are then
// dropped before their samples are read and fetched again. Said once, at open, per remote source.
void warn_if_window_outgrows_in_flight(const datasets::Dataset& dataset, const LoaderOptions& options) {
  for (const datasets::Dataset* source : sources_of(dataset)) {
    const auto* r = dynamic_cast<const datasets::RemoteShards*>(source);
    if (r == nullptr) continue;
    const datasets::DataOptions& d = r->options();
    const double units = static_cast<double>(options.shard_window) * r->mean_units_per_shard();
    if (d.remote_read == "samples" || units <= d.remote_shards_in_flight) continue;
    gpufeed::log()->warn(
        "shuffle_order shards: a window of {} shards is about {:.0f} units of remote reads ({:.1f} per shard, "
        "remote_chunk = {} MiB) where remote_shards_in_flight is {}: units will be dropped before their samples are "
        "read and fetched again (stats()['remote']['chunks_refetched']); raise remote_shards_in_flight to {:.0f} "
        "(twice that to read the next window ahead), or lower shard_window",
        options.shard_window, units, r->mean_units_per_shard(), d.remote_chunk, d.remote_shards_in_flight,
        std::ceil(units));
  }
}

// The sampler mixes: several sources, or weights / epoch_size given for one.
bool mixes(const datasets::Dataset& dataset, const Mixing& mixing) {
  return mixing.given() || dynamic_cast<const datasets::MixedDataset*>(&dataset) != nullptr;
}

// Each source's shard sizes, a source without shards one shard per sample.
std::vector<sampler::SourceShards> mixing_sources(const datasets::Dataset& dataset) {
  std::vector<sampler::SourceShards> shards;
  for (const datasets::Dataset* source : sources_of(dataset)) {
    shards.push_back(source->shard_sizes());
    if (shards.back().empty()) shards.back() = sampler::one_shard_per_sample(source->size());
  }
  return shards;
}

sampler::MixingOptions mixing_options(const LoaderOptions& options, const sampler::DistributedSamplerOptions& distributed,
                                      ShuffleOrder order, const Mixing& mixing) {
  auto mo = order_options<sampler::MixingOptions>(options, distributed);
  mo.weights = mixing.weights;
  mo.epoch_size = mixing.epoch_size;
  mo.exact_order = order == ShuffleOrder::kExact;
  return mo;
}

// The remote sources' samples per epoch (their k_s) and their shards: what one request per sample
// of shuffle_order exact costs.
std::pair<int64_t, size_t> remote_share(const datasets::Dataset& dataset, const std::vector<int64_t>& counts) {
  const std::vector<const datasets::Dataset*> sources = sources_of(dataset);
  int64_t samples = 0;
  size_t shards = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    if (!sources[s]->remote()) continue;
    samples += counts[s];
    shards += sources[s]->shard_sizes().size();
  }
  return {samples, shards};
}

}  // namespace

ClassMixing class_mixing(const datasets::Dataset& dataset, const LoaderOptions& options,
                         const sampler::DistributedSamplerOptions& distributed, int64_t max_batches) {
  sampler::ShardAwareSampler shards(dataset.shard_sizes(), order_options<sampler::ShardOrderOptions>(options, distributed));
  sampler::DistributedSampler exact(dataset.size(), distributed);
  shards.set_epoch(0);
  exact.set_epoch(0);
  const std::vector<int64_t> a = shards.indices(), b = exact.indices();
  const int64_t batch = std::max<int64_t>(options.batch_size, 1);
  ClassMixing m;
  m.batches = std::min<int64_t>(max_batches, static_cast<int64_t>(std::min(a.size(), b.size())) / batch);
  m.shards = labels_per_batch(dataset, a, batch, m.batches);
  m.exact = labels_per_batch(dataset, b, batch, m.batches);
  return m;
}

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
  if (dynamic_cast<const datasets::MixedDataset*>(&dataset) != nullptr) {
    if (requested != ShuffleOrder::kAuto) return requested;
    return dataset.remote() ? ShuffleOrder::kShards : ShuffleOrder::kExact;
  }
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
                                                             std::string_view data_name, const Mixing& mixing) {
  const ShuffleOrder order = resolve_shuffle_order(dataset, options.shuffle_order, data_name);
  if (order == ShuffleOrder::kShards) warn_if_window_outgrows_in_flight(dataset, options);
  if (mixes(dataset, mixing)) {
    std::vector<sampler::SourceShards> sources = mixing_sources(dataset);
    sampler::MixingOptions mo = mixing_options(options, distributed, order, mixing);
    if (options.shuffle_order == ShuffleOrder::kExact && dataset.remote()) {
      const auto [samples, shards] = remote_share(dataset, sampler::mixing_counts(sources, mo));
      warn_exact_on_remote(samples, shards);
    }
    return std::make_shared<sampler::MixingSampler>(std::move(sources), std::move(mo));
  }
  if (order == ShuffleOrder::kExact) {
    if (options.shuffle_order == ShuffleOrder::kExact && dataset.remote())
      warn_exact_on_remote(dataset.size(), dataset.shard_sizes().size());
    return std::make_shared<sampler::ResumedDistributedSampler>(dataset.size(), distributed);
  }
  warn_if_classes_unmixed(dataset, options, distributed);
  return std::make_shared<sampler::ShardAwareSampler>(dataset.shard_sizes(), order_options<sampler::ShardOrderOptions>(options, distributed));
}

int64_t epoch_samples(const datasets::Dataset& dataset, const Mixing& mixing) {
  return mixes(dataset, mixing) && mixing.epoch_size ? *mixing.epoch_size : dataset.size();
}

std::optional<std::vector<int64_t>> mixing_counts(const datasets::Dataset& dataset, const LoaderOptions& options,
                                                  const sampler::DistributedSamplerOptions& distributed,
                                                  const Mixing& mixing) {
  if (!mixes(dataset, mixing)) return std::nullopt;
  const ShuffleOrder order = resolve_shuffle_order(dataset, options.shuffle_order, "");
  return sampler::mixing_counts(mixing_sources(dataset), mixing_options(options, distributed, order, mixing));
}

}  // namespace gpufeed::loader
