#pragma once
// Weighted mixing of several datasets (sources) into one epoch: each source contributes a fixed
// number of samples per epoch, set by its weight, read as whole shards where it is sampled down,
// then ordered by the shard-aware order's piece ordering (shard_order.h) or by one permutation
// (docs/DESIGN-NOTES.md, "sampler: weighted mixing").
//
// Index space: the sources concatenated as torch.utils.data.ConcatDataset numbers them: source s's
// samples are [offset_s, offset_s + n_s), offset_s = n_0 + ... + n_{s-1}, and within a source its
// shards follow each other in the order listed (shard j of source s holds the contiguous run after
// shard j - 1's). Global shard ids number the shards the same way (source_shard_offsets()).
//
// One epoch (seed, epoch), E = epoch_size (default: sum of n_s):
//   1. Counts. k_s = source s's samples in the epoch, by the largest remainder method: quota_s =
//      E * w_s / sum(w), k_s = floor(quota_s) plus one for the E - sum(floor) sources with the
//      largest fractional parts (ties: the lower source index). So sum(k_s) = E exactly and
//      |k_s - quota_s| < 1; the same every epoch (mixing_counts()).
//   2. Selection. k_s = q_s * n_s + r_s: q_s whole passes over the source (each of its non-empty
//      shards one piece per pass), then r_s samples as whole shards: the source's shards permuted
//      by randperm(S_s, derive(seed + epoch, -2, s)) and taken in that order until r_s is reached,
//      the last one cut to its first samples. A different subset every epoch, deterministic per
//      (seed, epoch). Shuffle off: the first shards in order instead (the same every epoch).
//      A piece is (source, shard, first sample, count); repeats are separate pieces.
//   3. Order (shuffle on). The pieces, as units, go through the shard-aware order's steps 1-3 with
//      the epoch seed: permuted, cut into P = min(partitions, non-empty pieces) partitions, each
//      partition's pieces taken `window` at a time, the samples of a window shuffled together.
//      With exact_order the pieces' samples (in step 2's order) are permuted by
//      randperm(E, seed + epoch) instead. Shuffle off: the pieces' samples in step 2's order,
//      which is source 0's k_0 samples, then source 1's, ... (0..n-1 with the default weights).
// The list L of E positions does not depend on num_replicas; MixingSampler deals it as
// ShardAwareSampler deals its list (ContiguousRunSampler: contiguous runs, DistributedSampler's
// padding or drop_last, resume on another world size through resume.h).
//
// Compared with MosaicML streaming (Stream(proportion=...), StreamingDataset(epoch_size=...),
// streaming/base/dataset.py): streaming also fixes each stream's count per epoch from the relative
// proportions (floor of E * proportion, the shortfall given one each to streams drawn at random
// with the run's seed) and expresses repeat/choose as absolute counts (here: weights equal to the
// counts and epoch_size their sum give exactly those counts). Its per-epoch resampling
// (_resample_streams, seeded seed + epoch) spreads a stream's count over ALL its shards
// (floor(count * shard / stream) per shard, the shortfall one each on random shards) and within a
// shard takes whole repeats plus a random subset of samples, so a stream sampled down to 10 % still
// touches every shard each epoch; here it reads about 10 % of its shards, whole (at most one cut).
// Then streaming shuffles the resampled space once (py1e by default, num_canonical_nodes
// partitions), as step 3 does with the shard-aware windows. litData's
// CombinedStreamingDataset(weights=...) draws the source of every sample at random by weight
// (random.Random(seed).choices), so per-epoch counts are only proportional in expectation, a source
// is never repeated within an epoch, and the epoch ends when the first source runs out (or, with
// iterate_over_all, drops it and renormalises); its state is each source's count yielded.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gpufeed/sampler/resume.h"
#include "gpufeed/sampler/shard_order.h"

