// Bad input, faults and shutdown at the loader level: the error policies (raise, skip, max_skips)
// give the same result for every thread count; destroying a loader mid-epoch, an exception
// mid-batch, a slow consumer and a single slot neither hang nor leak; files deleted or made
// unreadable mid-epoch are errors naming them; memory stays flat over epochs and over a thousand
// passes of every bad file; and the loader over every bug case (generated here, and the shared
// files when ../shared is mounted) skips exactly what EXPECTED.md implies.
//
// Nothing here measures time: where promptness matters, the test counts the work done instead.

#include <dirent.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bugkinds.h"
#include "golden.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/decode/error.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/transforms/transform.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
namespace kinds = gpufeed::test;
using gpufeed::decode::DecodeError;
using gpufeed::decode::ErrorKind;
using gpufeed::sampler::DistributedSampler;
using gpufeed::sampler::DistributedSamplerOptions;
using gpufeed::sampler::SequentialSampler;
using namespace gpufeed::loader;
using namespace gpufeed::datasets;
using namespace gpufeed::transforms;
using Bytes = std::vector<uint8_t>;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

/// A fresh folder under the temp dir, removed with everything in it when the test ends.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() /
              ("gpufeed_robust_" + tag + "_" + std::to_string(::getpid()) + "_" +
               std::to_string(counter_++))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void write_file(const fs::path& p, const Bytes& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

/// A good JPEG, different for each seed.
Bytes good_jpeg(int seed, int w = 48, int h = 40) {
  kinds::JpegSpec s;
  s.width = w + seed % 7;
  s.height = h + seed % 5;
  return kinds::make_jpeg(s, kinds::pattern(s.width, s.height, 3, static_cast<uint32_t>(seed)));
}

/// A file and its label, as the tests write them.
struct FileSample {
  fs::path path;
  int64_t label = 0;
};

/// A dataset over an explicit list of files.
class ListDataset : public SampleList {
 public:
  ListDataset(const std::vector<FileSample>& samples, int num_classes) {
    for (const FileSample& f : samples) table_.add(f.path.native(), f.label);
    for (int c = 0; c < num_classes; ++c) classes_.push_back(std::to_string(c));
  }
};

/// Counts at() calls: every sample a worker starts (and every skip replacement it tries).
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(std::shared_ptr<const Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  SampleRef at(int64_t i) const override {
    calls.fetch_add(1);
    return inner_->at(i);
  }
  const std::vector<std::string>& classes() const override { return inner_->classes(); }
  mutable std::atomic<int64_t> calls{0};

 private:
  std::shared_ptr<const Dataset> inner_;
};

using gpufeed::test::CountingAllocator;

/// What a consumer saw of one epoch.
struct Epoch {
  std::vector<Bytes> images;
  std::vector<std::vector<int64_t>> labels, indices;
  std::vector<SkippedSample> skipped;  // over all batches, in delivery order
  EpochSummary summary;
};

Epoch run_epoch(Loader& loader, int64_t epoch) {
  Epoch e;
  loader.start_epoch(epoch);
  while (auto b = loader.next()) {
    e.images.emplace_back(b->images, b->images + b->image_bytes());
    e.labels.emplace_back(b->labels, b->labels + b->size);
    e.indices.push_back(b->indices);
    e.skipped.insert(e.skipped.end(), b->skipped.begin(), b->skipped.end());
  }
  e.summary = loader.epoch_summary();
  return e;
}

bool same_skips(const std::vector<SkippedSample>& a, const std::vector<SkippedSample>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].index != b[i].index || a[i].replaced_by != b[i].replaced_by ||
        a[i].position != b[i].position || a[i].path != b[i].path || a[i].kind != b[i].kind ||
        a[i].reason != b[i].reason)
      return false;
  }
  return true;
}

LoaderOptions options(int workers, int64_t batch = 4, int depth = 2) {
  LoaderOptions o;
  o.batch_size = batch;
  o.num_workers = workers;
  o.prefetch_depth = depth;
  o.seed = 17;
  o.transform.rrc.size = 24;
  return o;
}

/// The sample load_sample() makes: the reference the loader's slot must equal byte for byte.
Bytes reference_sample(const Dataset& ds, int64_t index, int64_t epoch, const LoaderOptions& o) {
  const int s = o.transform.output_size();
  Bytes out(static_cast<size_t>(s) * s * 3);
  load_sample(ds, index, epoch, o, out.data());
  return out;
}

Bytes sample_of(const Epoch& e, int64_t position, int64_t batch_size, int side) {
  const size_t bytes = static_cast<size_t>(side) * side * 3;
  const Bytes& batch = e.images[static_cast<size_t>(position / batch_size)];
  const auto at = static_cast<ptrdiff_t>(bytes * static_cast<size_t>(position % batch_size));
  return Bytes(batch.begin() + at, batch.begin() + at + static_cast<ptrdiff_t>(bytes));
}

