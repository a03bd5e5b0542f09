#include "gpufeed/sampler/mixing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpufeed/sampler/randperm.h"
#include "piece_order.h"

namespace gpufeed::sampler {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("mixing: " + message);
}

int64_t total_of(const SourceShards& shards) {
  return std::accumulate(shards.begin(), shards.end(), int64_t{0});
}

void validate_sources(const std::vector<SourceShards>& sources) {
  require(!sources.empty(), "no sources");
  for (size_t s = 0; s < sources.size(); ++s) {
    for (size_t j = 0; j < sources[s].size(); ++j) {
      require(sources[s][j] >= 0, "sources[" + std::to_string(s) + "] shard " + std::to_string(j) +
                                      " has " + std::to_string(sources[s][j]) + " samples");
    }
    require(total_of(sources[s]) > 0, "sources[" + std::to_string(s) + "] has no samples");
  }
}

void validate(const std::vector<SourceShards>& sources, const MixingOptions& o) {
  validate_sources(sources);
  require(o.weights.empty() || o.weights.size() == sources.size(),
          std::to_string(o.weights.size()) + " weights for " + std::to_string(sources.size()) +
              " sources");
  for (size_t s = 0; s < o.weights.size(); ++s) {
    require(std::isfinite(o.weights[s]) && o.weights[s] > 0,
            "weights[" + std::to_string(s) + "] is " + std::to_string(o.weights[s]) +
                ", must be finite and > 0");
  }
  require(!o.epoch_size || *o.epoch_size >= 0,
          "epoch_size must be >= 0, got " + std::to_string(o.epoch_size.value_or(0)));
  require(o.window >= 1, "window must be >= 1, got " + std::to_string(o.window));
  require(o.partitions >= 1, "partitions must be >= 1, got " + std::to_string(o.partitions));
  require(o.num_replicas >= 1, "num_replicas must be >= 1, got " + std::to_string(o.num_replicas));
}

int64_t epoch_size_of(const std::vector<SourceShards>& sources, const MixingOptions& o) {
  if (o.epoch_size) return *o.epoch_size;
  int64_t n = 0;
  for (const auto& shards : sources) n += total_of(shards);
  return n;
}

// A source's quota E * w_s / sum(w), split into its floor and its fractional part.
struct Quota {
  int64_t whole = 0;
  long double fraction = 0;
};

// Default weights (the sizes): exact in integers, so that k_s = n_s when E = sum(n_s).
std::vector<Quota> size_quotas(const std::vector<SourceShards>& sources, int64_t e) {
  std::vector<int64_t> sizes;
  for (const auto& shards : sources) sizes.push_back(total_of(shards));
  const auto n = static_cast<__int128>(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
  std::vector<Quota> out;
  for (const int64_t size : sizes) {
    const __int128 product = static_cast<__int128>(e) * size;
    out.push_back({static_cast<int64_t>(product / n),
                   static_cast<long double>(product % n) / static_cast<long double>(n)});
  }
  return out;
}

std::vector<Quota> weight_quotas(const std::vector<double>& weights, int64_t e) {
  long double sum = 0;
  for (const double w : weights) sum += w;
  std::vector<Quota> out;
  for (const double w : weights) {
    const long double quota = static_cast<long double>(e) * w / sum;
    const long double whole = std::floor(quota);
    out.push_back({static_cast<int64_t>(whole), quota - whole});
  }
  return out;
}

// Largest remainder: the floors, plus one for the sources with the largest fractional parts
// (ties: the lower index) until the counts add up to e. Rounding in weight_quotas can leave the
// floors one over e; then the smallest fractional parts give one back.
std::vector<int64_t> largest_remainder(const std::vector<Quota>& quotas, int64_t e) {
  std::vector<size_t> order(quotas.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return quotas[a].fraction > quotas[b].fraction; });
  std::vector<int64_t> k;
  int64_t sum = 0;
  for (const Quota& q : quotas) {
    k.push_back(q.whole);
    sum += q.whole;
  }
  for (size_t i = 0; sum < e; i = (i + 1) % order.size(), ++sum) ++k[order[i]];
  for (size_t i = order.size(); sum > e; --sum) {
    do i = (i + order.size() - 1) % order.size();
    while (k[order[i]] == 0);
    --k[order[i]];
  }
  return k;
}

