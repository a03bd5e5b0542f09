// Weighted mixing of sources (gpufeed/sampler/mixing.h): each source's count per epoch exact by
// the largest remainder, whole passes then a subset of whole shards, a new subset every epoch,
// one global list for every world size, elastic resume through resume.h, one window of pieces open
// per rank, the exact order as one permutation, and shuffle off as the sources in order.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpufeed/sampler/mixing.h"
#include "gpufeed/sampler/randperm.h"
#include "gpufeed/sampler/resume.h"
#include "sampler_checks.h"

using namespace gpufeed::sampler;

namespace {

using Indices = std::vector<int64_t>;
using Sources = std::vector<SourceShards>;

Indices sorted(Indices v) {
  std::sort(v.begin(), v.end());
  return v;
}

Indices head(const Indices& v, int64_t n) { return Indices(v.begin(), v.begin() + n); }

// A: 30 shards of 10; B: uneven shards with an empty one (100); C: 40 samples without shards.
const Sources kSources = {SourceShards(30, 10), {50, 20, 0, 30}, one_shard_per_sample(40)};

// Weights 1 : 2 : 5 over 500 samples: quotas 62.5, 125, 312.5; floors 62 + 125 + 312 = 499, the
// one left goes to the largest fractional part, A's and C's tie at .5, the lower index wins.
MixingOptions weighted(int64_t world = 1, bool drop_last = false) {
  MixingOptions o;
  o.num_replicas = world;
  o.seed = 31;
  o.window = 4;
  o.partitions = 6;
  o.weights = {1, 2, 5};
  o.epoch_size = 500;
  o.drop_last = drop_last;
  return o;
}
const Indices kWeightedCounts = {63, 125, 312};

Indices counts_by_source(const Indices& list, const MixingSampler& s) {
  Indices counts(s.sources().size(), 0);
  for (const int64_t i : list) ++counts[static_cast<size_t>(s.source_of(i))];
  return counts;
}

Indices rank_part(const Sources& sources, MixingOptions o, int64_t rank, int64_t epoch) {
  o.rank = rank;
  MixingSampler s(sources, o);
  s.set_epoch(epoch);
  return s.indices();
}

// How often each sample index occurs in `list`.
std::map<int64_t, int64_t> occurrences(const Indices& list) {
  std::map<int64_t, int64_t> times;
  for (const int64_t i : list) ++times[i];
  return times;
}

// The most shard copies open at once in `run`: a copy (shard, j) is open from the first to the last
// of its samples' j-th occurrences (a repeated shard's copies are told apart by occurrence order).
int64_t most_open(const Indices& run, const Indices& shard_of) {
  std::map<int64_t, int64_t> seen;
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> span;
  for (int64_t k = 0; k < static_cast<int64_t>(run.size()); ++k) {
    const int64_t i = run[static_cast<size_t>(k)];
    auto [it, fresh] = span.try_emplace({shard_of[static_cast<size_t>(i)], seen[i]++}, k, k);
    it->second.second = k;
  }
  std::map<int64_t, int64_t> delta;
  for (const auto& [copy, fl] : span) {
    ++delta[fl.first];
    --delta[fl.second + 1];
  }
  int64_t open = 0, most = 0;
  for (const auto& [k, d] : delta) most = std::max(most, open += d);
  return most;
}

Indices shard_of_mixed(const Sources& sources) {
  Indices all;
  for (const auto& shards : sources) all.insert(all.end(), shards.begin(), shards.end());
  return shard_of_samples(all);
}

}  // namespace

TEST(Mixing, CountsAreTheLargestRemainderOfTheWeights) {
  EXPECT_EQ(mixing_counts(kSources, weighted()), kWeightedCounts);
  // Within one sample of the quota E * w / sum(w): 1/500 of the epoch.
  const double weights[] = {1, 2, 5};
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_LT(std::abs(static_cast<double>(kWeightedCounts[s]) - 500.0 * weights[s] / 8.0), 1.0);
  }
  // Default weights are the sizes: the whole concatenation, or its proportions of epoch_size.
  MixingOptions o;
  EXPECT_EQ(mixing_counts(kSources, o), (Indices{300, 100, 40}));
  o.epoch_size = 220;
  EXPECT_EQ(mixing_counts(kSources, o), (Indices{150, 50, 20}));
  // Weights equal to counts, epoch_size their sum: exactly those counts (streaming's `choose`).
  o.weights = {7, 1000, 3};
  o.epoch_size = 1010;
  EXPECT_EQ(mixing_counts(kSources, o), (Indices{7, 1000, 3}));
  // Thirds of 10: 3.33 each, the one left to the first source.
  o.weights = {1, 1, 1};
  o.epoch_size = 10;
  EXPECT_EQ(mixing_counts(kSources, o), (Indices{4, 3, 3}));
}