/// prefix + number + suffix (std::string's operator+ trips GCC 12's -Wrestrict false positive
/// in some inlined spots).
std::string fmt_name(const char* prefix, int number, const char* suffix) {
  std::string s(prefix);
  s.append(std::to_string(number)).append(suffix);
  return s;
}

int thread_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

int64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

/// 24 files in sequential order; positions 3, 4 (two bad in a row), 10 and 23 (the last: its
/// replacement wraps around to position 0) fail as truncated, empty, corrupt and missing.
struct MixedFolder {
  TempDir dir{"mixed"};
  std::shared_ptr<ListDataset> dataset;
  std::map<int64_t, std::string> bad_kind;  // position -> expected SkippedSample::kind

  MixedFolder() {
    std::vector<FileSample> samples;
    for (int i = 0; i < 24; ++i) {
      fs::path p = dir.path() / ("img_" + std::to_string(100 + i) + ".jpg");
      Bytes bytes = good_jpeg(i);
      // Damage every crop sees: a crop that stops above damage low in the image never reads it.
      if (i == 3) {
        bytes.resize(kinds::jpeg_scan_data(bytes).first + 10);  // cut at the scan's start
        bad_kind[i] = "truncated";
      } else if (i == 4) {
        bytes.clear();
        bad_kind[i] = "empty";
      } else if (i == 10) {
        const size_t sof = kinds::find_jpeg_marker(bytes, 0xC0);
        bytes[sof + 7] = bytes[sof + 8] = 0;  // width 0 in the frame header
        bad_kind[i] = "corrupt";
      }
      if (i == 23) {
        bad_kind[i] = "io";  // never written
      } else {
        write_file(p, bytes);
      }
      samples.push_back({p, i % 3});
    }
    dataset = std::make_shared<ListDataset>(std::move(samples), 3);
  }
};

// ================================================================================================
// Error policies
// ================================================================================================

TEST(ErrorPolicy, SkipReplacesEachBadSampleByTheNextGoodOneForAnyThreadCount) {
  MixedFolder folder;
  const auto& ds = folder.dataset;
  std::optional<Epoch> first;
  for (int workers : {1, 2, 4}) {
    for (int depth : {1, 3}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + " depth " + std::to_string(depth));
      LoaderOptions o = options(workers, 4, depth);
      o.error_policy = ErrorPolicy::kSkip;
      o.prefetch_next_epoch = false;  // stats() counts this epoch's skips alone
      Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
      const Epoch e = run_epoch(loader, 1);
      ASSERT_EQ(e.images.size(), 6u);
      // Positions, kinds and replacements: 3 and 4 both take 5 (4 is bad too); 23 wraps to 0.
      const std::map<int64_t, int64_t> replaced_by = {{3, 5}, {4, 5}, {10, 11}, {23, 0}};
      ASSERT_EQ(e.skipped.size(), 4u);
      for (const SkippedSample& s : e.skipped) {
        EXPECT_EQ(s.index, s.position);  // sequential sampler
        EXPECT_EQ(s.kind, folder.bad_kind.at(s.position)) << s.path;
        EXPECT_EQ(s.replaced_by, replaced_by.at(s.position));
        EXPECT_EQ(s.path, std::string(ds->at(s.index).path));
        EXPECT_FALSE(s.reason.empty());
        // The slot holds the replacement's own sample and label.
        EXPECT_EQ(sample_of(e, s.position, 4, 24), reference_sample(*ds, s.replaced_by, 1, o));
        EXPECT_EQ(e.labels[static_cast<size_t>(s.position / 4)][static_cast<size_t>(s.position % 4)],
                  ds->at(s.replaced_by).label);
      }
      for (int64_t p = 0; p < 24; ++p)
        if (!folder.bad_kind.count(p)) {
          EXPECT_EQ(sample_of(e, p, 4, 24), reference_sample(*ds, p, 1, o));
        }
      EXPECT_EQ(e.summary.skipped, 4);
      EXPECT_EQ(e.summary.batches, 6);
      EXPECT_EQ(e.summary.samples, 24);
      EXPECT_TRUE(e.summary.complete);
      EXPECT_EQ(e.summary.skipped_by_kind,
                (std::map<std::string, int64_t>{{"corrupt", 1}, {"empty", 1}, {"io", 1}, {"truncated", 1}}));
      EXPECT_TRUE(same_skips(e.summary.skips, e.skipped));
      EXPECT_EQ(loader.epoch_skips(), 4);
      EXPECT_EQ(loader.stats().skipped, 4);
      if (!first) {
        first = e;
      } else {
        EXPECT_EQ(e.images, first->images);
        EXPECT_EQ(e.labels, first->labels);
        EXPECT_TRUE(same_skips(e.skipped, first->skipped));
      }
    }
  }
  // The summary's text names every skipped file.
  const std::string text = first->summary.to_string();
  EXPECT_NE(text.find("4 skipped (corrupt 1, empty 1, io 1, truncated 1)"), std::string::npos) << text;
  for (const SkippedSample& s : first->skipped) EXPECT_NE(text.find(s.path), std::string::npos);
}

