#pragma once
// A shuffled order made of whole shards, for datasets stored as shards (WebDataset tars, local or
// remote): one global list per (seed, epoch) for every world size, each rank reading a contiguous
// run of it, so that a rank keeps about `window` shards open whatever the world size
// (docs/DESIGN-NOTES.md, "sampler: shard-aware order").
//
// DistributedSampler's order draws every sample from anywhere in the dataset: each rank touches
// every shard every epoch, one ranged read per sample. This order keeps the samples of a few shards
// together, so a reader can fetch shard by shard and hold only the shards of its current window
// (and the next one it reads ahead).
//
// The global list L of an epoch (shuffle on), over n = sum(shard_sizes) samples; shard s holds the
// contiguous sample indices [offset_s, offset_s + shard_sizes[s]), offset_s = sum of the sizes
// before it (the order a dataset lists its shards' members):
//   1. Shards are permuted, randperm(S, seed + epoch) (torch.randperm's order, randperm.h), or
//      randperm(S, seed) with fixed_partitions. Their samples, in that order, are cut into P
//      consecutive ranges, partition p holding [floor(p * n / P), floor((p + 1) * n / P)),
//      P = effective_partitions(). A shard that straddles a cut is split into pieces, each piece
//      its samples' contiguous run (P - 1 cuts: at most P - 1 shards are split). MosaicML
//      streaming's py1s/py1e/py1br cut shards into num_canonical_nodes parts the same way
//      (streaming/base/shuffle/py1s.py, divide_spans).
//   2. Within partition p, the pieces are permuted by randperm(pieces, derive(seed + epoch, p)) and
//      taken `window` pieces at a time; the samples of one window are shuffled together by
//      randperm(window's samples, derive(seed + epoch, p, w)) and the windows follow each other:
//      partition p's stream. derive() is splitmix64 chained over its arguments
//      (shard_order.cpp; randperm keeps the low 32 bits of a seed).
//   3. L is the streams one after the other (partition 0's, then 1's, ...).
// Shuffle off: L is 0, 1, ..., n - 1. L does not depend on num_replicas.
//
// Rank r of W reads L's run [floor(r * n / W), floor((r + 1) * n / W)) in L's order, padded to
// DistributedSampler's num_samples by repeating the run's own start (drop_last: cut to it). When W
// divides P the runs' cuts are partition cuts: each shard is read by one rank per epoch, apart from
// the at most P - 1 split ones (two adjacent ranks at most). Otherwise each of the W - 1 cuts falls
// inside one window, whose <= window shards two ranks read. A rank has one window's shards open
// at a time, whatever W: the default window (8) fits half of remote_shards_in_flight's default
// (16), leaving the other half to read the next window ahead.
//
// The ranks consume in lockstep, so the order in which the run consumes L is the rank runs
// interleaved: shard_aware_lockstep_list, the list ResumableSampler's resume deals (resume.h).
// Resuming on the same world size continues each rank's run; on another world size, the remaining
// positions of the old world's lockstep list are dealt round-robin (every sample once; that epoch
// is not shard-local), and the next epoch is the new world's. The global batches of a step
// (every rank's batch k) thus depend on W, unlike DistributedSampler's.
//
// Compared with MosaicML streaming's py1e (its default) and py1br: streaming also permutes shards,
// cuts them into num_canonical_nodes partitions and gives each node contiguous partitions, but a
// node consumes its partitions together (a single node opens shards of all num_canonical_nodes
// partitions at once, kept in its disk cache), so its global batches are the same for any node
// count dividing num_canonical_nodes; py1e spreads each shard's samples over a randomly placed
// range of about shuffle_block_size samples and py1br shuffles fixed blocks of that many, where
// this order shuffles windows of whole pieces. Here a rank reads its run one window at a time, so
// a reader that holds a window in memory suffices for any W, at the price of W-dependent global
// batches. litData's chunk shuffle deals permuted chunks to ranks by each rank's item budget (the
// assignment depends on the world size) and permutes samples within each chunk only (window 1).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
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
  /// Partitions the list is cut into (streaming's num_canonical_nodes); >= 1. Each shard goes to one
  /// rank when the world size divides it (24: world sizes 1, 2, 3, 4, 6, 8, 12, 24). Capped at the
  /// number of non-empty shards. A window never spans two partitions.
  int64_t partitions = 24;
  /// Deal shards to partitions by randperm(S, seed) every epoch, not randperm(S, seed + epoch):
  /// with a fixed world size dividing the partitions, a rank reads the same shards every epoch (a
  /// local cache of 1 / world_size of the dataset serves every epoch after the first), as streaming
  /// and litData (multi-node) do. The pieces' order and the windows still change every epoch.
  bool fixed_partitions = false;
};

/// P of the order: min(options.partitions, number of non-empty shards), at least 1.
int64_t effective_partitions(const std::vector<int64_t>& shard_sizes,
                             const ShardOrderOptions& options);