TEST(Mixing, EveryEpochHoldsExactlyTheCountsOfEachSource) {
  MixingSampler s(kSources, weighted());
  for (const bool exact : {false, true}) {
    MixingOptions o = weighted();
    o.exact_order = exact;
    for (const int64_t epoch : {0, 1, 7}) {
      const Indices list = mixing_epoch_list(kSources, o, epoch);
      ASSERT_EQ(static_cast<int64_t>(list.size()), 500);
      EXPECT_EQ(counts_by_source(list, s), kWeightedCounts) << "epoch " << epoch;
      EXPECT_EQ(s.per_source_counts(epoch), kWeightedCounts);
      Indices from_pieces(3, 0);
      for (const MixingPiece& p : mixing_epoch_pieces(kSources, o, epoch)) {
        from_pieces[static_cast<size_t>(p.source)] += p.count;
      }
      EXPECT_EQ(from_pieces, kWeightedCounts);
    }
  }
}

// C (40 samples) gives 312 = 7 * 40 + 32: every sample 7 times, 32 of them an 8th; B (100) gives
// 125 = 100 + 25: every sample once, then 25 of whole shards with the last one cut.
TEST(Mixing, ACountAboveTheSourceRepeatsWholePassesThenWholeShards) {
  const MixingOptions o = weighted();
  const Indices offsets = source_sample_offsets(kSources);
  ASSERT_EQ(offsets, (Indices{0, 300, 400, 440}));
  for (const int64_t epoch : {0, 3}) {
    const auto times = occurrences(mixing_epoch_list(kSources, o, epoch));
    int64_t c_eighth = 0, b_twice = 0;
    for (int64_t i = 400; i < 440; ++i) {
      ASSERT_TRUE(times.at(i) == 7 || times.at(i) == 8) << i;
      c_eighth += times.at(i) == 8;
    }
    for (int64_t i = 300; i < 400; ++i) {
      ASSERT_TRUE(times.at(i) == 1 || times.at(i) == 2) << i;
      b_twice += times.at(i) == 2;
    }
    EXPECT_EQ(c_eighth, 32);
    EXPECT_EQ(b_twice, 25);
    std::vector<MixingPiece> b;
    for (const MixingPiece& p : mixing_epoch_pieces(kSources, o, epoch)) {
      if (p.source == 1) b.push_back(p);
    }
    // One pass: shards 30, 31, 33 (global ids; 32 is empty) whole, in order.
    ASSERT_GE(b.size(), 4u);
    EXPECT_EQ(b[0], (MixingPiece{1, 30, 300, 50}));
    EXPECT_EQ(b[1], (MixingPiece{1, 31, 350, 20}));
    EXPECT_EQ(b[2], (MixingPiece{1, 33, 370, 30}));
    // Then 25 samples: whole shards, the last one its first samples, no shard twice.
    int64_t subset = 0;
    std::set<int64_t> shards;
    for (size_t k = 3; k < b.size(); ++k) {
      const int64_t size = kSources[1][static_cast<size_t>(b[k].shard - 30)];
      EXPECT_EQ(b[k].first,
                offsets[1] + std::accumulate(kSources[1].begin(),
                                             kSources[1].begin() + (b[k].shard - 30), int64_t{0}));
      if (k + 1 < b.size()) {
        EXPECT_EQ(b[k].count, size);
      }
      EXPECT_LE(b[k].count, size);
      EXPECT_TRUE(shards.insert(b[k].shard).second);
      subset += b[k].count;
    }
    EXPECT_EQ(subset, 25);
  }
}

// A (30 shards of 10) gives 63: six whole shards and three samples of a seventh, another subset
// every epoch, the same for the same (seed, epoch).
TEST(Mixing, ASourceSampledDownReadsWholeShardsAnotherSubsetEachEpoch) {
  const MixingOptions o = weighted();
  auto subset_of = [&](const MixingOptions& opts, int64_t epoch) {
    std::vector<MixingPiece> a;
    for (const MixingPiece& p : mixing_epoch_pieces(kSources, opts, epoch)) {
      if (p.source == 0) a.push_back(p);
    }
    return a;
  };
  std::set<std::set<int64_t>> subsets;
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    const auto a = subset_of(o, epoch);
    ASSERT_EQ(a.size(), 7u);
    std::set<int64_t> shards;
    for (size_t k = 0; k < 7; ++k) {
      EXPECT_EQ(a[k].count, k < 6 ? 10 : 3);
      EXPECT_EQ(a[k].first, a[k].shard * 10);
      shards.insert(a[k].shard);
    }
    EXPECT_EQ(shards.size(), 7u);
    subsets.insert(shards);
    EXPECT_EQ(subset_of(o, epoch), a);
    EXPECT_EQ(mixing_epoch_list(kSources, o, epoch), mixing_epoch_list(kSources, o, epoch));
  }
  EXPECT_EQ(subsets.size(), 6u);  // six epochs, six subsets
  MixingOptions other = o;
  other.seed = 32;
  EXPECT_NE(subset_of(other, 2), subset_of(o, 2));
  EXPECT_NE(mixing_epoch_list(kSources, other, 2), mixing_epoch_list(kSources, o, 2));
}

