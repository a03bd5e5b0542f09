#pragma once
// Resuming an epoch on another number of ranks (docs/SCALING.md, "Resuming on another number of
// ranks").
//
// An epoch of DistributedSampler(num_replicas = W) is one global list of total_size positions
// (the dataset's permutation, padded by repeating its start, or truncated with the sampler's
// drop_last); rank r is given positions r, r + W, r + 2W, ... of it. A data-parallel run consumes
// in lockstep, so once every rank has consumed c samples the consumed positions are exactly
// [0, c * W) and the rest, [c * W, total_size), is what a resumed run still owes. Dealt to W'
// new ranks as DistributedSampler deals (new rank r' takes remaining[r'::W']) WITHOUT padding,
// every remaining position is delivered exactly once; the ranks' counts differ by at most one.
// The next epoch is plain DistributedSampler(num_replicas = W') order.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gpufeed/sampler/sampler.h"

namespace gpufeed::sampler {

/// Where one epoch's global list stands: positions [0, consumed) of DistributedSampler's list of
/// `epoch` for `num_replicas` ranks are consumed, the rest is dealt to the ranks that resume it.
struct EpochResume {
  int64_t epoch = 0;         ///< the epoch whose list this is
  int64_t num_replicas = 1;  ///< the world size whose DistributedSampler made the list (total_size)
  int64_t consumed = 0;      ///< positions consumed, in [0, total_size]
  friend bool operator==(const EpochResume&, const EpochResume&) = default;
};

/// DistributedSampler's global list of `epoch` over n samples: randperm(n) seeded seed + epoch
/// (or 0..n-1 without shuffle), padded by repeating its start to total_size, or truncated to
/// total_size with drop_last. Uses options.num_replicas, shuffle, seed and drop_last (not the
/// rank); size total_size = DistributedSampler(n, options).total_size(). Throws what
/// DistributedSampler's constructor throws.
std::vector<int64_t> distributed_epoch_list(int64_t n, const DistributedSamplerOptions& options,
                                            int64_t epoch);

/// DistributedSampler's padding rule applied to an epoch's `list` of n samples: longer than
/// total_size (drop_last) it is cut to total_size; shorter, it is padded by repeating its start,
/// wrapping as many times as needed (n < total_size - n). An empty list stays empty. Returns the
/// list of total_size positions (none when n = 0). Throws std::invalid_argument for total_size < 0.
std::vector<int64_t> fit_to_total_size(std::vector<int64_t> list, int64_t total_size);

/// Positions [consumed, list.size()) of `list`, dealt round-robin: rank takes
/// list[consumed + rank], list[consumed + rank + num_replicas], ... (no padding, so ranks' counts
/// differ by at most one; a rank may get none). With consumed = 0 and a DistributedSampler list
/// this is that rank's DistributedSampler order. Throws std::invalid_argument for num_replicas < 1,
/// a rank outside [0, num_replicas) or consumed outside [0, list.size()].
std::vector<int64_t> remaining_for_rank(const std::vector<int64_t>& list, int64_t consumed,
                                        int64_t num_replicas, int64_t rank);

/// How many positions remaining_for_rank gives `rank` of a list of total_size positions:
/// ceil((total_size - consumed - rank) / num_replicas), at least 0.
int64_t remaining_count(int64_t total_size, int64_t consumed, int64_t num_replicas, int64_t rank);

/// The positions of a list consumed across all ranks once `rank` (of `num_replicas`, dealt the
/// positions from `consumed` on as remaining_for_rank deals them) has received `batches_consumed`
/// batches of `batch_size` (BatchSampler with `drop_last`), assuming the ranks step in lockstep
/// (a rank that has run out waits, as torch.distributed.algorithms.Join does):
///   - every rank has received all its batches (batches_consumed equals the largest rank's batch
///     count, rank 0's): total_size, the epoch is over (tails that drop_last dropped included);
///   - otherwise consumed + min(batches_consumed * batch_size * num_replicas, total_size - consumed):
///     every rank has received min(batches_consumed * batch_size, its count) positions, which
///     together are that prefix of the remaining positions.
/// Throws std::invalid_argument for batch_size < 1, a bad rank/num_replicas/consumed,
/// batches_consumed outside [0, rank's batch count], and when `rank` has received all its batches
/// but another rank has one more (its share is one shorter): that rank's state cannot tell whether
/// the others received their last batch; take the state of rank 0, whose share is the longest.
int64_t consumed_after_batches(int64_t total_size, int64_t consumed, int64_t num_replicas,
                               int64_t rank, int64_t batches_consumed, int64_t batch_size,
                               bool drop_last);

/// A sampler whose epochs are one global list of DistributedSampler's total_size positions dealt
/// round-robin to the ranks, so that an epoch can be resumed on another world size as above:
/// ResumedDistributedSampler (DistributedSampler's list) and ShardAwareSampler (shard_order.h).
/// The fronts (gpufeed.DataLoader, the trainer) hold their sampler as this.
class ResumableSampler : public Sampler {
 public:
  /// The epoch to resume (std::nullopt: none). Throws std::invalid_argument for
  /// resume.num_replicas < 1 or consumed outside [0, that world size's total_size].
  virtual void set_resume(std::optional<EpochResume> resume) = 0;
  virtual const std::optional<EpochResume>& resume() const = 0;
  /// A copy (same options, epoch and resume), e.g. to read another epoch's indices.
  virtual std::unique_ptr<ResumableSampler> clone() const = 0;
};

/// DistributedSampler(n, options) (options.num_replicas = this run's world size), except in the
/// epoch of `resume` (set_resume): there, this rank's part of that epoch's remaining positions,
/// remaining_for_rank(distributed_epoch_list(n, {resume.num_replicas, ...}, epoch),
/// resume.consumed, options.num_replicas, options.rank) (shuffle, seed and drop_last from
/// options). A resume with consumed = 0 changes nothing: that epoch is DistributedSampler's own.
/// size() is the current epoch's count (set_epoch first, as the loader does).
class ResumedDistributedSampler : public ResumableSampler {
 public:
  /// Throws what DistributedSampler's constructor and set_resume throw.
  ResumedDistributedSampler(int64_t n, DistributedSamplerOptions options,
                            std::optional<EpochResume> resume = std::nullopt);
  /// The epoch to resume (std::nullopt: none, every epoch is DistributedSampler's). Throws
  /// std::invalid_argument for resume.num_replicas < 1 or consumed outside [0, total_size].
  void set_resume(std::optional<EpochResume> resume) override;
  const std::optional<EpochResume>& resume() const override { return resume_; }
  std::unique_ptr<ResumableSampler> clone() const override {
    return std::make_unique<ResumedDistributedSampler>(*this);
  }
  std::vector<int64_t> indices() const override;
  int64_t size() const override;
  const DistributedSamplerOptions& options() const { return plain_.options(); }

 private:
  bool resuming() const;  // the current epoch is resume_'s, with something consumed
  int64_t resumed_total_size() const;

  int64_t n_;
  DistributedSampler plain_;
  std::optional<EpochResume> resume_;
};

}  // namespace gpufeed::sampler
