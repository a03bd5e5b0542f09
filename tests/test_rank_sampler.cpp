// The order a front deals (gpufeed/loader/rank_sampler.h): Dataset::shard_sizes() of tar shards,
// `shuffle_order` resolved (auto = exact for local data; shards on a folder is an error), and a
// Loader over packed shards in the shard-aware order: every sample once per epoch, in
// shard_aware_epoch_list's order for its rank, resumable on another world size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/datasets/mixed.h"
#include "gpufeed/datasets/shards.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/rank_sampler.h"
#include "gpufeed/log.h"
#include "gpufeed/pack/pack.h"
#include "gpufeed/sampler/mixing.h"
#include "gpufeed/sampler/resume.h"
#include "gpufeed/sampler/shard_order.h"
#include "test_util.h"

#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

namespace fs = std::filesystem;
using namespace gpufeed;
using gpufeed::test::TempDir;

namespace {

// tiny_dataset (4 classes x 8 JPEGs) packed 5 samples per shard: 7 shards of 5, 5, 5, 5, 5, 5, 2.
// With `shuffle`, the same samples written in torch.randperm's order (gpufeed pack --shuffle).
struct PackedSet {
  TempDir dir;  // one per kind: TempDir's path is the name and the pid
  fs::path folder, shards;
  pack::PackResult packed;
  explicit PackedSet(bool shuffle = false, int64_t per_shard = 5)
      : dir(shuffle ? "rank_sampler_shuffled" : "rank_sampler") {
    folder = gpufeed::test::tiny_dataset(dir.path / "src");
    const datasets::ImageFolder images(folder, {.index_cache = "off"});
    pack::PackOptions o;
    o.max_samples_per_shard = per_shard;
    o.shuffle = shuffle;
    shards = dir.path / "shards";
    packed = pack::pack_dataset(images, folder, shards, o);
  }
  std::shared_ptr<datasets::Dataset> open() const { return datasets::open_dataset(shards, {.index_cache = "off"}); }
};

loader::LoaderOptions small_loader(loader::ShuffleOrder order) {
  loader::LoaderOptions o;
  o.batch_size = 3;
  o.num_workers = 2;
  o.prefetch_depth = 2;
  o.transform = transforms::TransformOptions::imagenet(transforms::TransformOptions::Kind::kEval, 16);
  o.shuffle_order = order;
  o.shard_window = 2;
  o.shard_partitions = 4;
  return o;
}

sampler::DistributedSamplerOptions rank_of(int64_t rank, int64_t world) {
  sampler::DistributedSamplerOptions so;
  so.num_replicas = world;
  so.rank = rank;
  so.shuffle = true;
  so.seed = 11;
  return so;
}

// The indices and labels a Loader hands out for one epoch, batch by batch flattened.
std::pair<std::vector<int64_t>, std::vector<int64_t>> run_epoch(const std::shared_ptr<datasets::Dataset>& ds,
                                                                 std::shared_ptr<sampler::Sampler> s,
                                                                 const loader::LoaderOptions& o, int64_t epoch) {
  loader::Loader l(ds, std::move(s), o);
  l.start_epoch(epoch);
  std::vector<int64_t> indices, labels;
  while (auto b = l.next()) {
    indices.insert(indices.end(), b->indices.begin(), b->indices.end());
    labels.insert(labels.end(), b->labels, b->labels + b->size);
  }
  return {indices, labels};
}

// A dataset as `inner` whose reader records what it is told (what MixedDataset hands a source).
struct Recorded {
  std::vector<std::pair<uint64_t, std::vector<int64_t>>> announced;
  std::vector<int64_t> read;
  std::vector<uint64_t> forgotten;
};

class RecordingDataset : public datasets::Dataset {
 public:
  RecordingDataset(std::shared_ptr<datasets::Dataset> inner, std::shared_ptr<Recorded> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  int64_t size() const override { return inner_->size(); }
  datasets::SampleRef at(int64_t i) const override { return inner_->at(i); }
  const std::vector<std::string>& classes() const override { return inner_->classes(); }
  std::vector<int64_t> shard_sizes() const override { return inner_->shard_sizes(); }
  std::unique_ptr<datasets::SampleReader> reader(datasets::ReadOrder) const override {
    return std::make_unique<Reader>(*this);
  }

 private:
  struct Reader : datasets::SampleReader {
    explicit Reader(const RecordingDataset& d) : d(d) {}
    void announce(uint64_t tag, const std::vector<int64_t>& indices) override {
      d.log_->announced.emplace_back(tag, indices);
    }
    void forget(uint64_t tag) override { d.log_->forgotten.push_back(tag); }
    void read(uint64_t, int64_t index, decode::ByteBuffer& out) override {
      d.log_->read.push_back(index);
      datasets::read_sample(d.at(index), out);
    }
    const RecordingDataset& d;
  };
  std::shared_ptr<datasets::Dataset> inner_;
  std::shared_ptr<Recorded> log_;
};

std::vector<uint8_t> bytes_of(const datasets::SampleRef& ref) {
  std::vector<uint8_t> out;
  datasets::read_sample(ref, out);
  return out;
}

}  // namespace

TEST(ShardSizes, TarShardsCountEachShardsContiguousSamplesAndFoldersHaveNone) {
  const PackedSet set;
  ASSERT_EQ(set.packed.shards.size(), 7u);
  const auto ds = set.open();
  EXPECT_EQ(ds->shard_sizes(), (std::vector<int64_t>{5, 5, 5, 5, 5, 5, 2}));
  EXPECT_FALSE(ds->remote());
  // Shard s's samples are indices [5s, 5s + size): each one's path is that shard's file.
  const auto* tar = dynamic_cast<const datasets::TarShards*>(ds.get());
  ASSERT_NE(tar, nullptr);
  for (int64_t i = 0; i < ds->size(); ++i) EXPECT_EQ(std::string(ds->at(i).path), tar->shards()[i / 5]) << i;
  const datasets::ImageFolder folder(set.folder, {.index_cache = "off"});
  EXPECT_TRUE(folder.shard_sizes().empty());
}

TEST(ShardSizes, ContiguousShardSizesRefusesShardsOutOfOrder) {
  EXPECT_EQ(datasets::contiguous_shard_sizes({0, 0, 2, 2, 2}, 4), (std::vector<int64_t>{2, 0, 3, 0}));
  EXPECT_THROW(datasets::contiguous_shard_sizes({0, 1, 0}, 2), std::logic_error);
  EXPECT_THROW(datasets::contiguous_shard_sizes({0, 2}, 2), std::logic_error);
}

TEST(RankSampler, AutoIsExactForLocalShardsAndShardsOnAFolderIsAnError) {
  const PackedSet set;
  const auto ds = set.open();
  EXPECT_EQ(loader::resolve_shuffle_order(*ds, loader::ShuffleOrder::kAuto, "x"), loader::ShuffleOrder::kExact);
  EXPECT_EQ(loader::resolve_shuffle_order(*ds, loader::ShuffleOrder::kShards, "x"), loader::ShuffleOrder::kShards);
  const auto exact = loader::make_rank_sampler(*ds, small_loader(loader::ShuffleOrder::kAuto), rank_of(1, 2), "x");
  ASSERT_NE(dynamic_cast<sampler::ResumedDistributedSampler*>(exact.get()), nullptr);
  exact->set_epoch(3);
  sampler::DistributedSampler plain(ds->size(), rank_of(1, 2));
  plain.set_epoch(3);
  EXPECT_EQ(exact->indices(), plain.indices());
  const datasets::ImageFolder folder(set.folder, {.index_cache = "off"});
  EXPECT_EQ(loader::resolve_shuffle_order(folder, loader::ShuffleOrder::kAuto, "f"), loader::ShuffleOrder::kExact);
  try {
    loader::resolve_shuffle_order(folder, loader::ShuffleOrder::kShards, "data/train");
    FAIL() << "shards on a folder";
  } catch (const options::OptionError& e) {
    EXPECT_EQ(e.option(), "shuffle_order");
    EXPECT_NE(std::string(e.what()).find("data/train"), std::string::npos) << e.what();
  }
  EXPECT_EQ(loader::parse_shuffle_order("shards"), loader::ShuffleOrder::kShards);
  EXPECT_THROW(loader::parse_shuffle_order("exactly"), options::OptionError);
}

TEST(RankSampler, LoaderOverShardsDealsTheShardAwareListEverySampleOncePerEpoch) {
  const PackedSet set;
  const auto ds = set.open();
  const auto o = small_loader(loader::ShuffleOrder::kShards);
  const int64_t world = 3;
  std::vector<int64_t> labels_of(static_cast<size_t>(ds->size()));
  for (int64_t i = 0; i < ds->size(); ++i) labels_of[static_cast<size_t>(i)] = ds->at(i).label;
  sampler::ShardOrderOptions so;
  so.num_replicas = world;
  so.seed = 11;
  so.window = 2;
  so.partitions = 4;
  for (const int64_t epoch : {0, 1}) {
    const auto list = sampler::shard_aware_epoch_list(ds->shard_sizes(), so, epoch);
    const auto lockstep = sampler::shard_aware_lockstep_list(ds->shard_sizes(), so, epoch);
    ASSERT_EQ(list.size(), 33u);  // 32 samples padded to 11 per rank
    ASSERT_EQ(lockstep.size(), 33u);
    std::vector<int64_t> seen;
    for (int64_t r = 0; r < world; ++r) {
      auto s = loader::make_rank_sampler(*ds, o, rank_of(r, world), "shards");
      ASSERT_NE(dynamic_cast<sampler::ShardAwareSampler*>(s.get()), nullptr);
      const auto [indices, labels] = run_epoch(ds, s, o, epoch);
      EXPECT_EQ(indices, sampler::remaining_for_rank(lockstep, 0, world, r)) << "epoch " << epoch << " rank " << r;
      // Rank r reads its contiguous run of the global list, [floor(32 r / 3), floor(32 (r + 1) / 3)).
      const int64_t begin = 32 * r / world, end = 32 * (r + 1) / world;
      EXPECT_EQ(std::vector<int64_t>(indices.begin(), indices.begin() + (end - begin)),
                std::vector<int64_t>(list.begin() + begin, list.begin() + end));
      for (size_t k = 0; k < indices.size(); ++k) EXPECT_EQ(labels[k], labels_of[static_cast<size_t>(indices[k])]);
      seen.insert(seen.end(), indices.begin(), indices.end());
    }
    std::vector<int64_t> firsts(list.begin(), list.begin() + 32);  // the list without its padding
    std::sort(firsts.begin(), firsts.end());
    std::vector<int64_t> all(32);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(firsts, all);
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> expected = all;
    expected.push_back(list[0]);  // the one padding position repeats rank 0's run's start
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(seen, expected);
  }
  // Not DistributedSampler's order: the shard-aware list keeps shards together.
  sampler::DistributedSampler exact(ds->size(), rank_of(0, world));
  auto s = loader::make_rank_sampler(*ds, o, rank_of(0, world), "shards");
  EXPECT_NE(s->indices(), exact.indices());
}

TEST(RankSampler, ShardOrderResumedOnAnotherWorldSizeDeliversTheRestOnce) {
  const PackedSet set;
  const auto ds = set.open();
  const auto o = small_loader(loader::ShuffleOrder::kShards);
  sampler::ShardOrderOptions so;
  so.num_replicas = 4;
  so.seed = 11;
  so.window = 2;
  so.partitions = 4;
  const auto list = sampler::shard_aware_lockstep_list(ds->shard_sizes(), so, 2);  // 32 positions
  const int64_t consumed = 12;  // 4 ranks x one batch of 3
  std::vector<int64_t> rest;
  for (int64_t r = 0; r < 3; ++r) {
    auto s = loader::make_rank_sampler(*ds, o, rank_of(r, 3), "shards");
    s->set_resume(sampler::EpochResume{2, 4, consumed});
    const auto [indices, labels] = run_epoch(ds, s, o, 2);
    rest.insert(rest.end(), indices.begin(), indices.end());
  }
  std::vector<int64_t> expected(list.begin() + consumed, list.end());
  std::sort(rest.begin(), rest.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(rest, expected);
  EXPECT_EQ(rest.size(), 20u);
}

// Shards written class by class defeat a window of shards: class_mixing measures it on the
// dataset's labels and make_rank_sampler says so once, naming the cure; the same samples packed
// shuffled mix like the exact order, and nothing is said.
TEST(RankSampler, ClassOrderedShardsAreMeasuredAndWarnedOfAndShuffledShardsMixLikeTheExactOrder) {
  auto o = small_loader(loader::ShuffleOrder::kShards);
  o.batch_size = 4;
  o.shard_window = 1;
  const PackedSet ordered(false, 8), shuffled(true, 8);  // 4 shards: one class each, or mixed
  const auto a = ordered.open(), b = shuffled.open();
  const loader::ClassMixing m = loader::class_mixing(*a, o, rank_of(0, 1));
  const loader::ClassMixing n = loader::class_mixing(*b, o, rank_of(0, 1));
  std::printf("classes per batch of 4 (4 classes): class-ordered shards %.2f vs exact %.2f; shuffled shards %.2f vs exact %.2f\n",
              m.shards, m.exact, n.shards, n.exact);
  EXPECT_EQ(m.batches, 8);  // 32 samples
  EXPECT_EQ(n.batches, 8);
  EXPECT_DOUBLE_EQ(m.shards, 1.0);  // window 1 over shards of one class
  EXPECT_LT(m.shards, 0.5 * m.exact);
  EXPECT_GE(n.shards, 0.75 * n.exact);  // 2.38 vs 3.00 (deterministic: seeds fixed)
  EXPECT_GT(n.shards, 2 * m.shards);
  // The warning, once per sampler made, only for the class-ordered shards.
  std::ostringstream said;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(said);
  gpufeed::log()->sinks().push_back(sink);
  loader::make_rank_sampler(*b, o, rank_of(0, 1), "shuffled");
  const std::string quiet = said.str();
  loader::make_rank_sampler(*a, o, rank_of(0, 1), "ordered");
  gpufeed::log()->sinks().pop_back();
  EXPECT_EQ(quiet.find("shuffle_order shards"), std::string::npos) << quiet;
  const std::string text = said.str();
  EXPECT_NE(text.find("shuffle_order shards: a batch of 4 holds 1.0 classes"), std::string::npos) << text;
  EXPECT_NE(text.find("gpufeed pack --shuffle"), std::string::npos) << text;
}

// Several sources as one dataset (gpufeed/datasets/mixed.h): ConcatDataset's numbering, each
// sample its source's (path, label, bytes), shard sizes concatenated only when every source has
// shards, and a reader that tells each source's reader its own part of an announced order.
TEST(MixedDataset, NumbersSourcesAsConcatDatasetAndSplitsAnnouncedOrdersPerSource) {
  const PackedSet set;
  const auto shards = set.open();
  const auto folder = std::make_shared<datasets::ImageFolder>(set.folder, datasets::ImageFolderOptions{.index_cache = "off"});
  const datasets::MixedDataset mixed({shards, folder}, {"shards", "folder"});
  ASSERT_EQ(mixed.size(), 64);
  EXPECT_EQ(mixed.offsets(), (std::vector<int64_t>{0, 32, 64}));
  for (int64_t i = 0; i < 64; ++i) {
    const auto want = i < 32 ? shards->at(i) : folder->at(i - 32);
    EXPECT_EQ(mixed.at(i).path, want.path) << i;
    EXPECT_EQ(mixed.at(i).label, want.label) << i;
    EXPECT_EQ(mixed.at(i).offset, want.offset) << i;
    EXPECT_EQ(mixed.source_of(i), i < 32 ? 0 : 1);
  }
  EXPECT_THROW(mixed.at(64), std::out_of_range);
  EXPECT_THROW(mixed.source_of(-1), std::out_of_range);
  EXPECT_EQ(mixed.classes(), shards->classes());  // the names differ ("0" vs "class_000"): source 0's
  EXPECT_TRUE(mixed.shard_sizes().empty());  // the folder has none
  EXPECT_EQ(mixed.source_shard_sizes(), (std::vector<std::vector<int64_t>>{{5, 5, 5, 5, 5, 5, 2}, {}}));
  EXPECT_FALSE(mixed.remote());
  EXPECT_EQ(mixed.reader(), nullptr);  // no source reads through a reader of its own
  const datasets::MixedDataset two({shards, shards}, {"a", "b"});
  EXPECT_EQ(two.shard_sizes(), (std::vector<int64_t>{5, 5, 5, 5, 5, 5, 2, 5, 5, 5, 5, 5, 5, 2}));
  decode::ByteBuffer got;
  two.read(40, two.at(40), got);
  const auto want = bytes_of(shards->at(8));
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got.data(), got.data() + got.size()));

