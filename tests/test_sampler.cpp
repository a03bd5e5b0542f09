#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "gpufeed/sampler/ra_sampler.h"
#include "gpufeed/sampler/randperm.h"
#include "gpufeed/sampler/sampler.h"
#include "golden.h"

using namespace gpufeed::sampler;

TEST(Randperm, MatchesTorchRandpermForEverySeed) {
  const nlohmann::json g = gpufeed::test::load_golden("sampler.json");
  ASSERT_GE(g["randperm"].size(), 5u);
  for (const auto& c : g["randperm"]) {
    const auto expected = c["perm"].get<std::vector<int64_t>>();
    EXPECT_EQ(randperm(c["n"].get<int64_t>(), c["seed"].get<uint64_t>()), expected)
        << "n=" << c["n"] << " seed=" << c["seed"];
  }
}

TEST(DistributedSampler, MatchesPyTorchOnTheWholeGrid) {
  const nlohmann::json g = gpufeed::test::load_golden("sampler.json");
  size_t checked = 0;
  for (const auto& c : g["distributed"]) {
    DistributedSamplerOptions o;
    o.num_replicas = c["num_replicas"];
    o.rank = c["rank"];
    o.shuffle = c["shuffle"];
    o.seed = c["seed"];
    o.drop_last = c["drop_last"];
    DistributedSampler s(c["n"].get<int64_t>(), o);
    ASSERT_EQ(s.size(), c["len"].get<int64_t>()) << c.dump().substr(0, 120);
    for (const auto& e : c["epochs"]) {
      s.set_epoch(e["epoch"]);
      ASSERT_EQ(s.indices(), e["indices"].get<std::vector<int64_t>>())
          << "n=" << c["n"] << " world=" << o.num_replicas << " rank=" << o.rank
          << " drop_last=" << o.drop_last << " shuffle=" << o.shuffle << " epoch=" << e["epoch"];
      ++checked;
    }
  }
  // 7 sizes x (1+2+3+4+8+16 ranks) x 2 drop_last x 2 shuffle x 2 seeds x 3 epochs.
  EXPECT_EQ(checked, 7u * 34u * 2u * 2u * 2u * 3u);
}

// The torchvision references' RASampler (reimplemented from its description in
// tests/goldens/gen_sampler.py): every index of every rank and epoch.
TEST(RASampler, MatchesTheReferencesRASamplerOnTheWholeGrid) {
  const nlohmann::json g = gpufeed::test::load_golden("sampler.json");
  size_t checked = 0, nonempty = 0;
  for (const auto& c : g["ra_sampler"]) {
    RASamplerOptions o;
    o.num_replicas = c["num_replicas"];
    o.rank = c["rank"];
    o.shuffle = c["shuffle"];
    o.seed = c["seed"];
    o.repetitions = c["repetitions"];
    o.selection_multiple = c["selection_multiple"];
    RASampler s(c["n"].get<int64_t>(), o);
    ASSERT_EQ(s.size(), c["len"].get<int64_t>()) << c.dump().substr(0, 160);
    for (const auto& e : c["epochs"]) {
      s.set_epoch(e["epoch"]);
      const auto want = e["indices"].get<std::vector<int64_t>>();
      ASSERT_EQ(s.indices(), want) << "n=" << c["n"] << " world=" << o.num_replicas << " rank=" << o.rank
                                   << " reps=" << o.repetitions << " shuffle=" << o.shuffle << " seed=" << o.seed
                                   << " epoch=" << e["epoch"];
      ++checked;
      nonempty += !want.empty();
    }
  }
  EXPECT_GE(checked, 4000u);
  EXPECT_GE(nonempty, 3000u);
}

// With ra_reps = world size every rank sees the same images (each its own augmentation of
// them).
TEST(RASampler, WithRepsEqualToTheWorldSizeEveryRankSeesTheSameImages) {
  RASamplerOptions o;
  o.num_replicas = 4;
  o.repetitions = 4;
  std::vector<std::vector<int64_t>> per_rank;
  for (int64_t r = 0; r < 4; ++r) {
    o.rank = r;
    per_rank.push_back(RASampler(1024, o).indices());
  }
  EXPECT_EQ(per_rank[0].size(), 256u);
  for (int64_t r = 1; r < 4; ++r) EXPECT_EQ(per_rank[static_cast<size_t>(r)], per_rank[0]);
  EXPECT_EQ(std::set<int64_t>(per_rank[0].begin(), per_rank[0].end()).size(), 256u);
  EXPECT_EQ(RASampler(255, o).size(), 0);  // below the references' 256: an empty epoch
  EXPECT_THROW(RASampler(0, RASamplerOptions{1, 1}), std::invalid_argument);
  EXPECT_THROW(RASampler(10, RASamplerOptions{1, 0, true, 0, 0}), std::invalid_argument);
  EXPECT_THROW(RASampler(1, RASamplerOptions{8, 0, true, 0, 1, 1}), std::invalid_argument);  // padding 7 > 1
}

TEST(DistributedSampler, PaddingWrapsMoreThanOnceWhenDatasetIsSmallerThanWorld) {
  DistributedSamplerOptions o;
  o.num_replicas = 8;
  o.shuffle = false;
  std::vector<int64_t> got;
  for (int64_t r = 0; r < 8; ++r) {
    o.rank = r;
    DistributedSampler s(3, o);
    auto idx = s.indices();
    ASSERT_EQ(idx.size(), 1u);
    got.push_back(idx[0]);
  }
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1}));
}

TEST(DistributedSampler, RanksPartitionTheEpochWithDropLast) {
  DistributedSamplerOptions o;
  o.num_replicas = 4;
  o.drop_last = true;
  o.seed = 3;
  std::set<int64_t> seen;
  for (int64_t r = 0; r < 4; ++r) {
    o.rank = r;
    DistributedSampler s(103, o);
    s.set_epoch(2);
    for (int64_t i : s.indices()) EXPECT_TRUE(seen.insert(i).second) << "duplicate " << i;
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(DistributedSampler, RejectsRankOutsideWorld) {
  DistributedSamplerOptions o;
  o.num_replicas = 2;
  o.rank = 2;
  EXPECT_THROW(DistributedSampler(10, o), std::invalid_argument);
}

TEST(BatchSampler, KeepsOrDropsTheShortLastBatch) {
  auto s = std::make_shared<SequentialSampler>(10);
  BatchSampler keep(s, 4, false);
  EXPECT_EQ(keep.size(), 3);
  EXPECT_EQ(keep.batches(), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  BatchSampler drop(s, 4, true);
  EXPECT_EQ(drop.size(), 2);
  EXPECT_EQ(drop.batches().size(), 2u);
}

TEST(RandomSampler, EqualsOneReplicaDistributedSamplerEveryEpoch) {
  RandomSampler r(57, 9);
  DistributedSamplerOptions o;
  o.seed = 9;
  DistributedSampler d(57, o);
  for (int64_t e : {0, 1, 7}) {
    r.set_epoch(e);
    d.set_epoch(e);
    EXPECT_EQ(r.indices(), d.indices());
  }
  r.set_epoch(0);
  auto a = r.indices();
  r.set_epoch(1);
  EXPECT_NE(a, r.indices());
}
