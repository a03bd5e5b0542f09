#pragma once
// The repeated-augmentation sampler of torchvision's classification references.

#include <cstdint>
#include <vector>

#include "gpufeed/sampler/sampler.h"

namespace gpufeed::sampler {

/// Options of RASampler, with the torchvision references' defaults.
struct RASamplerOptions {
  int64_t num_replicas = 1;  ///< world_size; >= 1
  int64_t rank = 0;          ///< in [0, num_replicas)
  bool shuffle = true;       ///< permute with a generator seeded seed + epoch
  uint64_t seed = 0;         ///< same on every rank
  int64_t repetitions = 3;   ///< ra_reps: copies of each index per epoch, over all ranks; >= 1
  /// Each rank keeps floor(n // multiple * multiple / num_replicas) indices per epoch: the
  /// references' constant 256 (so an epoch is about n samples, covering about n / repetitions
  /// distinct images). Datasets smaller than it give empty epochs, as in the references.
  int64_t selection_multiple = 256;
};

/// The repeated-augmentation sampler of torchvision's classification references
/// (references/classification/sampler.py, RASampler, after Hoffer et al. 2020, "Augment your
/// batch"), index for index: DistributedSampler's permutation (torch.randperm seeded
/// seed + epoch, or 0..n-1 without shuffle); each index repeated `repetitions` times in a row;
/// padded from its start to total_size = ceil(n * repetitions / num_replicas) * num_replicas;
/// rank takes list[rank : total_size : num_replicas] and keeps its first
/// floor(n // selection_multiple * selection_multiple / num_replicas). The copies of one image
/// thus go to consecutive ranks: different augmentations of it in the same global batch.
/// Throws std::invalid_argument for a bad rank, num_replicas, repetitions or selection_multiple,
/// and when the padding would need more indices than the list has (the references' assertion).
class RASampler : public Sampler {
 public:
  RASampler(int64_t n, RASamplerOptions options);
  std::vector<int64_t> indices() const override;
  /// num_selected_samples: floor(n // selection_multiple * selection_multiple / num_replicas).
  int64_t size() const override { return num_selected_; }
  const RASamplerOptions& options() const { return options_; }

 private:
  int64_t n_;
  RASamplerOptions options_;
  int64_t total_size_;
  int64_t num_selected_;
};

}  // namespace gpufeed::sampler
