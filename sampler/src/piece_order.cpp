#include "piece_order.h"

#include <algorithm>

#include "gpufeed/sampler/randperm.h"

namespace gpufeed::sampler::detail {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int64_t length(const Piece& piece) { return piece.end - piece.begin; }

// Step 1: the units in permuted order, cut into `parts` runs, partition p holding positions
// [floor(p * n / parts), floor((p + 1) * n / parts)); a unit across a cut becomes one piece per
// side. These cuts are where lockstep_runs cuts the ranks' runs when the world size divides
// `parts`, so no partition is shared by two ranks.
std::vector<std::vector<Piece>> cut_into_partitions(const std::vector<Piece>& units, int64_t parts,
                                                    uint64_t seed) {
  int64_t n = 0;
  for (const Piece& unit : units) n += length(unit);
  std::vector<std::vector<Piece>> out(static_cast<size_t>(parts));
  int64_t p = 0, placed = 0;
  for (const int64_t u : randperm(static_cast<int64_t>(units.size()), seed)) {
    int64_t begin = units[static_cast<size_t>(u)].begin;
    const int64_t end = units[static_cast<size_t>(u)].end;
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
void append_partition_stream(const std::vector<Piece>& pieces, int64_t window, uint64_t epoch_seed,
                             int64_t p, std::vector<int64_t>& stream) {
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
}

}  // namespace

uint64_t derive(uint64_t epoch_seed, int64_t partition, int64_t window) {
  uint64_t h = splitmix64(epoch_seed);
  h = splitmix64(h ^ static_cast<uint64_t>(partition));
  return splitmix64(h ^ static_cast<uint64_t>(window));
}

std::vector<int64_t> windowed_order(const std::vector<Piece>& units, int64_t parts, int64_t window,
                                    uint64_t unit_seed, uint64_t epoch_seed) {
  const auto partitions = cut_into_partitions(units, parts, unit_seed);
  // Step 3: the streams one after the other.
  std::vector<int64_t> list;
  for (int64_t p = 0; p < parts; ++p) {
    append_partition_stream(partitions[static_cast<size_t>(p)], window, epoch_seed, p, list);
  }
  return list;
}

std::vector<int64_t> lockstep_runs(const std::vector<int64_t>& list, int64_t total_size,
                                   int64_t world) {
  const auto n = static_cast<int64_t>(list.size());
  const int64_t per_rank = total_size / world;
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

}  // namespace gpufeed::sampler::detail
