#pragma once
// A shuffled order made of whole shards, for datasets stored as shards (WebDataset tars, local or
// remote): the same global list for every world size, as DistributedSampler's is, so resume.h's
// elastic resume applies unchanged (docs/DESIGN-NOTES.md, "sampler: shard-aware order").
//
// DistributedSampler's order draws every sample from anywhere in the dataset: each rank touches
// every shard every epoch, one ranged read per sample. This order keeps the samples of a few shards
// together, so a reader can fetch shard by shard, and with world sizes that divide `partitions`
// each shard goes to one rank per epoch.
//
// The global list of an epoch (shuffle on), over n = sum(shard_sizes) samples; shard s holds the
// contiguous sample indices [offset_s, offset_s + shard_sizes[s]), offset_s = sum of the sizes
// before it (the order a dataset lists its shards' members):
//   1. Shards are permuted, randperm(S, seed + epoch) (torch.randperm's order, randperm.h), or
//      randperm(S, seed) with fixed_partitions. Their samples, in that order, are cut into P
//      consecutive ranges of n / P samples (the first n % P ranges one more): the partitions,
//      P = effective_partitions(). A shard that straddles a cut is split into pieces, each piece
//      its samples' contiguous run (P - 1 cuts: at most P - 1 shards are split). MosaicML
//      streaming's py1s/py1e/py1br cut shards into num_canonical_nodes equal parts the same way
//      (streaming/base/shuffle/py1s.py, divide_spans).
//   2. Within partition p, the pieces are permuted by randperm(pieces, derive(seed + epoch, p)) and
//      taken `window` pieces at a time; the samples of one window are shuffled together by
//      randperm(window's samples, derive(seed + epoch, p, w)) and the windows follow each other:
//      partition p's stream. derive() is splitmix64 chained over its arguments
//      (shard_order.cpp; randperm keeps the low 32 bits of a seed).
//   3. Global position k holds stream[k % P][k / P]: the streams interleaved round-robin. The cut
//      gives every partition n / P or n / P + 1 samples, the first n % P the longer ones, so this
//      fills positions [0, n) exactly and position k always comes from partition k % P.
//   4. Padding and truncation to total_size are DistributedSampler's (fit_to_total_size), the only
//      part that depends on num_replicas.
// Shuffle off: the list is 0, 1, ..., n - 1, DistributedSampler(shuffle = false)'s.
//
// Rank r of W takes positions r, r + W, ... (remaining_for_rank). When W divides P, those positions
// all come from partitions p with p % W == r: each shard is read by one rank per epoch (a shard
// split into k pieces by at most k), apart from the < W padding positions, which repeat the
// list's start. A rank's order interleaves its P / W partitions, so about window * P / W shards are
// open at once (a shard is open from its first to its last sample in that rank's order). The whole
// list mixes about window * P shards at a time: the quality of the shuffle and the memory a single
// rank would need to fetch whole shards grow together. Figures: docs/DESIGN-NOTES.md
// (tests/shuffle_quality.cpp).
//
// Compared with MosaicML streaming's py1e (its default): streaming also permutes shards, cuts them
// into num_canonical_nodes partitions and mixes samples locally, but its shard-to-partition
// assignment is fixed for the whole run (seeded by seed alone; here the fixed_partitions option),
// py1e spreads each shard's samples over a randomly placed range of about shuffle_block_size
// samples (py1br shuffles fixed blocks of about that many samples instead of windows of shards),
// and its partitions go to nodes as contiguous ranges of the sample list rather than by
// interleaved positions; it requires the number of physical nodes and num_canonical_nodes to
// divide one another (streaming/base/partition), where this order takes any world size and is
// shard-local when the world size divides `partitions`.
// litData's chunk shuffle deals permuted chunks to ranks by each rank's item budget (the
// assignment depends on the world size) and permutes samples within each chunk only (window 1).

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gpufeed/sampler/resume.h"
#include "gpufeed/sampler/sampler.h"