TEST(ErrorPolicy, SkipIsDeterministicUnderAShuffledDistributedSampler) {
  MixedFolder folder;
  const auto& ds = folder.dataset;
  DistributedSamplerOptions so;
  so.num_replicas = 2;
  so.rank = 1;
  so.seed = 9;
  std::optional<Epoch> first;
  for (int workers : {1, 3}) {
    LoaderOptions o = options(workers, 3, 2);
    o.error_policy = ErrorPolicy::kSkip;
    auto sampler = std::make_shared<DistributedSampler>(ds->size(), so);
    Loader loader(ds, sampler, o);
    const Epoch e = run_epoch(loader, 2);
    sampler->set_epoch(2);
    const std::vector<int64_t> order = sampler->indices();
    // Every bad file of this rank's shard is skipped once, replaced by a later sample of the shard.
    int64_t bad_in_shard = 0;
    for (int64_t i : order) bad_in_shard += folder.bad_kind.count(i);
    EXPECT_EQ(e.summary.skipped, bad_in_shard);
    for (const SkippedSample& s : e.skipped) {
      EXPECT_EQ(order[static_cast<size_t>(s.position)], s.index);
      EXPECT_NE(std::find(order.begin(), order.end(), s.replaced_by), order.end());
      EXPECT_EQ(folder.bad_kind.count(s.replaced_by), 0u);
    }
    if (!first) {
      first = e;
    } else {
      EXPECT_EQ(e.images, first->images);
      EXPECT_TRUE(same_skips(e.skipped, first->skipped));
    }
  }
}

TEST(ErrorPolicy, MaxSkipsStopsTheEpochAtTheSameBatchForAnyThreadCount) {
  MixedFolder folder;  // skips at positions 3 | 4 | 10 | 23 -> batches 0, 1, 2, 5
  const auto& ds = folder.dataset;
  for (int workers : {1, 4}) {
    for (const auto& [max_skips, failing_batch] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}, {2, 2}, {3, 5}}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + " max_skips " + std::to_string(max_skips));
      LoaderOptions o = options(workers, 4, 3);
      o.error_policy = ErrorPolicy::kSkip;
      o.max_skips = max_skips;
      Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
      loader.start_epoch(0);
      int64_t delivered = 0;
      try {
        while (auto b = loader.next()) ++delivered;
        FAIL() << "expected SkipLimitExceeded";
      } catch (const SkipLimitExceeded& e) {
        EXPECT_EQ(delivered, failing_batch);
        EXPECT_EQ(e.max_skips(), max_skips);
        EXPECT_EQ(e.summary().skipped, max_skips + 1);
        EXPECT_EQ(e.summary().batches, failing_batch + 1);
        EXPECT_FALSE(e.summary().complete);
        EXPECT_NE(std::string(e.what()).find("more than max_skips=" + std::to_string(max_skips)),
                  std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find(e.summary().skips.back().path), std::string::npos);
      }
      // The epoch is over; the loader starts the next one normally.
      EXPECT_FALSE(loader.next().has_value());
      EXPECT_FALSE(loader.epoch_summary().complete);
      loader.start_epoch(1);
      int64_t batches = 0;
      try {
        while (auto b = loader.next()) ++batches;
      } catch (const SkipLimitExceeded&) {
      }
      EXPECT_EQ(batches, failing_batch);
    }
  }
  // Exactly at the limit is fine.
  LoaderOptions o = options(2);
  o.error_policy = ErrorPolicy::kSkip;
  o.max_skips = 4;
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
  const Epoch e = run_epoch(loader, 0);
  EXPECT_EQ(e.summary.skipped, 4);
  EXPECT_TRUE(e.summary.complete);
}

TEST(ErrorPolicy, SkipFailsNamingTheFileWhenNoReplacementLoads) {
  TempDir dir("allbad");
  std::vector<FileSample> samples;
  for (int i = 0; i < 5; ++i) {
    samples.push_back({dir.path() / ("bad_" + std::to_string(i) + ".jpg"), 0});
    write_file(samples.back().path, Bytes{0xFF, 0xD8, 0xFF});
  }
  auto ds = std::make_shared<ListDataset>(samples, 1);
  LoaderOptions o = options(2, 5, 1);
  o.error_policy = ErrorPolicy::kSkip;
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
  loader.start_epoch(0);
  try {
    loader.next();
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no replacement loads for " + samples[0].path.string()),
              std::string::npos)
        << e.what();
  }
}

