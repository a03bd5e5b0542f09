// Measures the shard-aware order (gpufeed/sampler/shard_order.h) against DistributedSampler's exact
// order; prints the Markdown tables of docs/DESIGN-NOTES.md, "sampler: shard-aware order". Not a
// test: nothing is asserted, the figures are what they are.
//
//   shuffle_quality            both tables
//
// Quality: 1000 classes x 1300 samples in shards of 1000, batches of 256, written in class order
// (as `gpufeed pack` writes an ImageFolder) and shuffled (`gpufeed pack --shuffle`: sample i is
// the source's randperm(n, 0)[i]). Locality: ImageNet's
// 1,281,167 samples in shards of 1000, and 6 shards of 150, over world sizes 1 to 8, with the
// default window and partitions.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpufeed/sampler/randperm.h"
#include "gpufeed/sampler/resume.h"
#include "gpufeed/sampler/sampler.h"
#include "gpufeed/sampler/shard_order.h"

using namespace gpufeed::sampler;

namespace {

using Indices = std::vector<int64_t>;
constexpr uint64_t kSeed = 0;
constexpr int64_t kBatch = 256;

Indices equal_shards(int64_t n, int64_t shard) {
  Indices sizes(static_cast<size_t>(n / shard), shard);
  if (n % shard) sizes.push_back(n % shard);
  return sizes;
}

struct Quality {
  double classes = 0;  // mean distinct classes per batch
  double entropy = 0;  // mean label entropy per batch, bits
};

// labels_of[i]: sample i's class.
Quality quality_of(const Indices& order, const Indices& labels_of) {
  Quality q;
  const int64_t top = labels_of.empty() ? 0 : *std::max_element(labels_of.begin(), labels_of.end());
  std::vector<int64_t> count(static_cast<size_t>(top + 1), 0);
  int64_t batches = 0;
  for (size_t start = 0; start + kBatch <= order.size(); start += kBatch, ++batches) {
    std::vector<int64_t> batch;
    for (size_t i = start; i < start + kBatch; ++i) batch.push_back(labels_of[static_cast<size_t>(order[i])]);
    for (const int64_t l : batch) ++count[static_cast<size_t>(l)];
    for (const int64_t l : batch) {
      if (count[static_cast<size_t>(l)] == 0) continue;
      const double p = static_cast<double>(count[static_cast<size_t>(l)]) / kBatch;
      q.entropy -= p * std::log2(p);
      q.classes += 1;
      count[static_cast<size_t>(l)] = 0;
    }
  }
  q.classes /= static_cast<double>(batches);
  q.entropy /= static_cast<double>(batches);
  return q;
}

Indices rank_part(const Indices& list, int64_t world, int64_t rank) {
  return remaining_for_rank(list, 0, world, rank);
}

void print_quality() {
  const int64_t classes = 1000, per_class = 1300, n = classes * per_class;
  const Indices sizes = equal_shards(n, 1000);
  std::printf(
      "Quality: %lld classes x %lld samples, %zu shards of 1000, batches of %lld; shards written in class "
      "order, or shuffled (gpufeed pack --shuffle)\n\n",
      static_cast<long long>(classes), static_cast<long long>(per_class), sizes.size(),
      static_cast<long long>(kBatch));
  std::printf(
      "| order | classes / batch | entropy (bits) | vs exact | classes / rank batch, 8 ranks |\n");
  std::printf("|---|---|---|---|---|\n");
  Indices in_order(static_cast<size_t>(n)), shuffled = randperm(n, 0);
  for (int64_t i = 0; i < n; ++i) in_order[static_cast<size_t>(i)] = i / per_class;
  for (int64_t& l : shuffled) l /= per_class;
  // list: one rank's order; list8: the lockstep list of 8 ranks (rank 0's part is its order).
  auto row = [&](const std::string& name, const Indices& list, const Indices& list8, double exact_entropy,
                 const Indices& labels) {
    const Quality q = quality_of(list, labels);
    const Quality r = quality_of(rank_part(list8, 8, 0), labels);
    std::printf("| %s | %.1f | %.2f | %.3f | %.1f |\n", name.c_str(), q.classes, q.entropy,
                exact_entropy > 0 ? q.entropy / exact_entropy : 1.0, r.classes);
    return q.entropy;
  };
  const double exact = row("DistributedSampler (exact)",
                           distributed_epoch_list(n, {1, 0, true, kSeed, false}, 0),
                           distributed_epoch_list(n, {8, 0, true, kSeed, false}, 0), 0, in_order);
  for (const bool shuffled_shards : {false, true}) {
    for (const int64_t window : {1, 4, 8, 16, 64}) {
      if (shuffled_shards && window != 1 && window != 8) continue;
      ShardOrderOptions o;
      o.seed = kSeed;
      o.window = window;
      const Indices one = shard_aware_lockstep_list(sizes, o, 0);
      o.num_replicas = 8;
      row(std::string(shuffled_shards ? "shuffled shards" : "class-ordered shards") + ", shard-aware, partitions " +
              std::to_string(o.partitions) + ", window " + std::to_string(window),
          one, shard_aware_lockstep_list(sizes, o, 0), exact, shuffled_shards ? shuffled : in_order);
    }
  }
}

struct Locality {
  int64_t most_shards = 0;  // distinct shards one rank touches, the largest rank
  int64_t most_open = 0;    // shards open at once in one rank's order, the largest rank
  int64_t reads = 0;        // sum over ranks of the distinct shards each touches
};

// A shard is open from its first to its last sample in the rank's order.
int64_t max_open(const Indices& mine, const Indices& shard_of, size_t shards) {
  std::vector<int64_t> first(shards, -1), last(shards, -1);
  for (size_t k = 0; k < mine.size(); ++k) {
    const auto s = static_cast<size_t>(shard_of[static_cast<size_t>(mine[k])]);
    if (first[s] < 0) first[s] = static_cast<int64_t>(k);
    last[s] = static_cast<int64_t>(k);
  }
  std::vector<int64_t> delta(mine.size() + 1, 0);
  for (size_t s = 0; s < shards; ++s) {
    if (first[s] < 0) continue;
    ++delta[static_cast<size_t>(first[s])];
    --delta[static_cast<size_t>(last[s]) + 1];
  }
  int64_t open = 0, most = 0;
  for (const int64_t d : delta) most = std::max(most, open += d);
  return most;
}

Locality locality_of(const Indices& list, const Indices& sizes, int64_t world) {
  const Indices shard_of = shard_of_samples(sizes);
  Locality l;
  for (int64_t r = 0; r < world; ++r) {
    const Indices mine = rank_part(list, world, r);
    std::vector<bool> seen(sizes.size(), false);
    int64_t distinct = 0;
    for (const int64_t i : mine) {
      const auto s = static_cast<size_t>(shard_of[static_cast<size_t>(i)]);
      if (!seen[s]) ++distinct;
      seen[s] = true;
    }
    l.most_shards = std::max(l.most_shards, distinct);
    l.most_open = std::max(l.most_open, max_open(mine, shard_of, sizes.size()));
    l.reads += distinct;
  }
  return l;
}

void print_locality(const std::string& name, const Indices& sizes) {
  int64_t n = 0;
  for (const int64_t s : sizes) n += s;
  std::printf(
      "\nLocality: %s (%lld samples, %zu shards), window %lld, partitions %lld (capped at the "
      "shards)\n\n",
      name.c_str(), static_cast<long long>(n), sizes.size(), static_cast<long long>(ShardOrderOptions{}.window),
      static_cast<long long>(ShardOrderOptions{}.partitions));
  std::printf(
      "| world | order | shards / rank (max) | open at once / rank (max) | shard reads / shards "
      "|\n");
  std::printf("|---|---|---|---|---|\n");
  for (const int64_t world : {1, 2, 3, 4, 5, 6, 7, 8}) {
    ShardOrderOptions o;
    o.seed = kSeed;
    o.num_replicas = world;
    const Locality exact =
        locality_of(distributed_epoch_list(n, {world, 0, true, kSeed, false}, 0), sizes, world);
    const Locality aware = locality_of(shard_aware_lockstep_list(sizes, o, 0), sizes, world);
    for (const auto& [label, l] : {std::pair{"exact", exact}, std::pair{"shard-aware", aware}}) {
      std::printf("| %lld | %s | %lld | %lld | %.2f |\n", static_cast<long long>(world), label,
                  static_cast<long long>(l.most_shards), static_cast<long long>(l.most_open),
                  static_cast<double>(l.reads) / static_cast<double>(sizes.size()));
    }
  }
}

}  // namespace

int main() {
  print_quality();
  print_locality("ImageNet train", equal_shards(1281167, 1000));
  print_locality("small", Indices(6, 150));
  return 0;
}