std::vector<int64_t> counts_of(const std::vector<SourceShards>& sources, const MixingOptions& o) {
  const int64_t e = epoch_size_of(sources, o);
  return largest_remainder(
      o.weights.empty() ? size_quotas(sources, e) : weight_quotas(o.weights, e), e);
}

// Source s's pieces: q whole passes, then r samples as whole shards (the last one cut) taken in
// `order` (a permutation of its shards).
void append_source_pieces(const SourceShards& shards, int64_t s, int64_t k, int64_t first_sample,
                          int64_t first_shard, const std::vector<int64_t>& order,
                          std::vector<MixingPiece>& out) {
  std::vector<int64_t> starts(shards.size());
  std::exclusive_scan(shards.begin(), shards.end(), starts.begin(), first_sample);
  const int64_t n = total_of(shards);
  for (int64_t pass = 0; pass < k / n; ++pass) {
    for (size_t j = 0; j < shards.size(); ++j) {
      if (shards[j] > 0) {
        out.push_back({s, first_shard + static_cast<int64_t>(j), starts[j], shards[j]});
      }
    }
  }
  int64_t left = k % n;
  for (const int64_t j : order) {
    if (left == 0) break;
    const int64_t take = std::min(left, shards[static_cast<size_t>(j)]);
    if (take > 0) out.push_back({s, first_shard + j, starts[static_cast<size_t>(j)], take});
    left -= take;
  }
}

std::vector<MixingPiece> pieces_of(const std::vector<SourceShards>& sources, const MixingOptions& o,
                                   int64_t epoch) {
  const std::vector<int64_t> k = counts_of(sources, o);
  const std::vector<int64_t> samples = source_sample_offsets(sources);
  const std::vector<int64_t> shard_ids = source_shard_offsets(sources);
  const uint64_t epoch_seed = o.seed + static_cast<uint64_t>(epoch);
  std::vector<MixingPiece> out;
  for (size_t s = 0; s < sources.size(); ++s) {
    const auto count = static_cast<int64_t>(sources[s].size());
    std::vector<int64_t> order(static_cast<size_t>(count));
    std::iota(order.begin(), order.end(), int64_t{0});
    if (o.shuffle) order = randperm(count, detail::derive(epoch_seed, -2, static_cast<int64_t>(s)));
    append_source_pieces(sources[s], static_cast<int64_t>(s), k[s], samples[s], shard_ids[s], order,
                         out);
  }
  return out;
}

std::vector<int64_t> samples_in_order(const std::vector<MixingPiece>& pieces) {
  std::vector<int64_t> list;
  for (const MixingPiece& piece : pieces) {
    for (int64_t i = piece.first; i < piece.first + piece.count; ++i) list.push_back(i);
  }
  return list;
}

// Positions [0, E) of the epoch's list, before padding (step 3).
std::vector<int64_t> unpadded(const std::vector<SourceShards>& sources, const MixingOptions& o,
                              int64_t epoch) {
  const std::vector<MixingPiece> pieces = pieces_of(sources, o, epoch);
  const uint64_t epoch_seed = o.seed + static_cast<uint64_t>(epoch);
  if (!o.shuffle) return samples_in_order(pieces);
  if (o.exact_order) {
    const std::vector<int64_t> flat = samples_in_order(pieces);
    std::vector<int64_t> list;
    list.reserve(flat.size());
    for (const int64_t i : randperm(static_cast<int64_t>(flat.size()), epoch_seed)) {
      list.push_back(flat[static_cast<size_t>(i)]);
    }
    return list;
  }
  std::vector<detail::Piece> units;
  for (const MixingPiece& piece : pieces) units.push_back({piece.first, piece.first + piece.count});
  const int64_t parts =
      std::max<int64_t>(1, std::min<int64_t>(o.partitions, static_cast<int64_t>(units.size())));
  return detail::windowed_order(units, parts, o.window, epoch_seed, epoch_seed);
}