  const auto log = std::make_shared<Recorded>();
  const datasets::MixedDataset recorded({folder, std::make_shared<RecordingDataset>(shards, log)}, {"f", "r"});
  const auto reader = recorded.reader(datasets::ReadOrder::kShardRuns);
  ASSERT_NE(reader, nullptr);
  reader->announce(7, {40, 3, 33, 63, 31, 32});
  reader->announce(8, {0, 1});  // none of the recorded source's: nothing announced to it
  ASSERT_EQ(log->announced.size(), 1u);
  EXPECT_EQ(log->announced[0], (std::pair<uint64_t, std::vector<int64_t>>{7, {8, 1, 31, 0}}));
  reader->read(7, 40, got);  // the recorded source's sample 8, through its reader
  const auto eighth = bytes_of(shards->at(8));
  EXPECT_TRUE(std::equal(eighth.begin(), eighth.end(), got.data(), got.data() + got.size()));
  reader->read(7, 3, got);  // the folder's sample 3, read directly
  const auto third = bytes_of(folder->at(3));
  EXPECT_TRUE(std::equal(third.begin(), third.end(), got.data(), got.data() + got.size()));
  EXPECT_EQ(log->read, (std::vector<int64_t>{8}));
  reader->forget(7);
  EXPECT_EQ(log->forgotten, (std::vector<uint64_t>{7}));

