#pragma once
// The piece ordering shared by the shard-aware order (shard_order.cpp) and weighted mixing
// (mixing.cpp): units (shards, or a mixing epoch's selected pieces) permuted and cut into
// partitions, each partition's pieces permuted and taken `window` at a time, the samples of a
// window shuffled together (shard_order.h, steps 1-3). Private to the sampler room.

#include <cstdint>
#include <vector>

namespace gpufeed::sampler::detail {

/// A contiguous run of sample indices, [begin, end) (empty when begin == end).
struct Piece {
  int64_t begin = 0;
  int64_t end = 0;
};

/// splitmix64 chained over (epoch_seed, partition, window): independent randperm seeds (randperm
/// keeps the low 32 bits, so the arguments are mixed into all of them). window -1 names partition
/// `partition`'s piece order; mixing uses partition -2 for its per-source shard subsets.
uint64_t derive(uint64_t epoch_seed, int64_t partition, int64_t window);

/// floor(k * n / parts), for the sizes a dataset has (n < 2^40, parts < 2^20).
inline int64_t cut(int64_t n, int64_t k, int64_t parts) { return k * n / parts; }

/// Steps 1-3 of shard_order.h over `units`: the units permuted by randperm(units.size(),
/// unit_seed), their samples cut into `parts` runs (a unit across a cut becomes one piece per
/// side), partition p's pieces permuted by randperm(pieces, derive(epoch_seed, p, -1)) and taken
/// `window` at a time, each window's samples shuffled by randperm(samples, derive(epoch_seed, p,
/// w)); the partitions' streams one after the other. Returns sum of the units' lengths indices.
/// parts >= 1, window >= 1 (the callers validate).
std::vector<int64_t> windowed_order(const std::vector<Piece>& units, int64_t parts, int64_t window,
                                    uint64_t unit_seed, uint64_t epoch_seed);

/// `list` (an epoch's n positions) as `world` ranks consume it in lockstep: rank r's contiguous
/// run [floor(r n / world), floor((r + 1) n / world)), padded by repeating the run's own start to
/// total_size / world positions (or cut to them), interleaved so that position j * world + r holds
/// rank r's j-th. total_size: DistributedSampler's for n and world.
std::vector<int64_t> lockstep_runs(const std::vector<int64_t>& list, int64_t total_size,
                                   int64_t world);

}  // namespace gpufeed::sampler::detail