TEST(ErrorPolicy, RaiseThrowsTheBatchsFirstBadFileInSamplerOrderThenContinues) {
  TempDir dir("raise");
  std::vector<FileSample> samples;
  for (int i = 0; i < 16; ++i) {
    samples.push_back({dir.path() / ("img_" + std::to_string(10 + i) + ".jpg"), i % 2});
    Bytes bytes = good_jpeg(i);
    if (i == 5) bytes.resize(40);   // truncated header
    if (i == 6) bytes.clear();      // empty
    if (i == 7) bytes.resize(100);  // truncated
    write_file(samples.back().path, bytes);
  }
  auto ds = std::make_shared<ListDataset>(samples, 2);
  for (int round = 0; round < 8; ++round) {
    auto alloc = std::make_shared<CountingAllocator>();
    {
      Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), options(4, 4, 3), alloc);
      loader.start_epoch(0);
      auto b0 = loader.next();
      ASSERT_TRUE(b0);
      try {
        loader.next();  // batch 1 holds positions 4..7: 5, 6 and 7 fail; 5 comes first
        FAIL() << "expected a DecodeError";
      } catch (const DecodeError& e) {
        EXPECT_EQ(e.source(), samples[5].path.string());
        EXPECT_EQ(e.kind(), ErrorKind::kTruncated);
        EXPECT_NE(std::string(e.what()).find("img_15.jpg"), std::string::npos);
      }
      auto b2 = loader.next();  // the loader goes on with the following batch
      ASSERT_TRUE(b2);
      EXPECT_EQ(b2->batch_index, 2);
      EXPECT_EQ(loader.state().batches_consumed, 3);
      // Destroyed with batch 3 in flight and two batches held: returns, frees the rest.
    }
    EXPECT_EQ(alloc->live.load(), 0);
  }
}

// ================================================================================================
// Shutdown
// ================================================================================================

/// 320 samples over 16 files.
std::shared_ptr<ListDataset> repeated_dataset(const TempDir& dir, int files = 16, int samples = 320) {
  std::vector<fs::path> paths;
  for (int i = 0; i < files; ++i) {
    paths.push_back(dir.path() / ("f" + std::to_string(i) + ".jpg"));
    write_file(paths.back(), good_jpeg(i, 64, 48));
  }
  std::vector<FileSample> refs;
  for (int i = 0; i < samples; ++i) refs.push_back({paths[static_cast<size_t>(i % files)], i % 4});
  return std::make_shared<ListDataset>(refs, 4);
}

TEST(Shutdown, DestroyingMidEpochCancelsPendingSamplesAndFreesEverySlot) {
  TempDir dir("shutdown");
  auto files = repeated_dataset(dir);
  auto counting = std::make_shared<CountingDataset>(files);
  auto alloc = std::make_shared<CountingAllocator>();
  {
    Loader loader(counting, std::make_shared<SequentialSampler>(counting->size()),
                  options(2, 8, 2), alloc);
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next());
  }
  EXPECT_EQ(alloc->live.load(), 0);
  // Slots bound the work: the first batch, the one in flight, and the one that took the first's
  // slot when it was released; never the 40 batches of the epoch.
  EXPECT_LE(counting->calls.load(), 3 * 8);
  EXPECT_GE(counting->calls.load(), 8);
}

TEST(Shutdown, RepeatedStartAndDestroyLeaksNoThreadAndNoSlot) {
  TempDir dir("cycles");
  auto ds = repeated_dataset(dir);
  auto alloc = std::make_shared<CountingAllocator>();
  const int before = thread_count();
  int after_first = 0;
  for (int cycle = 0; cycle < 20; ++cycle) {
    {
      Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), options(2, 8, 2), alloc);
      loader.start_epoch(cycle);
      if (cycle % 2) loader.next();  // destroyed with and without a batch consumed
      loader.start_epoch(cycle + 1);  // restarting mid-epoch drains the previous one first
    }
    EXPECT_EQ(alloc->live.load(), 0) << "cycle " << cycle;
    if (cycle == 0) after_first = thread_count();
  }
  // oneTBB keeps its worker threads for the process; loaders add none of their own.
  EXPECT_LE(thread_count(), after_first) << "before any loader: " << before;
  EXPECT_EQ(alloc->total.load(), 40);
}

