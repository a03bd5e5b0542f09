#include "gpufeed/sampler/shard_order.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "piece_order.h"

namespace gpufeed::sampler {
namespace {

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

// sum(shard_sizes), after validate (a sampler's n, checked before its rank).
int64_t checked_total(const std::vector<int64_t>& shard_sizes, const ShardOrderOptions& o) {
  validate(shard_sizes, o);
  return total_samples(shard_sizes);
}

DistributedSamplerOptions distributed_options(const ShardOrderOptions& o) {
  return {o.num_replicas, o.rank, o.shuffle, o.seed, o.drop_last};
}

int64_t total_size_of(int64_t n, const DistributedSamplerOptions& run, int64_t num_replicas) {
  return DistributedSampler(n, {num_replicas, 0, run.shuffle, run.seed, run.drop_last})
      .total_size();
}

// Every shard as a unit, in the order a dataset lists them (empty ones included, so that the
// shard permutation is randperm(S, ...) over all S shards).
std::vector<detail::Piece> shards_as_units(const std::vector<int64_t>& shard_sizes) {
  std::vector<detail::Piece> units;
  int64_t offset = 0;
  for (const int64_t size : shard_sizes) {
    units.push_back({offset, offset + size});
    offset += size;
  }
  return units;
}

// Positions [0, n) of the epoch's list (shuffled or not), before padding.
std::vector<int64_t> unpadded(const std::vector<int64_t>& shard_sizes, const ShardOrderOptions& o,
                              int64_t epoch) {
  if (!o.shuffle) {
    std::vector<int64_t> list(static_cast<size_t>(total_samples(shard_sizes)));
    std::iota(list.begin(), list.end(), int64_t{0});
    return list;
  }
  const uint64_t epoch_seed = o.seed + static_cast<uint64_t>(epoch);
  return detail::windowed_order(shards_as_units(shard_sizes), effective_partitions(shard_sizes, o),
                                o.window, o.fixed_partitions ? o.seed : epoch_seed, epoch_seed);
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
  const int64_t n = checked_total(shard_sizes, options);
  const DistributedSamplerOptions run = distributed_options(options);
  return fit_to_total_size(unpadded(shard_sizes, options, epoch),
                           total_size_of(n, run, options.num_replicas));
}

std::vector<int64_t> shard_aware_lockstep_list(const std::vector<int64_t>& shard_sizes,
                                               const ShardOrderOptions& options, int64_t epoch) {
  const int64_t n = checked_total(shard_sizes, options);
  const DistributedSamplerOptions run = distributed_options(options);
  return detail::lockstep_runs(unpadded(shard_sizes, options, epoch),
                               total_size_of(n, run, options.num_replicas), options.num_replicas);
}

ContiguousRunSampler::ContiguousRunSampler(DistributedSamplerOptions run, int64_t n,
                                           std::string what, std::optional<EpochResume> resume)
    : run_(run), n_(n), what_(std::move(what)) {
  if (run_.num_replicas < 1) {
    throw std::invalid_argument(what_ + ": num_replicas must be >= 1, got " +
                                std::to_string(run_.num_replicas));
  }
  if (run_.rank < 0 || run_.rank >= run_.num_replicas) {
    throw std::invalid_argument(what_ + ": rank " + std::to_string(run_.rank) + " is not in [0, " +
                                std::to_string(run_.num_replicas) + ")");
  }
  set_resume(std::move(resume));
}

int64_t ContiguousRunSampler::total_size_for(int64_t num_replicas) const {
  return total_size_of(n_, run_, num_replicas);
}

void ContiguousRunSampler::set_resume(std::optional<EpochResume> resume) {
  if (resume) {
    if (resume->num_replicas < 1) {
      throw std::invalid_argument(what_ + ": the resumed epoch's num_replicas must be >= 1, got " +
                                  std::to_string(resume->num_replicas));
    }
    const int64_t total = total_size_for(resume->num_replicas);
    if (resume->consumed < 0 || resume->consumed > total) {
      throw std::invalid_argument(what_ + ": resume: " + std::to_string(resume->consumed) +
                                  " positions consumed of an epoch list of " +
                                  std::to_string(total));
    }
  }
  resume_ = std::move(resume);
}

bool ContiguousRunSampler::resuming() const {
  return resume_ && resume_->epoch == epoch_ && resume_->consumed > 0;
}

std::vector<int64_t> ContiguousRunSampler::lockstep_list(int64_t epoch,
                                                         int64_t num_replicas) const {
  return detail::lockstep_runs(unpadded_list(epoch), total_size_for(num_replicas), num_replicas);
}

std::vector<int64_t> ContiguousRunSampler::indices() const {
  const int64_t world = resuming() ? resume_->num_replicas : run_.num_replicas;
  return remaining_for_rank(lockstep_list(epoch_, world), resuming() ? resume_->consumed : 0,
                            run_.num_replicas, run_.rank);
}

int64_t ContiguousRunSampler::size() const {
  if (!resuming()) return total_size() / run_.num_replicas;
  return remaining_count(total_size_for(resume_->num_replicas), resume_->consumed,
                         run_.num_replicas, run_.rank);
}

ShardAwareSampler::ShardAwareSampler(std::vector<int64_t> shard_sizes, ShardOrderOptions options,
                                     std::optional<EpochResume> resume)
    : ContiguousRunSampler(distributed_options(options), checked_total(shard_sizes, options),
                           "shard-aware order", std::move(resume)),
      shard_sizes_(std::move(shard_sizes)),
      options_(options) {}

std::vector<int64_t> ShardAwareSampler::unpadded_list(int64_t epoch) const {
  return unpadded(shard_sizes_, options_, epoch);
}

}  // namespace gpufeed::sampler