namespace gpufeed::sampler {

/// A source's shard sizes (samples per shard, in its order); see one_shard_per_sample for a
/// source stored without shards.
using SourceShards = std::vector<int64_t>;

/// The shard sizes of a source of n samples stored without shards (an image folder): one shard
/// per sample, so that its subset is a random subset of samples. n >= 0; returns [n] ones.
SourceShards one_shard_per_sample(int64_t n);

/// Options of weighted mixing: the shard-aware order's fields (ShardOrderOptions' meanings, no
/// fixed_partitions) plus the weights, the epoch size and the exact order.
struct MixingOptions {
  int64_t num_replicas = 1;  ///< world_size; >= 1. Only the padding/truncation depends on it
  int64_t rank = 0;          ///< in [0, num_replicas); MixingSampler's, ignored by the list
  bool shuffle = true;       ///< off: the sources' selected samples in order (see above)
  uint64_t seed = 0;         ///< same on every rank
  bool drop_last = false;    ///< truncate to a multiple of num_replicas, else pad
  int64_t window = 8;        ///< pieces whose samples are shuffled together; >= 1
  int64_t partitions = 24;   ///< streaming's num_canonical_nodes; >= 1, capped at the pieces
  /// Relative weight of each source (one per source, each finite and > 0); empty: each source's
  /// size, which with the default epoch_size gives k_s = n_s (ConcatDataset's epoch).
  std::vector<double> weights;
  /// Samples per epoch, E (>= 0); std::nullopt: the sum of the sources' sizes.
  std::optional<int64_t> epoch_size;
  /// Order the epoch's samples by randperm(E, seed + epoch) (one permutation, as
  /// DistributedSampler's) instead of windows of pieces. Selection stays shard-granular.
  bool exact_order = false;
};

/// One selected run of a source's shard: samples [first, first + count) of the global index space,
/// all in global shard `shard` (of source `source`).
struct MixingPiece {
  int64_t source = 0;
  int64_t shard = 0;
  int64_t first = 0;
  int64_t count = 0;
  friend bool operator==(const MixingPiece&, const MixingPiece&) = default;
};

/// [S + 1] sample offsets: offset_s = n_0 + ... + n_{s-1}, the last the total. Throws
/// std::invalid_argument for a negative shard size.
std::vector<int64_t> source_sample_offsets(const std::vector<SourceShards>& sources);

/// [S + 1] global shard ids of each source's first shard (the last the total shard count).
std::vector<int64_t> source_shard_offsets(const std::vector<SourceShards>& sources);

/// k_s of every source (step 1); sums to the epoch size. Throws std::invalid_argument (naming the
/// option or source) for no sources, a negative shard size, a source without samples, weights
/// not one per source or not finite and > 0, epoch_size < 0, window < 1, partitions < 1,
/// num_replicas < 1.
std::vector<int64_t> mixing_counts(const std::vector<SourceShards>& sources,
                                   const MixingOptions& options);

/// The pieces of `epoch` (step 2), source by source, each source's whole passes then its subset.
/// Their counts add up to k_s per source. Throws what mixing_counts throws.
std::vector<MixingPiece> mixing_epoch_pieces(const std::vector<SourceShards>& sources,
                                             const MixingOptions& options, int64_t epoch);

/// The global list L of `epoch` (steps 1-3), padded as DistributedSampler pads (repeating its
/// start) or truncated (drop_last) to DistributedSampler(E, options).total_size(); positions
/// [0, E) do not depend on num_replicas. Throws what mixing_counts throws.
std::vector<int64_t> mixing_epoch_list(const std::vector<SourceShards>& sources,
                                       const MixingOptions& options, int64_t epoch);

/// The epoch as num_replicas ranks consume it in lockstep (shard_aware_lockstep_list's layout over
/// L): the list an EpochResume of MixingSampler counts positions of. Throws what mixing_counts
/// throws.
std::vector<int64_t> mixing_lockstep_list(const std::vector<SourceShards>& sources,
                                          const MixingOptions& options, int64_t epoch);

/// This rank's part of the mixed epoch: its contiguous run of mixing_epoch_list's L, padded or cut
/// as DistributedSampler, resumable on another world size (ContiguousRunSampler). Indices are in
/// the concatenated index space (source_sample_offsets).
class MixingSampler : public ContiguousRunSampler {
 public:
  /// Throws what mixing_counts throws, a rank outside [0, num_replicas), and what set_resume
  /// throws.
  MixingSampler(std::vector<SourceShards> sources, MixingOptions options,
                std::optional<EpochResume> resume = std::nullopt);
  std::unique_ptr<ResumableSampler> clone() const override {
    return std::make_unique<MixingSampler>(*this);
  }
  /// [S] samples of each source in `epoch`'s list L (before padding): k_s, the same every epoch.
  std::vector<int64_t> per_source_counts(int64_t epoch) const;
  /// [S] samples of each source among this rank's indices() of the current epoch (its padding and
  /// a resumed share included): what a rank's statistics report.
  std::vector<int64_t> rank_source_counts() const;
  /// The source of a global sample index; throws std::out_of_range outside [0, n).
  int64_t source_of(int64_t index) const;
  const MixingOptions& options() const { return options_; }
  const std::vector<SourceShards>& sources() const { return sources_; }

 protected:
  std::vector<int64_t> unpadded_list(int64_t epoch) const override;

 private:
  std::vector<SourceShards> sources_;
  MixingOptions options_;
  std::vector<int64_t> offsets_;  // source_sample_offsets(sources_)
};

}  // namespace gpufeed::sampler
