// The shard-aware order (gpufeed/sampler/shard_order.h): one global list per (seed, epoch) for
// every world size, every sample once, windows of whole shard pieces, the padding and sizes of
// DistributedSampler, each rank a contiguous run of the list, elastic resume through resume.h, one
// rank per shard when the world size divides the partitions, and one window of shards open per
// rank for every world size.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "sampler_checks.h"
#include "gpufeed/sampler/resume.h"
#include "gpufeed/sampler/sampler.h"
#include "gpufeed/sampler/shard_order.h"

using namespace gpufeed::sampler;

namespace {

using Indices = std::vector<int64_t>;

ShardOrderOptions order_options(int64_t world, int64_t window, int64_t partitions,
                                bool drop_last = false) {
  ShardOrderOptions o;
  o.num_replicas = world;
  o.seed = 77;
  o.window = window;
  o.partitions = partitions;
  o.drop_last = drop_last;
  return o;
}

int64_t total(const Indices& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
}

Indices iota(int64_t n) {
  Indices v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

Indices sorted(Indices v) {
  std::sort(v.begin(), v.end());
  return v;
}

Indices head(const Indices& v, int64_t n) { return Indices(v.begin(), v.begin() + n); }

Indices rank_part(const Indices& sizes, ShardOrderOptions o, int64_t rank, int64_t epoch) {
  o.rank = rank;
  ShardAwareSampler s(sizes, o);
  s.set_epoch(epoch);
  return s.indices();
}

// The ranks' parts put back by position: rank r's i-th index sits at r + i * world (the lockstep
// list).
Indices reassembled(const Indices& sizes, const ShardOrderOptions& o, int64_t epoch) {
  Indices list;
  std::vector<Indices> parts;
  for (int64_t r = 0; r < o.num_replicas; ++r) parts.push_back(rank_part(sizes, o, r, epoch));
  for (size_t i = 0; i < parts[0].size(); ++i) {
    for (const auto& part : parts) {
      if (i < part.size()) list.push_back(part[i]);
    }
  }
  return list;
}

// Layouts: empty, all-empty shards, one shard, uneven with empty shards, fewer samples than ranks,
// equal small shards, a shard larger than n / partitions.
const std::vector<Indices> kLayouts = {{},
                                       {0, 0},
                                       {1},
                                       {40},
                                       {3, 0, 17, 1, 250, 9, 0, 44},
                                       {1, 1},
                                       {150, 150, 150, 150, 150, 150},
                                       {900, 5, 7, 30, 2, 11, 60, 1, 1, 8, 100, 3}};

}  // namespace

TEST(ShardOrder, EverySampleExactlyOncePerEpoch) {
  for (const auto& sizes : kLayouts) {
    for (const int64_t window : {1, 3, 8}) {
      for (const int64_t partitions : {1, 4, 64}) {
        for (const int64_t epoch : {0, 5}) {
          const Indices list =
              shard_aware_epoch_list(sizes, order_options(1, window, partitions), epoch);
          ASSERT_EQ(sorted(list), iota(total(sizes)))
              << "shards=" << sizes.size() << " window=" << window << " partitions=" << partitions;
        }
      }
    }
  }
}

TEST(ShardOrder, OneGlobalListForEveryWorldSize) {
  for (const auto& sizes : kLayouts) {
    const int64_t n = total(sizes);
    const Indices one = shard_aware_epoch_list(sizes, order_options(1, 4, 6), 3);
    for (const int64_t world : {1, 2, 3, 4, 8}) {
      const ShardOrderOptions o = order_options(world, 4, 6);
      const Indices list = shard_aware_epoch_list(sizes, o, 3);
      EXPECT_EQ(reassembled(sizes, o, 3), shard_aware_lockstep_list(sizes, o, 3))
          << "n=" << n << " world=" << world;
      if (n > 0) {
        EXPECT_EQ(head(list, n), one) << "n=" << n << " world=" << world;
      }
      // Rank r's first samples are its run of the one list, [floor(r n / W), floor((r + 1) n / W)).
      Indices runs;
      for (int64_t r = 0; r < world; ++r) {
        const Indices mine = rank_part(sizes, o, r, 3);
        const int64_t size = n * (r + 1) / world - n * r / world;
        runs.insert(runs.end(), mine.begin(), mine.begin() + std::min<int64_t>(size, mine.size()));
      }
      if (n > 0) {
        EXPECT_EQ(runs, one) << "n=" << n << " world=" << world;
      }
    }
  }
}

TEST(ShardOrder, SameSeedAndEpochSameOrderOtherwiseAnother) {
  const Indices sizes = {150, 150, 150, 150, 150, 150, 37};
  const ShardOrderOptions o = order_options(1, 2, 3);
  const Indices base = shard_aware_epoch_list(sizes, o, 4);
  EXPECT_EQ(shard_aware_epoch_list(sizes, o, 4), base);
  EXPECT_NE(shard_aware_epoch_list(sizes, o, 5), base);
  ShardOrderOptions other = o;
  other.seed = 78;
  EXPECT_NE(shard_aware_epoch_list(sizes, other, 4), base);
  // Not the identity and not DistributedSampler's permutation.
  EXPECT_NE(base, iota(total(sizes)));
  EXPECT_NE(base, distributed_epoch_list(total(sizes), {1, 0, true, o.seed, false}, 4));
}

TEST(ShardOrder, ShuffleOffIsTheSequentialList) {
  const Indices sizes = {3, 0, 17, 1, 250, 9, 0, 44};
  for (const int64_t world : {1, 3, 4}) {
    for (const bool drop_last : {false, true}) {
      ShardOrderOptions o = order_options(world, 8, 64, drop_last);
      o.shuffle = false;
      const Indices expected =
          distributed_epoch_list(total(sizes), {world, 0, false, 0, drop_last}, 2);
      EXPECT_EQ(shard_aware_epoch_list(sizes, o, 2), expected) << world << drop_last;
    }
  }
  ShardOrderOptions o = order_options(1, 8, 64);
  o.shuffle = false;
  EXPECT_EQ(shard_aware_epoch_list(sizes, o, 9), SequentialSampler(total(sizes)).indices());
}

// Within partition p's stream (positions [floor(p n / P), floor((p + 1) n / P))), each shard's
// samples form one contiguous
// run of its indices (a piece), and the stream is windows of `window` whole pieces one after the
// other: cutting the stream wherever every piece begun so far is complete, each closed run holds
// exactly `window` pieces (the partition's last window fewer). A window mixed into the next, or
// windows of the wrong width, would close runs of other sizes.
TEST(ShardOrder, WindowsAreWholePiecesYieldedOneAfterAnother) {
  const Indices sizes = {120, 80, 0, 95, 130, 60, 75, 110, 90, 100, 85, 70, 140, 65, 50, 105, 98};
  const Indices shard = shard_of_samples(sizes);
  for (const int64_t window : {1, 2, 3, 5}) {
    const ShardOrderOptions o = order_options(1, window, 3);
    const Indices list = shard_aware_epoch_list(sizes, o, 1);
    const int64_t parts = effective_partitions(sizes, o);
    ASSERT_EQ(parts, 3);
    for (int64_t p = 0; p < parts; ++p) {
      std::map<int64_t, Indices> piece;  // shard -> its samples in this stream
      Indices stream;
      const auto n = static_cast<int64_t>(list.size());
      for (auto k = static_cast<size_t>(n * p / parts); k < static_cast<size_t>(n * (p + 1) / parts); ++k) {
        stream.push_back(list[k]);
        piece[shard[static_cast<size_t>(list[k])]].push_back(list[k]);
      }
      for (const auto& [s, samples] : piece) {
        const Indices run = sorted(samples);
        EXPECT_EQ(run.back() - run.front() + 1, static_cast<int64_t>(run.size())) << "shard " << s;
      }
      std::vector<int64_t> closed;  // pieces per closed run
      std::map<int64_t, size_t> left;
      int64_t open_pieces = 0;
      for (const int64_t i : stream) {
        const int64_t s = shard[static_cast<size_t>(i)];
        if (!left.count(s)) {
          left[s] = piece[s].size();
          ++open_pieces;
        }
        if (--left[s] == 0 &&
            std::all_of(left.begin(), left.end(), [](auto& e) { return e.second == 0; })) {
          closed.push_back(open_pieces);
          left.clear();
          open_pieces = 0;
        }
      }
      ASSERT_FALSE(closed.empty());
      for (size_t c = 0; c + 1 < closed.size(); ++c) {
        EXPECT_EQ(closed[c], window) << "window=" << window << " partition=" << p << " run " << c;
      }
      EXPECT_LE(closed.back(), window);
      EXPECT_EQ(std::accumulate(closed.begin(), closed.end(), int64_t{0}),
                static_cast<int64_t>(piece.size()));
    }
  }
}

TEST(ShardOrder, SizesAndPaddingAreDistributedSamplers) {
  for (const auto& sizes : kLayouts) {
    const int64_t n = total(sizes);
    for (const int64_t world : {1, 2, 3, 4, 8}) {
      for (const bool drop_last : {false, true}) {
        const ShardOrderOptions o = order_options(world, 8, 64, drop_last);
        const DistributedSampler ds(n, {world, 0, true, o.seed, drop_last});
        const Indices list = shard_aware_epoch_list(sizes, o, 0);
        ASSERT_EQ(static_cast<int64_t>(list.size()), ds.total_size()) << n << " " << world;
        ShardAwareSampler s(sizes, o);
        EXPECT_EQ(s.total_size(), ds.total_size());
        EXPECT_EQ(s.size(), ds.size());
        EXPECT_EQ(static_cast<int64_t>(s.indices().size()), ds.size());
        const Indices unpadded = shard_aware_epoch_list(sizes, order_options(1, 8, 64), 0);
        // Padding repeats the list's start (wrapping when n < world); drop_last keeps a prefix.
        for (size_t k = 0; k < list.size(); ++k) {
          EXPECT_EQ(list[k], unpadded[k % unpadded.size()]) << n << " " << world << " " << k;
        }
      }
    }
  }
}

// With the world size dividing the partitions, each shard goes to one rank (here no shard is
// split: 96 equal shards over 16 partitions); with uneven shards only the split ones may go to
// two ranks, at most partitions - 1 of them.
TEST(ShardOrder, EachShardReadByOneRankWhenTheWorldDividesThePartitions) {
  auto ranks_per_shard = [](const Indices& sizes, const ShardOrderOptions& base, int64_t epoch) {
    const Indices shard = shard_of_samples(sizes);
    std::map<int64_t, std::set<int64_t>> readers;
    for (int64_t r = 0; r < base.num_replicas; ++r) {
      // The padding repeats the rank's own run, so its whole part counts.
      for (const int64_t i : rank_part(sizes, base, r, epoch)) readers[shard[static_cast<size_t>(i)]].insert(r);
    }
    return readers;
  };
  const Indices equal(96, 50);
  for (const int64_t world : {1, 2, 4, 8, 16}) {
    const auto readers = ranks_per_shard(equal, order_options(world, 4, 16), 2);
    ASSERT_EQ(readers.size(), equal.size());
    for (const auto& [s, ranks] : readers)
      EXPECT_EQ(ranks.size(), 1u) << "world=" << world << " shard " << s;
  }
  // World 3 does not divide 16: shards are shared.
  const auto shared = ranks_per_shard(equal, order_options(3, 4, 16), 2);
  EXPECT_TRUE(
      std::any_of(shared.begin(), shared.end(), [](auto& e) { return e.second.size() > 1; }));

  Indices uneven;
  for (int64_t s = 0; s < 90; ++s) uneven.push_back(20 + (s * 37) % 61);
  for (const int64_t world : {2, 4, 8}) {
    const auto readers = ranks_per_shard(uneven, order_options(world, 4, 8), 1);
    const auto split =
        std::count_if(readers.begin(), readers.end(), [](auto& e) { return e.second.size() > 1; });
    EXPECT_LE(split, 7) << "world=" << world;
    for (const auto& [s, ranks] : readers) EXPECT_LE(ranks.size(), 2u);
  }
}

// With the default options, a rank has at most `window` shards open at once (a shard is open from
// its first to its last sample in the rank's run), for every world size from 1 to 8; the shards the
// ranks read add up to the dataset's when the world size divides the partitions (24), and to at
// most window more per cut otherwise. 240 equal shards: no shard is split by a partition cut.
TEST(ShardOrder, OneWindowOfShardsOpenPerRankForEveryWorldSize) {
  const Indices sizes(240, 10);
  const Indices shard = shard_of_samples(sizes);
  const ShardOrderOptions defaults;
  for (int64_t world = 1; world <= 8; ++world) {
    ShardOrderOptions o = defaults;
    o.num_replicas = world;
    o.seed = 5;
    int64_t shard_reads = 0;
    for (int64_t r = 0; r < world; ++r) {
      const Indices mine = rank_part(sizes, o, r, 4);
      const int64_t run = 2400 * (r + 1) / world - 2400 * r / world;  // before its padding
      std::map<int64_t, std::pair<int64_t, int64_t>> span;  // shard -> first, last position
      for (int64_t k = 0; k < run; ++k) {
        const int64_t s = shard[static_cast<size_t>(mine[static_cast<size_t>(k)])];
        auto [it, fresh] = span.try_emplace(s, k, k);
        it->second.second = k;
      }
      std::map<int64_t, int64_t> delta;  // position -> shards opened minus closed
      for (const auto& [s, fl] : span) {
        ++delta[fl.first];
        --delta[fl.second + 1];
      }
      int64_t open = 0, most = 0;
      for (const auto& [k, d] : delta) most = std::max(most, open += d);
      EXPECT_LE(most, defaults.window) << "world=" << world << " rank " << r;
      EXPECT_GE(most, 2) << "world=" << world << " rank " << r;  // windows do mix shards
      shard_reads += static_cast<int64_t>(span.size());
    }
    if (defaults.partitions % world == 0) {
      EXPECT_EQ(shard_reads, 240) << "world=" << world;
    } else {
      EXPECT_LE(shard_reads, 240 + (world - 1) * defaults.window) << "world=" << world;
      EXPECT_GT(shard_reads, 240) << "world=" << world;
    }
  }
}

TEST(ShardOrder, FixedPartitionsKeepEachRanksShardsAcrossEpochs) {
  const Indices sizes(64, 30);
  ShardOrderOptions o = order_options(4, 2, 8);
  o.fixed_partitions = true;
  const Indices shard = shard_of_samples(sizes);
  for (int64_t r = 0; r < 4; ++r) {
    std::set<int64_t> first, second;
    const Indices e0 = rank_part(sizes, o, r, 0), e1 = rank_part(sizes, o, r, 1);
    for (const int64_t i : e0) first.insert(shard[static_cast<size_t>(i)]);
    for (const int64_t i : e1) second.insert(shard[static_cast<size_t>(i)]);
    EXPECT_EQ(first, second) << "rank " << r;
    EXPECT_NE(e0, e1) << "rank " << r;
  }
  o.fixed_partitions = false;
  std::set<int64_t> first, second;
  for (const int64_t i : rank_part(sizes, o, 0, 0)) first.insert(shard[static_cast<size_t>(i)]);
  for (const int64_t i : rank_part(sizes, o, 0, 1)) second.insert(shard[static_cast<size_t>(i)]);
  EXPECT_NE(first, second);
}

// Run `from` ranks for k lockstep batches, resume the rest on `to` ranks: what the old ranks
// consumed plus what the new ranks deliver is the old world's list, so every sample once (and the
// padding positions once); the next epoch is plain shard-aware order for the new world size.
TEST(ShardOrder, ResumesMidEpochOnAnotherWorldSize) {
  const Indices sizes = {150, 150, 150, 150, 150, 150, 41, 0, 77};
  auto make = [&](int64_t world, int64_t rank, std::optional<EpochResume> resume) {
    ShardOrderOptions o = order_options(world, 8, 6);
    o.rank = rank;
    return std::unique_ptr<ResumableSampler>(std::make_unique<ShardAwareSampler>(sizes, o, resume));
  };
  auto lockstep = [&](int64_t world) {
    return shard_aware_lockstep_list(sizes, order_options(world, 8, 6), 3);
  };
  for (const auto& [from, to] : std::vector<std::pair<int64_t, int64_t>>{{4, 3}, {2, 4}, {4, 1}}) {
    for (const int64_t k : {0, 1, 5, 9}) {
      const Indices delivered = gpufeed::test::expect_elastic_resume(make, lockstep, from, to, k,
                                                                     /*batch=*/16, /*epoch=*/3);
      std::set<int64_t> distinct(delivered.begin(), delivered.end());
      EXPECT_EQ(static_cast<int64_t>(distinct.size()), total(sizes));
    }
  }
}

TEST(ShardOrder, RejectsBadOptionsNamingThem) {
  auto message_of = [](auto&& make) { return gpufeed::test::invalid_argument_message(make); };
  const Indices sizes = {10, 10};
  ShardOrderOptions o;
  o.window = 0;
  EXPECT_NE(message_of([&] { shard_aware_epoch_list(sizes, o, 0); }).find("window"),
            std::string::npos);
  o = {};
  o.partitions = 0;
  EXPECT_NE(message_of([&] { ShardAwareSampler(sizes, o); }).find("partitions"), std::string::npos);
  o = {};
  o.num_replicas = 0;
  EXPECT_NE(message_of([&] { ShardAwareSampler(sizes, o); }).find("num_replicas"),
            std::string::npos);
  o = {};
  o.num_replicas = 2;
  o.rank = 2;
  EXPECT_NE(message_of([&] { ShardAwareSampler(sizes, o); }).find("rank 2"), std::string::npos);
  EXPECT_NE(message_of([&] {
              shard_aware_epoch_list({4, -1}, ShardOrderOptions{}, 0);
            }).find("shard_sizes[1]"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ShardAwareSampler(sizes, {}, EpochResume{0, 1, 21});
            }).find("21 positions"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ShardAwareSampler(sizes, {}, EpochResume{0, 0, 0});
            }).find("num_replicas"),
            std::string::npos);
}

TEST(ShardOrder, FitToTotalSizeIsDistributedSamplersPadding) {
  EXPECT_EQ(fit_to_total_size({4, 5, 6}, 8), (Indices{4, 5, 6, 4, 5, 6, 4, 5}));
  EXPECT_EQ(fit_to_total_size({4, 5, 6}, 2), (Indices{4, 5}));
  EXPECT_EQ(fit_to_total_size({}, 4), Indices{});
  EXPECT_THROW(fit_to_total_size({1}, -1), std::invalid_argument);
}
