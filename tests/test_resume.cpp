// Resuming an epoch on another number of ranks (gpufeed/sampler/resume.h): what the old ranks
// consumed plus what the new ranks deliver is the old epoch's global list, each remaining position
// once; the next epoch is DistributedSampler's order for the new world size.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/sampler/resume.h"
#include "gpufeed/sampler/sampler.h"

namespace fs = std::filesystem;
using namespace gpufeed::sampler;

namespace {

using Indices = std::vector<int64_t>;

DistributedSamplerOptions options_of(int64_t world, int64_t rank, bool shuffle, bool drop_last) {
  DistributedSamplerOptions o;
  o.num_replicas = world;
  o.rank = rank;
  o.shuffle = shuffle;
  o.seed = 1234;
  o.drop_last = drop_last;
  return o;
}

void append(Indices& to, const Indices& from) { to.insert(to.end(), from.begin(), from.end()); }

Indices sorted(Indices v) {
  std::sort(v.begin(), v.end());
  return v;
}

// One data-parallel run of an epoch: every rank takes `k` batches (or all it has), in lockstep.
struct RunPart {
  Indices delivered;   // the batches taken, all ranks
  Indices undelivered; // what BatchSampler's drop_last left out of ranks that ran to their end
};

RunPart take_batches(const std::vector<std::shared_ptr<Sampler>>& ranks, int64_t epoch,
                     int64_t batch_size, bool drop_last, int64_t k) {
  RunPart part;
  for (const auto& s : ranks) {
    BatchSampler bs(s, batch_size, drop_last);
    bs.set_epoch(epoch);
    const auto batches = bs.batches();
    const auto taken = std::min<int64_t>(k, static_cast<int64_t>(batches.size()));
    size_t count = 0;
    for (int64_t b = 0; b < taken; ++b) {
      append(part.delivered, batches[static_cast<size_t>(b)]);
      count += batches[static_cast<size_t>(b)].size();
    }
    if (taken == static_cast<int64_t>(batches.size())) {
      const Indices all = s->indices();
      part.undelivered.insert(part.undelivered.end(), all.begin() + static_cast<std::ptrdiff_t>(count),
                              all.end());
    }
  }
  return part;
}

std::vector<std::shared_ptr<Sampler>> resumed_ranks(int64_t n, int64_t world, bool shuffle,
                                                    bool sampler_drop_last,
                                                    std::optional<EpochResume> resume) {
  std::vector<std::shared_ptr<Sampler>> out;
  for (int64_t r = 0; r < world; ++r) {
    out.push_back(std::make_shared<ResumedDistributedSampler>(
        n, options_of(world, r, shuffle, sampler_drop_last), resume));
  }
  return out;
}

}  // namespace

