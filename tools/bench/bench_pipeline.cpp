// bench_pipeline: the loader's batch assembler against a oneTBB parallel_pipeline doing the same
// work, side by side in one process: the measurement behind keeping the loader's own design
// rather than tbb::parallel_pipeline (whichever is faster or equal and simpler stays).
//
//   gpufeed_bench_pipeline DATA [--num-workers N] [--batch-size B] [--prefetch-depth D] [--rounds R]
//
// Both sides decode the same dataset, epoch after epoch, with the same options and seed, into
// prefetch_depth preallocated slots, and hand batches out in sampler order. The pipeline is
// oneTBB's own expression of that contract: a serial_in_order input filter takes a free slot and
// emits the samples of each batch in order, a parallel filter runs loader::load_sample straight
// into the slot (the loader's per-sample work, plan_for included), and a serial_in_order output
// filter completes batches in order into a concurrent_bounded_queue the consumer pops; the live
// token limit is prefetch_depth x batch_size. Its batches are checked byte for byte against the
// loader's before anything is timed. Rounds alternate the two (A B A B ...) after one warm-up
// epoch each; the median images/s of each and their ratio are printed. Not a test: a measurement
// for docs/DESIGN-NOTES.md.
#include <tbb/concurrent_queue.h>
#include <tbb/global_control.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"

namespace {

using namespace gpufeed;
using Clock = std::chrono::steady_clock;

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The pipeline side: one epoch at a time, driven by a thread that runs parallel_pipeline inside
// an arena of `workers` threads; the consumer pops finished batch numbers from `ready`.
class PipelineLoader {
 public:
  PipelineLoader(std::shared_ptr<const datasets::Dataset> ds, loader::LoaderOptions o)
      : ds_(std::move(ds)),
        o_(o),
        side_(o.transform.output_size()),
        arena_(o.num_workers),
        slots_(static_cast<size_t>(o.prefetch_depth)) {
    for (auto& s : slots_) s.resize(static_cast<size_t>(o.batch_size * side_ * side_ * 3));
    for (int i = 0; i < o.prefetch_depth; ++i) free_.push_back(i);
  }

  // Runs `epoch`, calling consume(batch images, samples) in sampler order on this thread.
  template <class Consume>
  void run_epoch(const std::vector<std::vector<int64_t>>& batches, int64_t epoch, Consume consume) {
    tbb::concurrent_bounded_queue<std::pair<int, int64_t>> ready;  // (slot, samples); -1 = end
    std::thread driver([&] {
      arena_.execute([&] { drive(batches, epoch, ready); });
      ready.push({-1, 0});
    });
    for (;;) {
      std::pair<int, int64_t> b;
      ready.pop(b);
      if (b.first < 0) break;
      consume(slots_[static_cast<size_t>(b.first)].data(), b.second);
      std::lock_guard<std::mutex> g(mu_);
      free_.push_back(b.first);
      cv_.notify_all();
    }
    driver.join();
  }

 private:
  struct Token {
    int slot = 0;
    size_t batch = 0, k = 0;
    bool last = false;  // the batch's last sample
  };

  void drive(const std::vector<std::vector<int64_t>>& batches, int64_t epoch,
             tbb::concurrent_bounded_queue<std::pair<int, int64_t>>& ready) {
    size_t batch = 0, k = 0;
    int slot = -1;
    const auto tokens = static_cast<size_t>(o_.prefetch_depth * o_.batch_size);
    tbb::parallel_pipeline(
        tokens,
        tbb::make_filter<void, Token>(
            tbb::filter_mode::serial_in_order,
            [&](tbb::flow_control& fc) -> Token {
              if (batch == batches.size()) {
                fc.stop();
                return {};
              }
              if (k == 0) {  // a new batch takes a free slot (waits for the consumer)
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] { return !free_.empty(); });
                slot = free_.back();
                free_.pop_back();
              }
              Token t{slot, batch, k, k + 1 == batches[batch].size()};
              if (t.last) {
                ++batch;
                k = 0;
              } else {
                ++k;
              }
              return t;
            }) &
            tbb::make_filter<Token, Token>(
                tbb::filter_mode::parallel,
                [&](Token t) {
                  uint8_t* out = slots_[static_cast<size_t>(t.slot)].data() +
                                 t.k * static_cast<size_t>(side_ * side_ * 3);
                  loader::load_sample(*ds_, batches[t.batch][t.k], epoch, o_, out);
                  return t;
                }) &
            tbb::make_filter<Token, void>(tbb::filter_mode::serial_in_order, [&](Token t) {
              if (t.last) ready.push({t.slot, static_cast<int64_t>(batches[t.batch].size())});
            }));
  }

  std::shared_ptr<const datasets::Dataset> ds_;
  loader::LoaderOptions o_;
  int64_t side_;
  tbb::task_arena arena_;
  std::vector<std::vector<uint8_t>> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> free_;
};