int64_t total_size_of(int64_t e, const MixingOptions& o) {
  return DistributedSampler(e, {o.num_replicas, 0, o.shuffle, o.seed, o.drop_last}).total_size();
}

int64_t checked_epoch_size(const std::vector<SourceShards>& sources, const MixingOptions& o) {
  validate(sources, o);
  return epoch_size_of(sources, o);
}

}  // namespace

SourceShards one_shard_per_sample(int64_t n) {
  require(n >= 0, "a source of " + std::to_string(n) + " samples");
  return SourceShards(static_cast<size_t>(n), 1);
}

std::vector<int64_t> source_sample_offsets(const std::vector<SourceShards>& sources) {
  std::vector<int64_t> out{0};
  for (size_t s = 0; s < sources.size(); ++s) {
    for (const int64_t size : sources[s]) {
      require(size >= 0, "sources[" + std::to_string(s) + "] has a shard of " +
                             std::to_string(size) + " samples");
    }
    out.push_back(out.back() + total_of(sources[s]));
  }
  return out;
}

std::vector<int64_t> source_shard_offsets(const std::vector<SourceShards>& sources) {
  std::vector<int64_t> out{0};
  for (const auto& shards : sources)
    out.push_back(out.back() + static_cast<int64_t>(shards.size()));
  return out;
}

std::vector<int64_t> mixing_counts(const std::vector<SourceShards>& sources,
                                   const MixingOptions& options) {
  validate(sources, options);
  return counts_of(sources, options);
}

std::vector<MixingPiece> mixing_epoch_pieces(const std::vector<SourceShards>& sources,
                                             const MixingOptions& options, int64_t epoch) {
  validate(sources, options);
  return pieces_of(sources, options, epoch);
}

std::vector<int64_t> mixing_epoch_list(const std::vector<SourceShards>& sources,
                                       const MixingOptions& options, int64_t epoch) {
  const int64_t e = checked_epoch_size(sources, options);
  return fit_to_total_size(unpadded(sources, options, epoch), total_size_of(e, options));
}

std::vector<int64_t> mixing_lockstep_list(const std::vector<SourceShards>& sources,
                                          const MixingOptions& options, int64_t epoch) {
  const int64_t e = checked_epoch_size(sources, options);
  return detail::lockstep_runs(unpadded(sources, options, epoch), total_size_of(e, options),
                               options.num_replicas);
}

MixingSampler::MixingSampler(std::vector<SourceShards> sources, MixingOptions options,
                             std::optional<EpochResume> resume)
    : ContiguousRunSampler(
          {options.num_replicas, options.rank, options.shuffle, options.seed, options.drop_last},
          checked_epoch_size(sources, options), "mixing", std::move(resume)),
      sources_(std::move(sources)),
      options_(std::move(options)),
      offsets_(source_sample_offsets(sources_)) {}

std::vector<int64_t> MixingSampler::unpadded_list(int64_t epoch) const {
  return unpadded(sources_, options_, epoch);
}

std::vector<int64_t> MixingSampler::per_source_counts(int64_t epoch) const {
  std::vector<int64_t> counts(sources_.size(), 0);
  for (const MixingPiece& piece : pieces_of(sources_, options_, epoch)) {
    counts[static_cast<size_t>(piece.source)] += piece.count;
  }
  return counts;
}

std::vector<int64_t> MixingSampler::rank_source_counts() const {
  std::vector<int64_t> counts(sources_.size(), 0);
  for (const int64_t i : indices()) ++counts[static_cast<size_t>(source_of(i))];
  return counts;
}

int64_t MixingSampler::source_of(int64_t index) const {
  if (index < 0 || index >= offsets_.back()) {
    throw std::out_of_range("mixing: sample index " + std::to_string(index) + " is not in [0, " +
                            std::to_string(offsets_.back()) + ")");
  }
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), index);
  return static_cast<int64_t>(it - offsets_.begin()) - 1;
}

}  // namespace gpufeed::sampler