/// The global list L of `epoch` (steps 1-3 above) padded as DistributedSampler pads (repeating its
/// start) or truncated (drop_last): size total_size = DistributedSampler(n, options).total_size(),
/// with n = sum(shard_sizes); positions [0, n) hold every sample index exactly once and do not
/// depend on num_replicas. Deterministic in (shard_sizes, shuffle, seed, epoch, window, partitions,
/// fixed_partitions). Throws std::invalid_argument (naming the option) for a negative shard size,
/// window < 1, partitions < 1 or num_replicas < 1.
std::vector<int64_t> shard_aware_epoch_list(const std::vector<int64_t>& shard_sizes,
                                            const ShardOrderOptions& options, int64_t epoch);

/// The epoch as num_replicas ranks consume it in lockstep: total_size positions, position
/// j * num_replicas + r holding rank r's j-th sample (its run of L, padded or cut as above), so that
/// remaining_for_rank(list, 0, num_replicas, r) is rank r's run. This is the list an EpochResume
/// of this order counts positions of. Throws what shard_aware_epoch_list throws.
std::vector<int64_t> shard_aware_lockstep_list(const std::vector<int64_t>& shard_sizes,
                                               const ShardOrderOptions& options, int64_t epoch);

/// The shard of every sample index: [n] values, shard_of_samples(sizes)[i] = s for i in
/// [offset_s, offset_s + sizes[s]). Throws std::invalid_argument for a negative shard size.
std::vector<int64_t> shard_of_samples(const std::vector<int64_t>& shard_sizes);

/// The rank side of an order whose epoch is one list L of n positions (the same n every epoch,
/// independent of the world size): ShardAwareSampler's and MixingSampler's (mixing.h). Rank r of
/// num_replicas reads L's contiguous run [floor(r n / W), floor((r + 1) n / W)), padded to
/// DistributedSampler's num_samples by repeating the run's start (drop_last: cut to it), i.e.
/// remaining_for_rank(lockstep list, 0, num_replicas, rank) with the lockstep list of
/// shard_aware_lockstep_list. In the epoch of an EpochResume (set_resume; resume.num_replicas is
/// the world size that consumed the first resume.consumed positions), this rank's part of that
/// epoch's remaining positions, as ResumedDistributedSampler deals them: the lockstep list of
/// resume.num_replicas, from resume.consumed on, dealt round-robin to this run's num_replicas ranks
/// without padding (on the same world size, each rank's run continues). consumed_after_batches()
/// turns a rank's batch count into resume.consumed, as for DistributedSampler.
class ContiguousRunSampler : public ResumableSampler {
 public:
  /// The epoch to resume (std::nullopt: none). Throws std::invalid_argument for
  /// resume.num_replicas < 1 or consumed outside [0, that world size's total_size].
  void set_resume(std::optional<EpochResume> resume) override;
  const std::optional<EpochResume>& resume() const override { return resume_; }
  std::vector<int64_t> indices() const override;
  /// The current epoch's count: num_samples as DistributedSampler's, or the resumed share.
  int64_t size() const override;
  /// num_samples * num_replicas for this run's world size (DistributedSampler's total_size).
  int64_t total_size() const { return total_size_for(run_.num_replicas); }
  /// The epoch's lockstep list for `num_replicas` ranks (total_size positions for that world size).
  std::vector<int64_t> lockstep_list(int64_t epoch, int64_t num_replicas) const;

 protected:
  /// run: the deal's num_replicas, rank, shuffle, seed and drop_last; n: L's length; `what`
  /// begins the messages thrown. Throws std::invalid_argument for num_replicas < 1, a rank outside
  /// [0, num_replicas), and what set_resume throws.
  ContiguousRunSampler(DistributedSamplerOptions run, int64_t n, std::string what,
                       std::optional<EpochResume> resume);
  /// L of `epoch`: n positions, before padding.
  virtual std::vector<int64_t> unpadded_list(int64_t epoch) const = 0;

 private:
  bool resuming() const;  // the current epoch is resume_'s, with something consumed
  int64_t total_size_for(int64_t num_replicas) const;

  DistributedSamplerOptions run_;
  int64_t n_ = 0;
  std::string what_;
  std::optional<EpochResume> resume_;
};

/// This rank's part of the shard-aware list (ContiguousRunSampler over shard_aware_epoch_list's
/// L): remaining_for_rank(shard_aware_lockstep_list(...), 0, num_replicas, rank), its contiguous
/// run of L, with DistributedSampler's size() and total_size(); resumable as ContiguousRunSampler.
class ShardAwareSampler : public ContiguousRunSampler {
 public:
  /// Throws std::invalid_argument for what shard_aware_epoch_list rejects, a rank outside
  /// [0, num_replicas), and what set_resume rejects.
  ShardAwareSampler(std::vector<int64_t> shard_sizes, ShardOrderOptions options,
                    std::optional<EpochResume> resume = std::nullopt);
  std::unique_ptr<ResumableSampler> clone() const override {
    return std::make_unique<ShardAwareSampler>(*this);
  }
  const ShardOrderOptions& options() const { return options_; }
  const std::vector<int64_t>& shard_sizes() const { return shard_sizes_; }

 protected:
  std::vector<int64_t> unpadded_list(int64_t epoch) const override;

 private:
  std::vector<int64_t> shard_sizes_;
  ShardOrderOptions options_;
};

}  // namespace gpufeed::sampler