std::vector<std::vector<int64_t>> epoch_batches(int64_t n, const loader::LoaderOptions& o,
                                                int64_t epoch) {
  auto s = std::make_shared<sampler::RandomSampler>(n, o.seed);
  s->set_epoch(epoch);
  return sampler::BatchSampler(s, o.batch_size, o.drop_last).batches();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s DATA [--num-workers N] [--batch-size B] [--prefetch-depth D] [--rounds R]\n",
                 argv[0]);
    return 2;
  }
  loader::LoaderOptions o;
  o.num_workers = 2;
  o.batch_size = 256;
  o.prefetch_depth = 3;
  int rounds = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--num-workers") o.num_workers = v;
    else if (k == "--batch-size") o.batch_size = v;
    else if (k == "--prefetch-depth") o.prefetch_depth = v;
    else if (k == "--rounds") rounds = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  o.transform = transforms::TransformOptions::imagenet(transforms::TransformOptions::Kind::kTrain, 224);
  std::shared_ptr<const datasets::Dataset> ds = datasets::open_dataset(argv[1]);
  const int64_t n = ds->size();
  const size_t sample_bytes = 224 * 224 * 3;

  auto sampler = std::make_shared<sampler::RandomSampler>(n, o.seed);
  loader::Loader current(ds, sampler, o);
  PipelineLoader pipeline(ds, o);

  // One epoch of each: the checksum over every batch proves the two do the same work.
  const auto run_current = [&](int64_t epoch, uint64_t& h) {
    current.start_epoch(epoch);
    int64_t samples = 0;
    while (auto b = current.next()) {
      h = fnv1a(b->images, static_cast<size_t>(b->image_bytes()), h);
      samples += b->size;
    }
    return samples;
  };
  const auto run_pipeline = [&](int64_t epoch, uint64_t& h) {
    int64_t samples = 0;
    pipeline.run_epoch(epoch_batches(n, o, epoch), epoch, [&](const uint8_t* images, int64_t size) {
      h = fnv1a(images, static_cast<size_t>(size) * sample_bytes, h);
      samples += size;
    });
    return samples;
  };
  uint64_t h_current = 1469598103934665603ull, h_pipeline = h_current;
  run_current(0, h_current);
  run_pipeline(0, h_pipeline);
  std::printf("epoch 0 checksum: loader %016llx, pipeline %016llx (%s)\n",
              static_cast<unsigned long long>(h_current), static_cast<unsigned long long>(h_pipeline),
              h_current == h_pipeline ? "identical" : "DIFFERENT");
  if (h_current != h_pipeline) return 1;

  std::vector<double> a, b;
  for (int r = 1; r <= rounds; ++r) {
    uint64_t h = 0;
    auto t0 = Clock::now();
    const int64_t sa = run_current(r, h);
    a.push_back(static_cast<double>(sa) / std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    const int64_t sb = run_pipeline(r, h);
    b.push_back(static_cast<double>(sb) / std::chrono::duration<double>(Clock::now() - t0).count());
    std::printf("round %d: loader %.0f img/s, parallel_pipeline %.0f img/s\n", r, a.back(), b.back());
  }
  std::printf("median of %d rounds (%lld samples, %d workers, batch %lld, depth %d): loader %.0f "
              "img/s, parallel_pipeline %.0f img/s, pipeline/loader %.3f\n",
              rounds, static_cast<long long>(n), o.num_workers, static_cast<long long>(o.batch_size),
              o.prefetch_depth, median(a), median(b), median(b) / median(a));
  return 0;
}