TEST(Shutdown, DestroyingWhileTheConsumerHoldsEverySlotReturns) {
  TempDir dir("held");
  auto ds = repeated_dataset(dir);
  auto alloc = std::make_shared<CountingAllocator>();
  std::optional<Batch> a, b;
  {
    Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), options(2, 8, 2), alloc);
    loader.start_epoch(0);
    a = loader.next();
    b = loader.next();
    ASSERT_TRUE(a && b);
  }
  EXPECT_EQ(alloc->live.load(), 2);  // the held batches keep their memory
  EXPECT_EQ(a->indices.front(), 0);
  EXPECT_EQ(b->indices.front(), 8);
  a.reset();
  b.reset();
  EXPECT_EQ(alloc->live.load(), 0);
}

TEST(Shutdown, ExceptionMidBatchThenDestroyIsClean) {
  TempDir dir("midbatch");
  auto files = repeated_dataset(dir);
  std::vector<FileSample> refs;
  for (int64_t i = 0; i < files->size(); ++i) refs.push_back({fs::path(files->at(i).path), files->at(i).label});
  refs[13].path = dir.path() / "missing.jpg";  // batch 1 of 8
  auto ds = std::make_shared<ListDataset>(refs, 4);
  auto alloc = std::make_shared<CountingAllocator>();
  for (int depth : {1, 2, 4}) {
    {
      Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), options(3, 8, depth), alloc);
      loader.start_epoch(0);
      ASSERT_TRUE(loader.next());
      try {
        loader.next();
        FAIL() << "expected an io error";
      } catch (const DecodeError& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kIo);
        EXPECT_EQ(e.source(), refs[13].path.string());
      }
    }
    EXPECT_EQ(alloc->live.load(), 0) << "depth " << depth;
  }
}

TEST(Shutdown, SlowConsumerAndASingleSlotGiveTheSameBatchesInBoundedMemory) {
  TempDir dir("slow");
  auto ds = repeated_dataset(dir, 16, 96);
  Loader fast(ds, std::make_shared<SequentialSampler>(ds->size()), options(2, 8, 3));
  const Epoch reference = run_epoch(fast, 3);
  for (int depth : {1, 3}) {
    auto alloc = std::make_shared<CountingAllocator>();
    Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), options(2, 8, depth), alloc);
    loader.start_epoch(3);
    std::vector<Bytes> images;
    uint64_t work = 0;
    while (auto b = loader.next()) {
      // A slow consumer: a lot of work per batch while the workers run ahead and stop.
      for (int pass = 0; pass < 200; ++pass)
        for (int64_t k = 0; k < b->image_bytes(); k += 7) work += b->images[k] ^ static_cast<uint8_t>(pass);
      images.emplace_back(b->images, b->images + b->image_bytes());
      EXPECT_LE(alloc->live.load(), depth);
    }
    EXPECT_EQ(images, reference.images) << "depth " << depth;
    EXPECT_EQ(alloc->total.load(), depth);  // allocated once, up front
    EXPECT_GT(work, 0u);
  }
}

// ================================================================================================
// Files that change under a run
// ================================================================================================

/// Makes `p` unreadable: chmod 000 for an ordinary user; root reads anything, so for root the
/// file is replaced by a folder of the same name (open succeeds, read fails).
std::string make_unreadable(const fs::path& p) {
  if (::geteuid() != 0) {
    fs::permissions(p, fs::perms::none);
    return "permission denied";
  }
  fs::remove(p);
  fs::create_directory(p);
  return "is a directory";
}

TEST(ChangingFiles, DeletedUnreadableOrFifoMidEpochIsAnIoErrorNamingTheFile) {
  for (const ErrorPolicy policy : {ErrorPolicy::kRaise, ErrorPolicy::kSkip}) {
    TempDir dir("changing");
    auto ds = repeated_dataset(dir, 40, 40);
    LoaderOptions o = options(2, 4, 2);
    o.error_policy = policy;
    Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
    loader.start_epoch(0);
    auto b0 = loader.next();  // holds one slot; batch 1 is in flight; batch 2+ not started
    ASSERT_TRUE(b0);
    const fs::path deleted = ds->at(20).path, unreadable = ds->at(25).path, fifo = ds->at(30).path;
    fs::remove(deleted);
    const std::string how = make_unreadable(unreadable);
    fs::remove(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);  // would block a plain open() forever
    b0.reset();
    std::vector<std::string> failed;
    for (;;) {
      try {
        auto b = loader.next();
        if (!b) break;
        for (const SkippedSample& s : b->skipped) {
          EXPECT_EQ(s.kind, "io") << s.path << ": " << s.reason;
          failed.push_back(s.path);
        }
      } catch (const DecodeError& e) {
        EXPECT_EQ(policy, ErrorPolicy::kRaise);
        EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
        failed.push_back(e.source());
      }
    }
    EXPECT_EQ(failed, (std::vector<std::string>{deleted.string(), unreadable.string(), fifo.string()}))
        << (policy == ErrorPolicy::kRaise ? "raise" : "skip") << ", unreadable: " << how;
    if (policy == ErrorPolicy::kSkip) {
      EXPECT_EQ(loader.epoch_summary().skipped_by_kind, (std::map<std::string, int64_t>{{"io", 3}}));
    }
  }
}