  EXPECT_THROW(datasets::MixedDataset({}, {}), std::invalid_argument);
  EXPECT_THROW(datasets::MixedDataset({shards}, {"a", "b"}), std::invalid_argument);
  EXPECT_THROW(datasets::MixedDataset({shards, nullptr}, {"a", "b"}), std::invalid_argument);
}

// Mixed sources get the MixingSampler (its list is mixing_epoch_list's, the same for every world
// size), `auto` is exact for local sources and shards is accepted with a folder among them; a Loader
// hands out exactly the sampler's indices with each source's labels.
TEST(RankSampler, MixedSourcesAreDealtTheMixingListAndTheLoaderReadsEachSourcesSamples) {
  const PackedSet set;
  const auto shards = set.open();
  const auto folder = std::make_shared<datasets::ImageFolder>(set.folder, datasets::ImageFolderOptions{.index_cache = "off"});
  const auto mixed = std::make_shared<datasets::MixedDataset>(std::vector<std::shared_ptr<datasets::Dataset>>{shards, folder},
                                                              std::vector<std::string>{"shards", "folder"});
  EXPECT_EQ(loader::resolve_shuffle_order(*mixed, loader::ShuffleOrder::kAuto, "m"), loader::ShuffleOrder::kExact);
  EXPECT_EQ(loader::resolve_shuffle_order(*mixed, loader::ShuffleOrder::kShards, "m"), loader::ShuffleOrder::kShards);
  const loader::Mixing mixing{.weights = {1, 3}, .epoch_size = 26};
  EXPECT_EQ(loader::epoch_samples(*mixed, mixing), 26);
  EXPECT_EQ(loader::epoch_samples(*mixed, {}), 64);
  EXPECT_EQ(loader::epoch_samples(*shards, {}), 32);
  sampler::MixingOptions mo;
  mo.seed = 11;
  mo.window = 2;
  mo.partitions = 4;
  mo.weights = {1, 3};
  mo.epoch_size = 26;
  const std::vector<sampler::SourceShards> sources{{5, 5, 5, 5, 5, 5, 2}, sampler::one_shard_per_sample(32)};
  for (const auto order : {loader::ShuffleOrder::kExact, loader::ShuffleOrder::kShards}) {
    mo.exact_order = order == loader::ShuffleOrder::kExact;
    const auto o = small_loader(order);
    for (const int64_t epoch : {0, 1}) {
      const auto list = sampler::mixing_epoch_list(sources, mo, epoch);
      ASSERT_EQ(list.size(), 26u);
      std::vector<int64_t> seen;
      for (int64_t r = 0; r < 2; ++r) {
        auto s = loader::make_rank_sampler(*mixed, o, rank_of(r, 2), "mixed", mixing);
        auto* m = dynamic_cast<sampler::MixingSampler*>(s.get());
        ASSERT_NE(m, nullptr);
        EXPECT_EQ(m->options().exact_order, mo.exact_order);
        const auto [indices, labels] = run_epoch(mixed, s, o, epoch);
        EXPECT_EQ(indices, std::vector<int64_t>(list.begin() + 13 * r, list.begin() + 13 * (r + 1)));
        for (size_t k = 0; k < indices.size(); ++k) EXPECT_EQ(labels[k], mixed->at(indices[k]).label);
        seen.insert(seen.end(), indices.begin(), indices.end());
      }
      EXPECT_EQ(seen, list);
      const int64_t from_shards = std::count_if(seen.begin(), seen.end(), [](int64_t i) { return i < 32; });
      EXPECT_EQ(from_shards, 7) << "26 / 4 = 6.5: the tie goes to the lower source";
    }
  }
  // One dataset with epoch_size alone is mixed too (resampled); a refused weight names itself.
  auto one = loader::make_rank_sampler(*shards, small_loader(loader::ShuffleOrder::kAuto), rank_of(0, 1), "s",
                                       loader::Mixing{.weights = {}, .epoch_size = 12});
  ASSERT_NE(dynamic_cast<sampler::MixingSampler*>(one.get()), nullptr);
  EXPECT_EQ(one->size(), 12);
  try {
    loader::make_rank_sampler(*mixed, small_loader(loader::ShuffleOrder::kAuto), rank_of(0, 1), "m",
                              loader::Mixing{.weights = {1}, .epoch_size = std::nullopt});
    FAIL() << "one weight for two sources";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("weights"), std::string::npos) << e.what();
  }
}