TEST(Mixing, OneGlobalListForEveryWorldSize) {
  const Indices one = mixing_epoch_list(kSources, weighted(), 2);
  for (const int64_t world : {1, 2, 3, 4}) {
    const MixingOptions o = weighted(world);
    const Indices list = mixing_epoch_list(kSources, o, 2);
    EXPECT_EQ(head(list, 500), one) << "world=" << world;
    // The ranks' parts put back by position are the lockstep list; their first samples are the
    // contiguous runs of the one list.
    std::vector<Indices> parts;
    Indices runs;
    for (int64_t r = 0; r < world; ++r) {
      parts.push_back(rank_part(kSources, o, r, 2));
      runs.insert(runs.end(), parts.back().begin(),
                  parts.back().begin() + (500 * (r + 1) / world - 500 * r / world));
    }
    Indices lockstep;
    for (size_t i = 0; i < parts[0].size(); ++i) {
      for (const auto& part : parts) lockstep.push_back(part[i]);
    }
    EXPECT_EQ(lockstep, mixing_lockstep_list(kSources, o, 2)) << "world=" << world;
    EXPECT_EQ(runs, one) << "world=" << world;
  }
}

TEST(Mixing, SizesPaddingAndRankSourceCountsAreDistributedSamplers) {
  const Indices unpadded = mixing_epoch_list(kSources, weighted(), 1);
  for (const int64_t world : {3, 7}) {
    for (const bool drop_last : {false, true}) {
      const MixingOptions o = weighted(world, drop_last);
      const DistributedSampler ds(500, {world, 0, true, o.seed, drop_last});
      const Indices list = mixing_epoch_list(kSources, o, 1);
      ASSERT_EQ(static_cast<int64_t>(list.size()), ds.total_size());
      for (size_t k = 0; k < list.size(); ++k) EXPECT_EQ(list[k], unpadded[k % 500]);
      Indices sum(3, 0);
      for (int64_t r = 0; r < world; ++r) {
        MixingOptions ro = o;
        ro.rank = r;
        MixingSampler s(kSources, ro);
        s.set_epoch(1);
        EXPECT_EQ(s.size(), ds.size());
        EXPECT_EQ(s.total_size(), ds.total_size());
        const Indices counts = s.rank_source_counts();
        for (size_t c = 0; c < 3; ++c) sum[c] += counts[c];
      }
      // The ranks pad (or cut) their own runs: the lockstep list, not the padded list, is theirs.
      const Indices lockstep = mixing_lockstep_list(kSources, o, 1);
      EXPECT_EQ(sum, counts_by_source(lockstep, MixingSampler(kSources, o))) << world << drop_last;
    }
  }
}

// Run `from` ranks for k lockstep batches, resume the rest on `to` ranks: every remaining position
// of the old world's lockstep list delivered once (tests/elastic_resume.h).
TEST(Mixing, ResumesMidEpochOnAnotherWorldSize) {
  auto make = [](int64_t world, int64_t rank, std::optional<EpochResume> resume) {
    MixingOptions o = weighted(world);
    o.rank = rank;
    return std::unique_ptr<ResumableSampler>(std::make_unique<MixingSampler>(kSources, o, resume));
  };
  auto lockstep = [](int64_t world) { return mixing_lockstep_list(kSources, weighted(world), 3); };
  for (const auto& [from, to] : std::vector<std::pair<int64_t, int64_t>>{{4, 3}, {2, 4}, {3, 1}}) {
    for (const int64_t k : {0, 1, 4, 7}) {
      const Indices delivered = gpufeed::test::expect_elastic_resume(make, lockstep, from, to, k,
                                                                     /*batch=*/16, /*epoch=*/3);
      // Old world's padding (k > 0) or the new world's: 500 positions and a few repeated.
      EXPECT_GE(static_cast<int64_t>(delivered.size()), 500);
    }
  }
}

