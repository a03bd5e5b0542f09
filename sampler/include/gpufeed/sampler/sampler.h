#pragma once
// Index order for one epoch. Every sampler is a pure function of (its options, epoch): calling
// indices() twice gives the same list, so a resumed run can rebuild an epoch and skip into it.

#include <cstdint>
#include <memory>
#include <vector>

namespace gpufeed::sampler {

/// Base of the samplers: the indices of one epoch, in order.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// Selects the epoch whose order indices() returns (torch's `set_epoch`). Default epoch is 0.
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  /// The epoch set last.
  int64_t epoch() const { return epoch_; }
  /// The indices of the current epoch, each in [0, dataset_size).
  virtual std::vector<int64_t> indices() const = 0;
  /// Number of indices indices() returns (torch's `len(sampler)`).
  virtual int64_t size() const = 0;

 protected:
  int64_t epoch_ = 0;
};

/// 0, 1, ..., n-1 every epoch (torch.utils.data.SequentialSampler).
class SequentialSampler : public Sampler {
 public:
  /// n: dataset size (>= 0).
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

/// A fresh permutation of 0..n-1 each epoch: torch.randperm(n) with a generator seeded
/// `seed + epoch`, the same order DistributedSampler gives with one replica. (PyTorch's own
/// RandomSampler draws its seed from the global generator instead; ours is reproducible.)
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

/// Options of DistributedSampler, with torch.utils.data.DistributedSampler's defaults.
struct DistributedSamplerOptions {
  int64_t num_replicas = 1;  ///< world_size; >= 1
  int64_t rank = 0;          ///< in [0, num_replicas)
  bool shuffle = true;       ///< permute with a generator seeded seed + epoch
  uint64_t seed = 0;         ///< same on every rank
  bool drop_last = false;    ///< drop the tail to make the data evenly divisible, else pad
};

/// Python's torch.utils.data.DistributedSampler, index for index (not LibTorch's
/// DistributedRandomSampler, whose order differs): shuffle with a generator seeded
/// `seed + epoch`; without drop_last pad by repeating the list from its start (wrapping as many
/// times as needed when n < num_replicas); with drop_last cut to a multiple of num_replicas;
/// rank takes indices[rank : total_size : num_replicas]. Throws std::invalid_argument for a bad
/// rank or num_replicas.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, DistributedSamplerOptions options);
  std::vector<int64_t> indices() const override;
  /// num_samples: indices per rank, ceil(n / R), or ceil((n - R) / R) with drop_last when R ∤ n.
  int64_t size() const override { return num_samples_; }
  /// num_samples * num_replicas.
  int64_t total_size() const { return num_samples_ * options_.num_replicas; }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t n_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
};

/// Groups a sampler's indices into batches (torch.utils.data.BatchSampler): consecutive runs
/// of batch_size; the last, shorter batch is kept unless drop_last.
class BatchSampler {
 public:
  /// Throws std::invalid_argument if batch_size < 1 or sampler is null.
  BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last);
  /// Forwards to the sampler's set_epoch.
  void set_epoch(int64_t epoch) { sampler_->set_epoch(epoch); }
  int64_t epoch() const { return sampler_->epoch(); }
  /// The current epoch's batches, in order.
  std::vector<std::vector<int64_t>> batches() const;
  /// Number of batches per epoch (torch's len(batch_sampler)).
  int64_t size() const;
  int64_t batch_size() const { return batch_size_; }
  bool drop_last() const { return drop_last_; }
  Sampler& sampler() { return *sampler_; }

 private:
  std::shared_ptr<Sampler> sampler_;
  int64_t batch_size_;
  bool drop_last_;
};

/// Where an iteration stands, for mid-epoch resume: the epoch and how many of its batches the
/// consumer has already received. Saved in checkpoints; the loader restarts an epoch at
/// `batches_consumed` and yields exactly the batches an uninterrupted run would have.
/// On another number of ranks, gpufeed/sampler/resume.h turns one rank's state into the positions
/// all ranks consumed (consumed_after_batches) and deals the rest (ResumedDistributedSampler).
struct SamplerState {
  int64_t epoch = 0;
  int64_t batches_consumed = 0;
  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};

}  // namespace gpufeed::sampler