// ================================================================================================
// Memory
// ================================================================================================

TEST(Memory, ResidentSizeAfterThreeEpochsIsWithinFivePercentOfAfterOne) {
  if (kSanitized) GTEST_SKIP() << "sanitizer quarantine and shadow memory make RSS meaningless";
  TempDir dir("rss");
  std::vector<FileSample> refs;
  for (int i = 0; i < 64; ++i) {
    refs.push_back({dir.path() / fmt_name("m", i, ".jpg"), i % 4});
    write_file(refs.back().path, good_jpeg(i, 200 + i, 150));
  }
  auto ds = std::make_shared<ListDataset>(refs, 4);
  LoaderOptions o = options(2, 16, 3);
  o.transform.rrc.size = 96;
  o.error_policy = ErrorPolicy::kSkip;
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
  std::vector<int64_t> rss;
  for (int epoch = 0; epoch < 3; ++epoch) {
    loader.start_epoch(epoch);
    while (auto b = loader.next()) {
    }
    ::malloc_trim(0);
    rss.push_back(rss_bytes());
  }
  EXPECT_LE(std::abs(rss[2] - rss[0]), rss[0] / 20)
      << "RSS after epochs 1, 2, 3: " << rss[0] << ", " << rss[1] << ", " << rss[2];
}

// The heap in use (malloc's uordblks). mallinfo2 is glibc 2.33's; a build for an older glibc floor
// (cmake/toolchains/zig.cmake: 2.28) has mallinfo, whose int fields hold this test's heap.
size_t heap_in_use() {
#if __GLIBC_PREREQ(2, 33)
  return ::mallinfo2().uordblks;
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // newer headers: "use mallinfo2"
  return static_cast<unsigned>(::mallinfo().uordblks);
#pragma GCC diagnostic pop
#endif
}

TEST(Memory, EveryBadFileDecodedAThousandTimesLeavesTheHeapAsItWas) {
  // Under LSan (the asan preset) a leak fails the run at exit; here, in every build, the bytes
  // malloc holds must not grow with the number of passes.
  std::vector<Bytes> bad;
  for (const auto& v : kinds::make_kind_variants())
    if (v.expect.error) bad.push_back(v.bytes);
  for (const auto& v : kinds::make_whole_image_variants())
    if (v.expect.error) bad.push_back(v.bytes);
  const fs::path shared = gpufeed::test::shared_dir();
  if (!shared.empty()) {
    for (const std::string& kind : kinds::bug_kinds()) {
      const fs::path f = shared / "bugcases" / "files" / kind;
      if (kinds::expected_outcome(kind).error && fs::exists(f)) {
        Bytes b;
        gpufeed::decode::read_file(f, b);
        bad.push_back(std::move(b));
      }
    }
  }
  ASSERT_GE(bad.size(), 20u);
  gpufeed::decode::Decoder decoder;
  gpufeed::decode::ImageBuffer out;
  int64_t failures = 0;
  const auto pass = [&](int times) {
    for (int t = 0; t < times; ++t) {
      for (const Bytes& b : bad) {
        try {
          decoder.decode(b, "bad", {}, out);
        } catch (const DecodeError&) {
          ++failures;
        }
      }
    }
  };
  pass(10);  // warm up: per-decoder scratch reaches its size
  const size_t heap_before = heap_in_use();
  pass(990);
  const size_t heap_after = heap_in_use();
  EXPECT_EQ(failures, static_cast<int64_t>(bad.size()) * 1000);
  // A leak of even 16 bytes per failing decode would show as ~bad.size() * 16 KB here.
  EXPECT_LE(heap_after, heap_before + 4096) << "before " << heap_before << " after " << heap_after;
}

// ================================================================================================
// Transforms on the extreme kinds
// ================================================================================================