namespace gpufeed::sampler {

/// Options of the shard-aware order: DistributedSamplerOptions' fields and meanings, plus the
/// shard knobs.
struct ShardOrderOptions {
  int64_t num_replicas = 1;  ///< world_size; >= 1. Only the padding/truncation depends on it
  int64_t rank = 0;          ///< in [0, num_replicas); ShardAwareSampler's, ignored by the list
  bool shuffle = true;       ///< off: 0..n-1, DistributedSampler(shuffle = false)'s list
  uint64_t seed = 0;         ///< same on every rank
  bool drop_last =
      false;  ///< truncate to a multiple of num_replicas, else pad (DistributedSampler)
  /// Shard pieces whose samples are shuffled together, within a partition; >= 1. 1 keeps each
  /// shard's samples together (shuffled among themselves).
  int64_t window = 8;
  /// Partitions interleaved into the list (streaming's num_canonical_nodes); >= 1. Each shard goes
  /// to one rank when the world size divides it. Capped at the number of non-empty shards.
  int64_t partitions = 64;
  /// Deal shards to partitions by randperm(S, seed) every epoch, not randperm(S, seed + epoch):
  /// with a fixed world size dividing the partitions, a rank reads the same shards every epoch (a
  /// local cache of 1 / world_size of the dataset serves every epoch after the first), as streaming
  /// and litData (multi-node) do. The pieces' order and the windows still change every epoch.
  bool fixed_partitions = false;
};

/// P of the order: min(options.partitions, number of non-empty shards), at least 1.
int64_t effective_partitions(const std::vector<int64_t>& shard_sizes,
                             const ShardOrderOptions& options);

/// The global list of `epoch` (steps 1-4 above), before any rank takes its part: size total_size =
/// DistributedSampler(n, options).total_size(), with n = sum(shard_sizes); positions [0, n) hold
/// every sample index exactly once (padding repeats the list's start; drop_last truncates).
/// Deterministic in (shard_sizes, shuffle, seed, epoch, window, partitions, fixed_partitions); the
/// first n positions do not depend on num_replicas. Throws std::invalid_argument (naming the
/// option) for a negative shard size, window < 1, partitions < 1 or num_replicas < 1.
std::vector<int64_t> shard_aware_epoch_list(const std::vector<int64_t>& shard_sizes,
                                            const ShardOrderOptions& options, int64_t epoch);

/// The shard of every sample index: [n] values, shard_of_samples(sizes)[i] = s for i in
/// [offset_s, offset_s + sizes[s]). Throws std::invalid_argument for a negative shard size.
std::vector<int64_t> shard_of_samples(const std::vector<int64_t>& shard_sizes);

/// This rank's part of the shard-aware list: remaining_for_rank(shard_aware_epoch_list(...), 0,
/// num_replicas, rank), the counterpart of DistributedSampler (same size(), same total_size()).
/// In the epoch of an EpochResume (set_resume; resume.num_replicas is the world size that consumed
/// the first resume.consumed positions), this rank's part of that epoch's remaining positions, as
/// ResumedDistributedSampler deals them: the list of resume.num_replicas, from resume.consumed on,
/// dealt to this run's num_replicas ranks without padding. consumed_after_batches() turns a rank's
/// batch count into resume.consumed, as for DistributedSampler.
class ShardAwareSampler : public ResumableSampler {
 public:
  /// Throws std::invalid_argument for what shard_aware_epoch_list rejects, a rank outside
  /// [0, num_replicas), and what set_resume rejects.
  ShardAwareSampler(std::vector<int64_t> shard_sizes, ShardOrderOptions options,
                    std::optional<EpochResume> resume = std::nullopt);
  /// The epoch to resume (std::nullopt: none). Throws std::invalid_argument for
  /// resume.num_replicas < 1 or consumed outside [0, that world size's total_size].
  void set_resume(std::optional<EpochResume> resume) override;
  const std::optional<EpochResume>& resume() const override { return resume_; }
  std::unique_ptr<ResumableSampler> clone() const override { return std::make_unique<ShardAwareSampler>(*this); }
  std::vector<int64_t> indices() const override;
  /// The current epoch's count: num_samples as DistributedSampler's, or the resumed share.
  int64_t size() const override;
  /// num_samples * num_replicas for this run's world size (DistributedSampler's total_size).
  int64_t total_size() const { return total_size_for(options_.num_replicas); }
  const ShardOrderOptions& options() const { return options_; }
  const std::vector<int64_t>& shard_sizes() const { return shard_sizes_; }

 private:
  bool resuming() const;  // the current epoch is resume_'s, with something consumed
  int64_t total_size_for(int64_t num_replicas) const;

  std::vector<int64_t> shard_sizes_;
  ShardOrderOptions options_;
  int64_t n_ = 0;
  std::optional<EpochResume> resume_;
};

}  // namespace gpufeed::sampler