TEST(Resume, RemainingPositionsAreDealtRoundRobinWithoutPadding) {
  const Indices list = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  EXPECT_EQ(remaining_for_rank(list, 4, 3, 0), (Indices{14, 17}));
  EXPECT_EQ(remaining_for_rank(list, 4, 3, 1), (Indices{15, 18}));
  EXPECT_EQ(remaining_for_rank(list, 4, 3, 2), (Indices{16, 19}));
  EXPECT_EQ(remaining_for_rank(list, 7, 2, 0), (Indices{17, 19}));
  EXPECT_EQ(remaining_for_rank(list, 7, 2, 1), (Indices{18}));
  EXPECT_EQ(remaining_for_rank(list, 10, 3, 0), Indices{});
  EXPECT_EQ(remaining_count(10, 7, 2, 1), 1);
  EXPECT_EQ(remaining_count(10, 9, 4, 3), 0);
  EXPECT_THROW(remaining_for_rank(list, 11, 3, 0), std::invalid_argument);
  EXPECT_THROW(remaining_for_rank(list, 0, 3, 3), std::invalid_argument);
  // DistributedSampler(10, 4 replicas) pads to 12 with the list's start.
  EXPECT_EQ(distributed_epoch_list(10, options_of(4, 0, false, false), 0),
            (Indices{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1}));
  EXPECT_EQ(distributed_epoch_list(10, options_of(4, 0, false, true), 0),
            (Indices{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(Resume, ConsumedPositionsFollowTheLockstepRule) {
  // 12 positions, 4 ranks of 3, batches of 2: one batch each consumed 8 positions, two all 12.
  EXPECT_EQ(consumed_after_batches(12, 0, 4, 0, 0, 2, false), 0);
  EXPECT_EQ(consumed_after_batches(12, 0, 4, 3, 1, 2, false), 8);
  EXPECT_EQ(consumed_after_batches(12, 0, 4, 1, 2, 2, false), 12);
  // drop_last: one batch each is the whole epoch; the dropped tails count as consumed.
  EXPECT_EQ(consumed_after_batches(12, 0, 4, 2, 1, 2, true), 12);
  // Dealt from position 2 on: shares of 3, 3, 2, 2 positions, batches 2, 2, 1, 1.
  EXPECT_EQ(consumed_after_batches(12, 2, 4, 0, 1, 2, false), 10);
  EXPECT_EQ(consumed_after_batches(12, 2, 4, 0, 2, 2, false), 12);
  // Rank 2 ran out after 1 batch: whether rank 0 took its second cannot be told.
  EXPECT_THROW(consumed_after_batches(12, 2, 4, 2, 1, 2, false), std::invalid_argument);
  EXPECT_THROW(consumed_after_batches(12, 0, 4, 0, 3, 2, false), std::invalid_argument);
  EXPECT_THROW(consumed_after_batches(12, 0, 4, 0, 1, 0, false), std::invalid_argument);
}

// W -> W' for W=4 -> 3, 2 -> 3, 4 -> 1, 3 -> 5, at every batch boundary, both shuffles, both
// drop_lasts, dataset sizes that neither world size divides: consumed + delivered (+ what
// BatchSampler's drop_last left out) is the old epoch's global list, exactly; each new rank's
// count is within one of the others'; the next epoch is DistributedSampler's for W'.
TEST(Resume, OldConsumedPlusNewDeliveredIsTheOldEpochsGlobalList) {
  const int64_t epoch = 3;
  int64_t checked = 0;
  for (auto [world, new_world] : {std::pair{4, 3}, {2, 3}, {4, 1}, {2, 1}, {3, 5}}) {
    for (int64_t n : {1, 7, 23, 26, 64}) {
      for (bool shuffle : {false, true}) {
        for (bool sampler_drop_last : {false, true}) {
          for (int64_t batch_size : {1, 2, 3}) {
            for (bool drop_last : {false, true}) {
              const auto old_ranks = resumed_ranks(n, world, shuffle, sampler_drop_last, std::nullopt);
              const Indices global =
                  distributed_epoch_list(n, options_of(world, 0, shuffle, sampler_drop_last), epoch);
              const auto total = static_cast<int64_t>(global.size());
              BatchSampler rank0(old_ranks[0], batch_size, drop_last);
              for (int64_t k = 0; k <= rank0.size(); ++k) {
                const std::string what = "n=" + std::to_string(n) + " W=" + std::to_string(world) +
                                         "->" + std::to_string(new_world) +
                                         " shuffle=" + std::to_string(shuffle) +
                                         " sampler_drop_last=" + std::to_string(sampler_drop_last) +
                                         " bs=" + std::to_string(batch_size) +
                                         " drop_last=" + std::to_string(drop_last) +
                                         " k=" + std::to_string(k);
                const RunPart before = take_batches(old_ranks, epoch, batch_size, drop_last, k);
                const int64_t consumed =
                    consumed_after_batches(total, 0, world, world - 1, k, batch_size, drop_last);
                ASSERT_EQ(consumed, consumed_after_batches(total, 0, world, 0, k, batch_size, drop_last));
                const auto new_ranks = resumed_ranks(n, new_world, shuffle, sampler_drop_last,
                                                     EpochResume{epoch, world, consumed});
                const RunPart after = take_batches(new_ranks, epoch, batch_size, drop_last, total);
                int64_t fewest = total, most = 0;
                for (const auto& s : new_ranks) {
                  s->set_epoch(epoch);
                  fewest = std::min(fewest, s->size());
                  most = std::max(most, s->size());
                  ASSERT_EQ(static_cast<int64_t>(s->indices().size()), s->size()) << what;
                }
                if (consumed == 0) {  // nothing consumed: the epoch is DistributedSampler's for W'
                  for (int64_t r = 0; r < new_world; ++r) {
                    DistributedSampler plain(n, options_of(new_world, r, shuffle, sampler_drop_last));
                    plain.set_epoch(epoch);
                    ASSERT_EQ(new_ranks[static_cast<size_t>(r)]->indices(), plain.indices()) << what;
                  }
                } else {
                  ASSERT_LE(most - fewest, 1) << what;
                  Indices all = before.delivered;
                  append(all, after.delivered);
                  if (drop_last) append(all, after.undelivered);
                  if (drop_last && k == rank0.size()) append(all, before.undelivered);
                  ASSERT_EQ(sorted(all), sorted(global)) << what;
                  // Exactly the positions [consumed, total) were dealt, each once.
                  Indices dealt;
                  for (const auto& s : new_ranks) append(dealt, s->indices());
                  ASSERT_EQ(sorted(dealt), sorted(Indices(global.begin() + consumed, global.end())))
                      << what;
                }
                for (int64_t r = 0; r < new_world; ++r) {
                  DistributedSampler plain(n, options_of(new_world, r, shuffle, sampler_drop_last));
                  plain.set_epoch(epoch + 1);
                  new_ranks[static_cast<size_t>(r)]->set_epoch(epoch + 1);
                  ASSERT_EQ(new_ranks[static_cast<size_t>(r)]->indices(), plain.indices()) << what;
                  ASSERT_EQ(new_ranks[static_cast<size_t>(r)]->size(), plain.size()) << what;
                }
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1500);
}

// A resumed run checkpointed again, from rank 0, and resumed on a third world size: 4 -> 3 -> 2.
TEST(Resume, AResumedEpochResumesAgainOnAThirdWorldSize) {
  const int64_t n = 29, epoch = 1, batch_size = 2;
  for (bool drop_last : {false, true}) {
    const auto first = resumed_ranks(n, 4, true, false, std::nullopt);
    const Indices global = distributed_epoch_list(n, options_of(4, 0, true, false), epoch);
    const auto total = static_cast<int64_t>(global.size());
    ASSERT_EQ(total, 32);
    const RunPart a = take_batches(first, epoch, batch_size, drop_last, 2);
    const int64_t after_a = consumed_after_batches(total, 0, 4, 0, 2, batch_size, drop_last);
    EXPECT_EQ(after_a, 16);
    const auto second = resumed_ranks(n, 3, true, false, EpochResume{epoch, 4, after_a});
    const RunPart b = take_batches(second, epoch, batch_size, drop_last, 1);
    const int64_t after_b = consumed_after_batches(total, after_a, 3, 0, 1, batch_size, drop_last);
    EXPECT_EQ(after_b, 22);
    const auto third = resumed_ranks(n, 2, true, false, EpochResume{epoch, 4, after_b});
    const RunPart c = take_batches(third, epoch, batch_size, drop_last, total);
    Indices all = a.delivered;
    append(all, b.delivered);
    append(all, c.delivered);
    if (drop_last) append(all, c.undelivered);
    EXPECT_EQ(sorted(all), sorted(global)) << "drop_last=" << drop_last;
    // 10 positions left for 2 ranks: 5 each; with drop_last 2 batches each, one sample dropped.
    EXPECT_EQ(c.delivered.size(), drop_last ? 8u : 10u);
  }
}

TEST(Resume, ASamplerRefusesAResumePointOutsideTheEpochList) {
  EXPECT_THROW(ResumedDistributedSampler(10, options_of(3, 0, true, false), EpochResume{0, 4, 13}),
               std::invalid_argument);
  EXPECT_THROW(ResumedDistributedSampler(10, options_of(3, 0, true, false), EpochResume{0, 0, 1}),
               std::invalid_argument);
  ResumedDistributedSampler s(10, options_of(3, 0, true, false), EpochResume{0, 4, 12});
  EXPECT_EQ(s.size(), 0);  // everything consumed
  EXPECT_TRUE(s.indices().empty());
}

// The Loader over a ResumedDistributedSampler: 4 ranks take 2 batches of an ImageFolder of 21,
// 3 new loaders (1, 2 and 3 threads) finish the epoch: every remaining sample once, with the
// pixels and label the uninterrupted loader gives that sample.
TEST(Resume, LoadersOnThreeRanksFinishAnEpochFourRanksBegan) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_test_resume_" + std::to_string(::getpid()));
  gpufeed::datasets::SyntheticOptions so;
  so.num_classes = 3;
  so.images_per_class = 7;
  so.min_size = 40;
  so.max_size = 80;
  gpufeed::datasets::write_synthetic_image_folder(root, so);
  auto ds = std::make_shared<gpufeed::datasets::ImageFolder>(root);
  ASSERT_EQ(ds->size(), 21);
  gpufeed::loader::LoaderOptions o;
  o.batch_size = 2;
  o.prefetch_depth = 2;
  o.seed = 1234;
  o.transform.rrc.size = 24;
  const int64_t epoch = 2;

  Indices consumed_samples;
  int64_t state_batches = -1;
  for (int64_t r = 0; r < 4; ++r) {
    o.num_workers = 1;
    gpufeed::loader::Loader old(ds, std::make_shared<DistributedSampler>(21, options_of(4, r, true, false)), o);
    old.start_epoch(epoch);
    for (int b = 0; b < 2; ++b) append(consumed_samples, old.next()->indices);
    if (r == 0) state_batches = old.state().batches_consumed;
  }
  const int64_t consumed = consumed_after_batches(24, 0, 4, 0, state_batches, 2, false);
  EXPECT_EQ(consumed, 16);

  Indices delivered;
  std::vector<uint8_t> expected(24 * 24 * 3);
  for (int64_t r = 0; r < 3; ++r) {
    o.num_workers = static_cast<int>(r + 1);
    auto s = std::make_shared<ResumedDistributedSampler>(21, options_of(3, r, true, false),
                                                         EpochResume{epoch, 4, consumed});
    gpufeed::loader::Loader fresh(ds, s, o);
    fresh.start_epoch(epoch);
    EXPECT_EQ(fresh.num_batches(), r < 2 ? 2 : 1);  // 8 positions: 3, 3, 2
    while (auto b = fresh.next()) {
      for (int64_t k = 0; k < b->size; ++k) {
        const int64_t index = b->indices[static_cast<size_t>(k)];
        delivered.push_back(index);
        EXPECT_EQ(b->labels[k], ds->at(index).label);
        gpufeed::loader::load_sample(*ds, index, epoch, o, expected.data());
        EXPECT_TRUE(std::equal(expected.begin(), expected.end(), b->images + k * 24 * 24 * 3))
            << "sample " << index;
      }
    }
    fresh.start_epoch(epoch + 1);  // the next epoch: DistributedSampler's for 3 ranks
    DistributedSampler plain(21, options_of(3, r, true, false));
    plain.set_epoch(epoch + 1);
    Indices next;
    while (auto b = fresh.next()) append(next, b->indices);
    EXPECT_EQ(next, plain.indices());
  }
  ASSERT_EQ(delivered.size(), 8u);
  Indices all = consumed_samples;
  append(all, delivered);
  EXPECT_EQ(sorted(all), sorted(distributed_epoch_list(21, options_of(4, 0, true, false), epoch)));
  std::error_code ec;
  fs::remove_all(root, ec);
}