TEST(Transforms, OnePixelAndExtremeAspectImagesFillTheOutputAsTorchvisionPlans) {
  TempDir dir("extreme");
  kinds::JpegSpec one;
  one.width = one.height = 1;
  one.subsampling = gpufeed::decode::Subsampling::k444;
  one.quality = 100;
  kinds::JpegSpec wide;
  wide.width = 30000;
  wide.height = 2;
  kinds::JpegSpec tall;
  tall.width = 2;
  tall.height = 20000;
  const std::vector<FileSample> refs = {{dir.path() / "one.jpg", 0}, {dir.path() / "wide.jpg", 0},
                                       {dir.path() / "tall.jpg", 0}};
  write_file(refs[0].path, kinds::make_jpeg(one, Bytes{200, 100, 50}));
  write_file(refs[1].path, kinds::make_jpeg(wide, kinds::pattern(30000, 2, 3)));
  write_file(refs[2].path, kinds::make_jpeg(tall, kinds::pattern(2, 20000, 3)));
  ListDataset ds(refs, 1);
  // RandomResizedCrop never finds a box inside 30000x2 or 2x20000 in 10 attempts and falls back
  // to the central crop clamped to the ratio range, as torchvision's get_params does.
  EXPECT_EQ(plan_sample({}, 30000, 2, 1, 0, 1).box, (CropRect{14998, 0, 3, 2}));
  EXPECT_EQ(plan_sample({}, 2, 20000, 1, 0, 2).box, (CropRect{0, 9998, 2, 3}));
  for (const auto kind : {TransformOptions::Kind::kTrain, TransformOptions::Kind::kEval}) {
    LoaderOptions o;
    o.transform.kind = kind;
    const int s = o.transform.output_size();
    for (int64_t i = 0; i < 3; ++i) {
      SCOPED_TRACE("sample " + std::to_string(i) + (kind == TransformOptions::Kind::kTrain ? " train" : " eval"));
      const Bytes out = reference_sample(ds, i, 0, o);
      ASSERT_EQ(out.size(), static_cast<size_t>(s) * s * 3);
      if (i == 0) {
        // One pixel upscaled: every output pixel is that pixel.
        gpufeed::decode::ImageBuffer px;
        Bytes bytes;
        gpufeed::decode::read_file(refs[0].path, bytes);
        gpufeed::decode::Decoder().decode(bytes, "one", {}, px);
        for (size_t k = 0; k < out.size(); k += 3) {
          ASSERT_EQ(out[k], px.pixels[0]);
          ASSERT_EQ(out[k + 1], px.pixels[1]);
          ASSERT_EQ(out[k + 2], px.pixels[2]);
        }
      }
    }
  }
}

// ================================================================================================
// Acceptance: the loader over every kind of bug case mixed with good images
// ================================================================================================

/// Runs the loader with skip over `ds` and checks the epoch against `expected_errors` (file name
/// -> outcome) and against load_sample() for every delivered sample.
void check_skip_epoch(const std::shared_ptr<const Dataset>& ds,
                      const std::map<std::string, kinds::Outcome>& expected_errors, int workers) {
  LoaderOptions o;
  o.batch_size = 8;
  o.num_workers = workers;
  o.prefetch_depth = 3;
  o.seed = 5;
  o.transform.kind = TransformOptions::Kind::kEval;
  o.transform.eval = {72, 64};
  o.error_policy = ErrorPolicy::kSkip;
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
  const Epoch e = run_epoch(loader, 0);
  EXPECT_TRUE(e.summary.complete);
  EXPECT_EQ(e.summary.samples, ds->size());
  EXPECT_EQ(e.summary.skipped, static_cast<int64_t>(expected_errors.size()));
  std::map<std::string, int64_t> by_kind;
  for (const auto& [name, want] : expected_errors) ++by_kind[std::string(gpufeed::decode::to_string(*want.error))];
  EXPECT_EQ(e.summary.skipped_by_kind, by_kind);
  std::set<int64_t> skipped_positions;
  for (const SkippedSample& s : e.summary.skips) {
    const std::string name = fs::path(s.path).filename().string();
    SCOPED_TRACE(name);
    const auto it = expected_errors.find(name);
    ASSERT_NE(it, expected_errors.end()) << "skipped a file that should load: " << s.kind << ": " << s.reason;
    EXPECT_EQ(s.kind, gpufeed::decode::to_string(*it->second.error)) << s.reason;
    EXPECT_NE(s.reason.find(it->second.reason), std::string::npos) << s.reason;
    EXPECT_EQ(sample_of(e, s.position, 8, 64), reference_sample(*ds, s.replaced_by, 0, o));
    skipped_positions.insert(s.position);
  }
  for (int64_t p = 0; p < ds->size(); ++p) {
    if (skipped_positions.count(p)) continue;
    EXPECT_EQ(sample_of(e, p, 8, 64), reference_sample(*ds, p, 0, o)) << ds->at(p).path;
    EXPECT_EQ(e.labels[static_cast<size_t>(p / 8)][static_cast<size_t>(p % 8)], ds->at(p).label);
  }

  // The same folder with raise stops at the first bad file in sampler order, naming it.
  o.error_policy = ErrorPolicy::kRaise;
  int64_t first_bad = -1;
  for (int64_t p = 0; p < ds->size() && first_bad < 0; ++p)
    if (expected_errors.count(fs::path(ds->at(p).path).filename().string())) first_bad = p;
  auto alloc = std::make_shared<CountingAllocator>();
  {
    Loader raising(ds, std::make_shared<SequentialSampler>(ds->size()), o, alloc);
    raising.start_epoch(0);
    int64_t batches = 0;
    try {
      while (auto b = raising.next()) ++batches;
      FAIL() << "raise policy delivered the whole epoch";
    } catch (const DecodeError& err) {
      EXPECT_EQ(batches, first_bad / 8);
      EXPECT_EQ(err.source(), std::string(ds->at(first_bad).path));
      EXPECT_NE(std::string(err.what()).find(fs::path(ds->at(first_bad).path).filename().string()),
                std::string::npos);
    }
  }
  EXPECT_EQ(alloc->live.load(), 0);
}