// Shards of 10 and counts that are multiples of 10, 24 partitions of 10 pieces: no piece is cut,
// so a rank has at most `window` shards open at once for every world size, and windows do mix
// several. With a repeated source, its copies are told apart by occurrence order, which holds
// while runs begin at window starts: world sizes dividing the partitions.
TEST(Mixing, OneWindowOfPiecesOpenPerRankForEveryWorldSize) {
  auto check = [](const Sources& sources, const Indices& counts, const Indices& worlds) {
    const Indices shard_of = shard_of_mixed(sources);
    MixingOptions o;  // window 8, partitions 24
    o.seed = 5;
    o.weights = {1, 1, 2};
    o.epoch_size = 2400;
    ASSERT_EQ(mixing_counts(sources, o), counts);
    for (const int64_t world : worlds) {
      o.num_replicas = world;
      for (int64_t r = 0; r < world; ++r) {
        const Indices mine = rank_part(sources, o, r, 4);
        const int64_t most =
            most_open(head(mine, 2400 * (r + 1) / world - 2400 * r / world), shard_of);
        EXPECT_LE(most, o.window) << "world=" << world << " rank " << r;
        EXPECT_GE(most, 2) << "world=" << world << " rank " << r;
      }
    }
  };
  // All three sampled down (600 of 2000, 600 of 1200, 1200 of 1600).
  check({SourceShards(200, 10), SourceShards(120, 10), SourceShards(160, 10)}, {600, 600, 1200},
        {1, 2, 3, 4, 5, 6, 7, 8});
  // The third repeated 6 times (1200 of 200).
  check({SourceShards(200, 10), SourceShards(120, 10), SourceShards(20, 10)}, {600, 600, 1200},
        {1, 2, 3, 4, 6, 8});
}

TEST(Mixing, ExactOrderIsOnePermutationOfTheSelectedSamples) {
  MixingOptions o = weighted();
  o.exact_order = true;
  Indices flat;
  for (const MixingPiece& p : mixing_epoch_pieces(kSources, o, 5)) {
    for (int64_t i = p.first; i < p.first + p.count; ++i) flat.push_back(i);
  }
  Indices expected;
  for (const int64_t k : randperm(500, o.seed + 5))
    expected.push_back(flat[static_cast<size_t>(k)]);
  EXPECT_EQ(mixing_epoch_list(kSources, o, 5), expected);
  EXPECT_EQ(sorted(expected), sorted(mixing_epoch_list(kSources, weighted(), 5)));
}

TEST(Mixing, ShuffleOffIsTheSourcesInOrder) {
  // Default weights: the concatenation, DistributedSampler(shuffle = false)'s list.
  MixingOptions o;
  o.shuffle = false;
  o.num_replicas = 3;
  EXPECT_EQ(mixing_epoch_list(kSources, o, 4), distributed_epoch_list(440, {3, 0, false, 0}, 4));
  // Sources {3, 2} and {4}, 5 each: A whole, then B once and its first shard's first sample.
  const Sources small = {{3, 2}, {4}};
  o.weights = {1, 1};
  o.epoch_size = 10;
  const Indices in_order = {0, 1, 2, 3, 4, 5, 6, 7, 8, 5};
  o.num_replicas = 1;
  EXPECT_EQ(mixing_epoch_list(small, o, 0), in_order);
  EXPECT_EQ(mixing_epoch_list(small, o, 9), in_order);
  o.num_replicas = 4;  // padded to 12 by repeating the start
  EXPECT_EQ(mixing_epoch_list(small, o, 0), (Indices{0, 1, 2, 3, 4, 5, 6, 7, 8, 5, 0, 1}));
  o.rank = 1;
  EXPECT_EQ(MixingSampler(small, o).indices(), (Indices{2, 3, 4}));
}

TEST(Mixing, RejectsBadOptionsNamingThem) {
  auto message_of = [](auto&& make) { return gpufeed::test::invalid_argument_message(make); };
  auto rejects = [&](const Sources& sources, const MixingOptions& o, const std::string& part) {
    EXPECT_NE(message_of([&] { MixingSampler(sources, o); }).find(part), std::string::npos) << part;
  };
  MixingOptions o;
  rejects({}, o, "no sources");
  rejects({{5}, {0, 0}}, o, "sources[1] has no samples");
  rejects({{5}, {2, -1}}, o, "sources[1] shard 1");
  o.weights = {1};
  rejects(kSources, o, "1 weights for 3 sources");
  o.weights = {1, 0, 1};
  rejects(kSources, o, "weights[1]");
  o.weights = {1, 1, std::numeric_limits<double>::quiet_NaN()};
  rejects(kSources, o, "weights[2]");
  o = {};
  o.epoch_size = -1;
  rejects(kSources, o, "epoch_size");
  o = {};
  o.window = 0;
  rejects(kSources, o, "window");
  o = {};
  o.num_replicas = 2;
  o.rank = 2;
  rejects(kSources, o, "rank 2");
  EXPECT_NE(message_of([&] {
              MixingSampler(kSources, {}, EpochResume{0, 1, 441});
            }).find("441 positions"),
            std::string::npos);
  EXPECT_THROW(MixingSampler(kSources, {}).source_of(440), std::out_of_range);
}
