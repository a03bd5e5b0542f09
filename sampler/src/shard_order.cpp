#include "gpufeed/sampler/shard_order.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpufeed/sampler/randperm.h"

namespace gpufeed::sampler {
namespace {

// A contiguous run of one shard's samples, [begin, end) in global sample indices.
struct Piece {
  int64_t begin = 0;
  int64_t end = 0;
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Independent randperm seeds per (partition, window): randperm keeps only the low 32 bits, so the
// arguments are mixed into all of them. `window` = -1 names the partition's piece order.
uint64_t derive(uint64_t epoch_seed, int64_t partition, int64_t window) {
  uint64_t h = splitmix64(epoch_seed);
  h = splitmix64(h ^ static_cast<uint64_t>(partition));
  return splitmix64(h ^ static_cast<uint64_t>(window));
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("shard-aware order: " + message);
}

void validate(const std::vector<int64_t>& shard_sizes, const ShardOrderOptions& o) {
  for (size_t s = 0; s < shard_sizes.size(); ++s) {
    require(shard_sizes[s] >= 0, "shard_sizes[" + std::to_string(s) + "] is " +
                                     std::to_string(shard_sizes[s]) + ", must be >= 0");
  }
  require(o.window >= 1, "window must be >= 1, got " + std::to_string(o.window));
  require(o.partitions >= 1, "partitions must be >= 1, got " + std::to_string(o.partitions));
  require(o.num_replicas >= 1, "num_replicas must be >= 1, got " + std::to_string(o.num_replicas));
}

int64_t total_samples(const std::vector<int64_t>& shard_sizes) {
  return std::accumulate(shard_sizes.begin(), shard_sizes.end(), int64_t{0});
}

// floor(k * n / parts) without overflow for the sizes a dataset has (n < 2^40, parts < 2^20).
int64_t cut(int64_t n, int64_t k, int64_t parts) { return k * n / parts; }

int64_t total_size_of(int64_t n, const ShardOrderOptions& o, int64_t num_replicas) {
  return DistributedSampler(n, {num_replicas, 0, o.shuffle, o.seed, o.drop_last}).total_size();
}

// Step 1: the shards in permuted order, cut into `parts` runs, partition p holding positions
// [floor(p * n / parts), floor((p + 1) * n / parts)); a shard across a cut becomes one piece per
// side. These cuts are where shard_aware_lockstep_list cuts the ranks' runs when the world size divides
// `parts`, so no partition is shared by two ranks.
std::vector<std::vector<Piece>> cut_into_partitions(const std::vector<int64_t>& shard_sizes,
                                                    int64_t parts, uint64_t seed) {
  std::vector<int64_t> offsets(shard_sizes.size(), 0);
  std::exclusive_scan(shard_sizes.begin(), shard_sizes.end(), offsets.begin(), int64_t{0});
  const int64_t n = total_samples(shard_sizes);
  std::vector<std::vector<Piece>> out(static_cast<size_t>(parts));
  int64_t p = 0, placed = 0;
  for (const int64_t s : randperm(static_cast<int64_t>(shard_sizes.size()), seed)) {
    int64_t begin = offsets[static_cast<size_t>(s)];
    const int64_t end = begin + shard_sizes[static_cast<size_t>(s)];
    while (begin < end) {
      while (placed == cut(n, p + 1, parts)) ++p;
      const int64_t take = std::min(cut(n, p + 1, parts) - placed, end - begin);
      out[static_cast<size_t>(p)].push_back({begin, begin + take});
      begin += take;
      placed += take;
    }
  }
  return out;
}

// Step 2: one partition's stream, its pieces permuted, then each window's samples shuffled.
std::vector<int64_t> partition_stream(std::vector<Piece> pieces, int64_t window,
                                      uint64_t epoch_seed, int64_t p) {
  std::vector<int64_t> stream;
  const auto order = randperm(static_cast<int64_t>(pieces.size()), derive(epoch_seed, p, -1));
  for (size_t first = 0, w = 0; first < order.size(); first += static_cast<size_t>(window), ++w) {
    std::vector<int64_t> samples;
    for (size_t i = first; i < std::min(order.size(), first + static_cast<size_t>(window)); ++i) {
      const Piece& piece = pieces[static_cast<size_t>(order[i])];
      for (int64_t k = piece.begin; k < piece.end; ++k) samples.push_back(k);
    }
    const auto mix = randperm(static_cast<int64_t>(samples.size()),
                              derive(epoch_seed, p, static_cast<int64_t>(w)));
    for (const int64_t m : mix) stream.push_back(samples[static_cast<size_t>(m)]);
  }
  return stream;
}

std::vector<int64_t> shuffled_list(const std::vector<int64_t>& shard_sizes,
                                   const ShardOrderOptions& o, int64_t epoch) {
  const uint64_t epoch_seed = o.seed + static_cast<uint64_t>(epoch);
  const int64_t parts = effective_partitions(shard_sizes, o);
  const auto partitions =
      cut_into_partitions(shard_sizes, parts, o.fixed_partitions ? o.seed : epoch_seed);
  std::vector<std::vector<int64_t>> streams;
  for (int64_t p = 0; p < parts; ++p) {
    streams.push_back(
        partition_stream(partitions[static_cast<size_t>(p)], o.window, epoch_seed, p));
  }
  // Step 3: the streams one after the other.
  std::vector<int64_t> list;
  list.reserve(static_cast<size_t>(total_samples(shard_sizes)));
  for (const auto& stream : streams) list.insert(list.end(), stream.begin(), stream.end());
  return list;
}

// Positions [0, n) of the epoch's list (shuffled or not), before padding.
std::vector<int64_t> unpadded_list(const std::vector<int64_t>& shard_sizes,
                                   const ShardOrderOptions& options, int64_t epoch) {
  if (options.shuffle) return shuffled_list(shard_sizes, options, epoch);
  std::vector<int64_t> list(static_cast<size_t>(total_samples(shard_sizes)));
  std::iota(list.begin(), list.end(), int64_t{0});
  return list;
}

}  // namespace

int64_t effective_partitions(const std::vector<int64_t>& shard_sizes,
                             const ShardOrderOptions& options) {
  const auto nonempty =
      std::count_if(shard_sizes.begin(), shard_sizes.end(), [](int64_t size) { return size > 0; });
  return std::max<int64_t>(1, std::min<int64_t>(options.partitions, nonempty));
}

std::vector<int64_t> shard_of_samples(const std::vector<int64_t>& shard_sizes) {
  std::vector<int64_t> out;
  for (size_t s = 0; s < shard_sizes.size(); ++s) {
    require(shard_sizes[s] >= 0, "shard_sizes[" + std::to_string(s) + "] is " +
                                     std::to_string(shard_sizes[s]) + ", must be >= 0");
    out.insert(out.end(), static_cast<size_t>(shard_sizes[s]), static_cast<int64_t>(s));
  }
  return out;
}

std::vector<int64_t> shard_aware_epoch_list(const std::vector<int64_t>& shard_sizes,
                                            const ShardOrderOptions& options, int64_t epoch) {
  validate(shard_sizes, options);
  const int64_t n = total_samples(shard_sizes);
  return fit_to_total_size(unpadded_list(shard_sizes, options, epoch),
                           total_size_of(n, options, options.num_replicas));
}

std::vector<int64_t> shard_aware_lockstep_list(const std::vector<int64_t>& shard_sizes,
                                               const ShardOrderOptions& options, int64_t epoch) {
  validate(shard_sizes, options);
  const std::vector<int64_t> list = unpadded_list(shard_sizes, options, epoch);
  const int64_t n = static_cast<int64_t>(list.size()), world = options.num_replicas;
  const int64_t per_rank = total_size_of(n, options, world) / world;
  std::vector<int64_t> out(static_cast<size_t>(per_rank * world));
  for (int64_t r = 0; r < world; ++r) {
    // Rank r's run; padding repeats the run's own start, so it opens no shard of another rank.
    const int64_t begin = cut(n, r, world), size = cut(n, r + 1, world) - begin;
    for (int64_t j = 0; j < per_rank; ++j) {
      const int64_t k = size > 0 ? begin + j % size : j % n;
      out[static_cast<size_t>(j * world + r)] = list[static_cast<size_t>(k)];
    }
  }
  return out;
}

ShardAwareSampler::ShardAwareSampler(std::vector<int64_t> shard_sizes, ShardOrderOptions options,
                                     std::optional<EpochResume> resume)
    : shard_sizes_(std::move(shard_sizes)), options_(options) {
  validate(shard_sizes_, options_);
  require(options_.rank >= 0 && options_.rank < options_.num_replicas,
          "rank " + std::to_string(options_.rank) + " is not in [0, " +
              std::to_string(options_.num_replicas) + ")");
  n_ = total_samples(shard_sizes_);
  set_resume(resume);
}

int64_t ShardAwareSampler::total_size_for(int64_t num_replicas) const {
  return total_size_of(n_, options_, num_replicas);
}

void ShardAwareSampler::set_resume(std::optional<EpochResume> resume) {
  if (resume) {
    require(resume->num_replicas >= 1, "the resumed epoch's num_replicas must be >= 1, got " +
                                           std::to_string(resume->num_replicas));
    const int64_t total = total_size_for(resume->num_replicas);
    require(resume->consumed >= 0 && resume->consumed <= total,
            "resume: " + std::to_string(resume->consumed) +
                " positions consumed of an epoch list of " + std::to_string(total));
  }
  resume_ = std::move(resume);
}

bool ShardAwareSampler::resuming() const {
  return resume_ && resume_->epoch == epoch_ && resume_->consumed > 0;
}

std::vector<int64_t> ShardAwareSampler::indices() const {
  ShardOrderOptions o = options_;
  if (resuming()) o.num_replicas = resume_->num_replicas;
  return remaining_for_rank(shard_aware_lockstep_list(shard_sizes_, o, epoch_),
                            resuming() ? resume_->consumed : 0, options_.num_replicas,
                            options_.rank);
}

int64_t ShardAwareSampler::size() const {
  if (!resuming()) return total_size() / options_.num_replicas;
  return remaining_count(total_size_for(resume_->num_replicas), resume_->consumed,
                         options_.num_replicas, options_.rank);
}

}  // namespace gpufeed::sampler