// A Motion-JPEG frame without DHT decodes to the same pixels on a decoder that just decoded a
// progressive JPEG (whose optimised Huffman tables libjpeg keeps in the reused decompressor) as on
// a fresh one: with the old tables it decoded to garbage, so its outcome depended on which image
// the thread had decoded before (seen as a flaky skip reason in the Acceptance test below).
TEST(Decoder, AFrameWithoutHuffmanTablesIgnoresThePreviousImagesTables) {
  kinds::JpegSpec spec;
  spec.width = 64;
  spec.height = 48;
  spec.progressive = true;
  const Bytes progressive = kinds::make_jpeg(spec, kinds::pattern(64, 48, 3, 9));
  const Bytes frame = kinds::make_mjpeg_frame(64, 48, kinds::pattern(64, 48, 3, 5), 2);
  ASSERT_EQ(kinds::find_jpeg_marker(frame, 0xC4), std::string::npos) << "the frame must have no DHT";
  gpufeed::decode::ImageBuffer fresh_out, reused_out, first;
  const auto fresh = gpufeed::decode::Decoder().decode(frame, "frame", {}, fresh_out);
  gpufeed::decode::Decoder reused;
  reused.decode(progressive, "progressive", {}, first);
  const auto again = reused.decode(frame, "frame", {}, reused_out);
  EXPECT_EQ(again.warnings, fresh.warnings);
  EXPECT_EQ(reused_out.pixels, fresh_out.pixels);
}

TEST(Acceptance, SkipOverEveryGeneratedKindMixedWithGoodImages) {
  TempDir dir("kinds");
  std::vector<FileSample> refs;
  std::map<std::string, kinds::Outcome> errors;
  int n = 0;
  for (const kinds::Variant& v : kinds::make_kind_variants()) {
    // Interleave good images so replacements are mostly good ones.
    const std::string name = std::to_string(1000 + n++) + "_" + v.name;
    refs.push_back({dir.path() / name, 1});
    write_file(refs.back().path, v.bytes);
    if (v.expect.error) errors[name] = v.expect;
    if (n % 3 == 0) {
      refs.push_back({dir.path() / (std::to_string(1000 + n++) + "_good.jpg"), 0});
      write_file(refs.back().path, good_jpeg(n));
    }
  }
  auto ds = std::make_shared<ListDataset>(refs, 2);
  ASSERT_GE(errors.size(), 20u);
  for (int workers : {1, 3}) check_skip_epoch(ds, errors, workers);
}

TEST(Acceptance, SkipOverTheThirtySharedBugCasesMixedWithGoodImages) {
  const fs::path shared = gpufeed::test::shared_dir();
  const fs::path files = shared / "bugcases" / "files";
  if (shared.empty() || !fs::is_directory(files))
    GTEST_SKIP() << "../shared/bugcases is absent in this checkout; the generated kinds cover it";
  TempDir dir("shared");
  // A flat folder: the bug cases as symlinks ("bug_<name>", class "bug"), then good images.
  std::map<std::string, kinds::Outcome> errors;
  for (const std::string& kind : kinds::bug_kinds()) {
    ASSERT_TRUE(fs::exists(files / kind)) << kind;
    fs::create_symlink(files / kind, dir.path() / ("bug_" + kind));
    const kinds::Outcome want = kinds::expected_outcome(kind);
    if (want.error) errors["bug_" + kind] = want;
  }
  for (int i = 0; i < 30; ++i)
    write_file(dir.path() / ("good_" + std::to_string(100 + i) + ".jpg"), good_jpeg(i));
  auto ds = open_dataset(dir.path());
  ASSERT_EQ(ds->size(), 60);
  // EXPECTED.md: empty, 12-bit, corrupt entropy, the JPEG bomb, lossless, truncated, zero width,
  // bad CRC and the PNG bomb fail; the 21 others decode.
  ASSERT_EQ(errors.size(), 9u);
  check_skip_epoch(ds, errors, 2);
}

}  // namespace
