#include "gpufeed/loader/loader.h"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <stdexcept>
#include <thread>

#include "gpufeed/log.h"

namespace gpufeed::loader {
namespace {

using Clock = std::chrono::steady_clock;

// Per-thread decode state: the decoder (libjpeg handle), the file bytes and the decoded pixels.
// Buffers grow to the largest file/image seen and are then reused: no per-sample allocation.
struct Worker {
  decode::Decoder decoder;
  std::vector<uint8_t> bytes;
  decode::ImageBuffer image;
};

Worker& thread_worker() {
  thread_local Worker worker;
  return worker;
}

struct SampleCost {
  int64_t read_ns = 0, decode_ns = 0, resize_ns = 0, bytes = 0, pixels = 0;
};

int64_t ns_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
}

void flip_horizontal(uint8_t* img, int size) {
  for (int y = 0; y < size; ++y) {
    uint8_t* row = img + static_cast<size_t>(y) * size * 3;
    for (int a = 0, b = size - 1; a < b; ++a, --b) {
      std::swap_ranges(row + a * 3, row + a * 3 + 3, row + b * 3);
    }
  }
}

// The one place a sample becomes pixels: read, probe, plan from the header, decode only the
// crop at the cheapest DCT scale that still covers the output, resize straight into `out`.
SampleCost transform_into(const SampleRef& ref, int64_t index, int64_t epoch,
                          const LoaderOptions& o, uint8_t* out) {
  Worker& w = thread_worker();
  SampleCost cost;
  auto t0 = Clock::now();
  decode::read_file(ref.path, w.bytes);
  cost.read_ns = ns_since(t0);
  cost.bytes = static_cast<int64_t>(w.bytes.size());

  t0 = Clock::now();
  const std::string source = ref.path.string();
  const decode::ImageInfo info = decode::probe(w.bytes, source);
  const SamplePlan plan = plan_sample(o.transform, info.width, info.height, o.seed, epoch, index);
  decode::DecodeOptions d = o.decode;
  d.crop = plan.box;
  d.scale = decode::choose_scale(info, plan.box, plan.output_size, plan.output_size);
  w.decoder.decode(w.bytes, source, d, w.image);
  cost.decode_ns = ns_since(t0);
  cost.pixels = static_cast<int64_t>(w.image.width) * w.image.height;

  t0 = Clock::now();
  const int s = plan.output_size;
  const cv::Mat src(w.image.height, w.image.width, CV_8UC3, w.image.pixels.data());
  cv::Mat dst(s, s, CV_8UC3, out);  // a header over the slot row: resize writes in place
  const int interp = (src.cols > s && src.rows > s) ? cv::INTER_AREA : cv::INTER_LINEAR;
  cv::resize(src, dst, dst.size(), 0, 0, interp);
  if (dst.data != out) throw std::logic_error("resize reallocated the slot view");
  if (plan.flip) flip_horizontal(out, s);
  cost.resize_ns = ns_since(t0);
  return cost;
}

}  // namespace

void load_sample(const Dataset& dataset, int64_t index, int64_t epoch, const LoaderOptions& options,
                 uint8_t* out) {
  transform_into(dataset.at(index), index, epoch, options, out);
}

int worker_count(int requested) {
  return requested > 0 ? requested : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

struct Slot {
  void* base = nullptr;
  size_t bytes = 0;
  uint8_t* images = nullptr;
  int64_t* labels = nullptr;
};

// One batch being assembled in one slot.
struct InFlight {
  int64_t batch_index = 0;
  Slot* slot = nullptr;
  std::vector<int64_t> indices;
  bool done = false;                 // guarded by Impl::mu
  std::mutex mu;                     // guards error and skipped
  std::exception_ptr error;
  std::vector<SkippedSample> skipped;
};

struct Loader::Impl : std::enable_shared_from_this<Loader::Impl> {
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<sampler::Sampler> sampler;
  LoaderOptions options;
  std::shared_ptr<HostAllocator> allocator;
  int64_t sample_bytes = 0;
  // oneTBB's market starts hardware_concurrency - 1 workers (it keeps a slot for the main thread);
  // the arena's tasks run only on workers (we enqueue, the consumer never joins), so allow one
  // worker per loader thread. The effective limit is the minimum over live global_controls.
  tbb::global_control parallelism;
  tbb::task_arena arena;

  std::vector<Slot> slots;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Slot*> free_slots;
  std::deque<std::shared_ptr<InFlight>> inflight;
  std::shared_ptr<const std::vector<std::vector<int64_t>>> batches;
  std::shared_ptr<const std::vector<int64_t>> epoch_indices;  // the batches, flattened
  int64_t epoch = 0;
  int64_t next_submit = 0;
  int64_t consumed = 0;
  int running_tasks = 0;
  bool shutdown = false;
  std::atomic<uint64_t> generation{0};
  std::atomic<int64_t> epoch_skips{0};

  std::atomic<int64_t> samples{0}, skipped{0}, bytes_read{0}, read_ns{0}, decode_ns{0},
      resize_ns{0}, pixels{0};

  Impl(std::shared_ptr<const Dataset> d, std::shared_ptr<sampler::Sampler> s, LoaderOptions o,
       std::shared_ptr<HostAllocator> a)
      : dataset(std::move(d)),
        sampler(std::move(s)),
        options(std::move(o)),
        allocator(a ? std::move(a) : default_host_allocator()),
        parallelism(tbb::global_control::max_allowed_parallelism,
                    std::max<size_t>(tbb::global_control::active_value(
                                         tbb::global_control::max_allowed_parallelism),
                                     static_cast<size_t>(worker_count(options.num_workers)) + 1)),
        arena(worker_count(options.num_workers), /*reserved_for_masters=*/0) {
    const int64_t side = options.transform.output_size();
    sample_bytes = side * side * 3;
    const auto image_bytes = static_cast<size_t>(sample_bytes * options.batch_size);
    const size_t label_offset = (image_bytes + 63) / 64 * 64;
    const size_t bytes = label_offset + static_cast<size_t>(options.batch_size) * sizeof(int64_t);
    slots.resize(static_cast<size_t>(options.prefetch_depth));
    for (Slot& slot : slots) {
      slot.base = allocator->allocate(bytes);
      slot.bytes = bytes;
      slot.images = static_cast<uint8_t*>(slot.base);
      slot.labels = reinterpret_cast<int64_t*>(static_cast<uint8_t*>(slot.base) + label_offset);
      free_slots.push_back(&slot);
    }
  }

  ~Impl() {
    for (Slot& slot : slots) allocator->deallocate(slot.base, slot.bytes);
  }

  // Cancels queued samples of the current epoch and waits until no task runs. Slots of unfinished
  // batches go back to the free list; slots held by the consumer stay with their Batch.
  void drain(std::unique_lock<std::mutex>& lk) {
    generation.fetch_add(1);
    cv.wait(lk, [&] { return running_tasks == 0; });
    for (auto& f : inflight) free_slots.push_back(f->slot);
    inflight.clear();
  }

  void pump(std::unique_lock<std::mutex>&) {
    if (shutdown || !batches) return;
    while (!free_slots.empty() && next_submit < static_cast<int64_t>(batches->size())) {
      auto f = std::make_shared<InFlight>();
      f->batch_index = next_submit;
      f->slot = free_slots.back();
      free_slots.pop_back();
      f->indices = (*batches)[static_cast<size_t>(next_submit)];
      ++next_submit;
      inflight.push_back(f);
      ++running_tasks;
      arena.enqueue([this, f, gen = generation.load(), ep = epoch, flat = epoch_indices] {
        run_batch(*f, gen, ep, *flat);
        {
          std::lock_guard<std::mutex> g(mu);
          f->done = true;
          --running_tasks;
        }
        cv.notify_all();
      });
    }
  }

  void run_batch(InFlight& f, uint64_t gen, int64_t ep, const std::vector<int64_t>& flat) {
    const auto n = f.indices.size();
    const int64_t base_pos = f.batch_index * options.batch_size;
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, 1), [&](const tbb::blocked_range<size_t>& r) {
      for (size_t k = r.begin(); k < r.end(); ++k) {
        if (generation.load(std::memory_order_relaxed) != gen) return;  // cancelled
        run_sample(f, k, ep, base_pos + static_cast<int64_t>(k), flat);
      }
    });
  }

  void account(const SampleCost& c) {
    samples.fetch_add(1, std::memory_order_relaxed);
    bytes_read.fetch_add(c.bytes, std::memory_order_relaxed);
    read_ns.fetch_add(c.read_ns, std::memory_order_relaxed);
    decode_ns.fetch_add(c.decode_ns, std::memory_order_relaxed);
    resize_ns.fetch_add(c.resize_ns, std::memory_order_relaxed);
    pixels.fetch_add(c.pixels, std::memory_order_relaxed);
  }

  void run_sample(InFlight& f, size_t k, int64_t ep, int64_t pos, const std::vector<int64_t>& flat) {
    uint8_t* out = f.slot->images + static_cast<size_t>(sample_bytes) * k;
    const int64_t index = f.indices[k];
    std::exception_ptr failure;
    try {
      const SampleRef& ref = dataset->at(index);
      account(transform_into(ref, index, ep, options, out));
      f.slot->labels[k] = ref.label;
      return;
    } catch (...) {
      failure = std::current_exception();
    }
    if (options.error_policy == ErrorPolicy::kRaise) {
      std::lock_guard<std::mutex> g(f.mu);
      if (!f.error) f.error = failure;
      return;
    }
    // Skip policy: the replacement is the next sample of this rank's epoch list that decodes, a
    // choice fixed by (epoch, position), so every run and every thread count picks the same.
    SkippedSample skip;
    skip.index = index;
    skip.path = dataset->at(index).path.string();
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      skip.reason = e.what();
    } catch (...) {
      skip.reason = "unknown error";
    }
    gpufeed::log()->warn("skipping sample {}: {}", index, skip.reason);
    const int64_t count = epoch_skips.fetch_add(1) + 1;
    skipped.fetch_add(1, std::memory_order_relaxed);
    std::exception_ptr last;
    if (count <= options.max_skips) {
      const auto len = static_cast<int64_t>(flat.size());
      for (int64_t step = 1; step < std::min<int64_t>(len, 64); ++step) {
        const int64_t candidate = flat[static_cast<size_t>((pos + step) % len)];
        try {
          const SampleRef& ref = dataset->at(candidate);
          account(transform_into(ref, candidate, ep, options, out));
          f.slot->labels[k] = ref.label;
          skip.replaced_by = candidate;
          break;
        } catch (...) {
          last = std::current_exception();
        }
      }
    }
    std::lock_guard<std::mutex> g(f.mu);
    if (skip.replaced_by < 0 && !f.error) {
      f.error = std::make_exception_ptr(std::runtime_error(
          count > options.max_skips
              ? "loader: more than max_skips=" + std::to_string(options.max_skips) +
                    " samples skipped in epoch " + std::to_string(ep) + "; last: " + skip.reason
              : "loader: no replacement decodes for " + skip.path + " (" + skip.reason + ")"));
    }
    f.skipped.push_back(std::move(skip));
  }

  void release(Slot* slot) {
    std::unique_lock<std::mutex> lk(mu);
    free_slots.push_back(slot);
    pump(lk);
  }
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<sampler::Sampler> sampler,
               LoaderOptions options, std::shared_ptr<HostAllocator> allocator) {
  if (!dataset) throw std::invalid_argument("Loader: dataset is null");
  if (!sampler) throw std::invalid_argument("Loader: sampler is null");
  if (options.batch_size < 1) throw std::invalid_argument("Loader: batch_size must be >= 1");
  if (options.prefetch_depth < 1) throw std::invalid_argument("Loader: prefetch_depth must be >= 1");
  if (options.transform.output_size() < 1) throw std::invalid_argument("Loader: output size must be >= 1");
  // No cv::setNumThreads here: Debian's OpenCV runs its parallel loops on oneTBB, where
  // cv::setNumThreads(n) installs a process-wide tbb::global_control(max_allowed_parallelism, n)
  // that would starve our arena (n = 0 leaves it no worker at all). Its loops nest inside our
  // tasks on the same TBB workers instead: one parallel layer, no extra threads.
  impl_ = std::make_shared<Impl>(std::move(dataset), std::move(sampler), std::move(options),
                                 std::move(allocator));
}

Loader::~Loader() {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->shutdown = true;
  impl_->drain(lk);
  // impl_ may outlive us while the consumer still holds Batches: their leases keep it alive.
}

void Loader::start_epoch(int64_t epoch, int64_t start_batch) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.mu);
  m.drain(lk);
  m.sampler->set_epoch(epoch);
  sampler::BatchSampler bs(m.sampler, m.options.batch_size, m.options.drop_last);
  auto batches = std::make_shared<std::vector<std::vector<int64_t>>>(bs.batches());
  auto flat = std::make_shared<std::vector<int64_t>>();
  for (const auto& b : *batches) flat->insert(flat->end(), b.begin(), b.end());
  m.batches = std::move(batches);
  m.epoch_indices = std::move(flat);
  m.epoch = epoch;
  m.epoch_skips = 0;
  m.next_submit = std::clamp<int64_t>(start_batch, 0, static_cast<int64_t>(m.batches->size()));
  m.consumed = m.next_submit;
  m.pump(lk);
}

std::optional<Batch> Loader::next() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.mu);
  m.pump(lk);
  if (m.inflight.empty()) {
    if (m.batches && m.next_submit < static_cast<int64_t>(m.batches->size())) {
      throw std::logic_error("Loader::next: all " + std::to_string(m.options.prefetch_depth) +
                             " slots are held by unreleased Batches; release one first or raise "
                             "prefetch_depth");
    }
    return std::nullopt;
  }
  std::shared_ptr<InFlight> f = m.inflight.front();
  m.cv.wait(lk, [&] { return f->done; });
  m.inflight.pop_front();
  ++m.consumed;
  if (f->error) {
    m.free_slots.push_back(f->slot);
    m.pump(lk);
    std::rethrow_exception(f->error);
  }
  Batch b;
  b.images = f->slot->images;
  b.labels = f->slot->labels;
  b.size = static_cast<int64_t>(f->indices.size());
  b.height = b.width = m.options.transform.output_size();
  b.epoch = m.epoch;
  b.batch_index = f->batch_index;
  b.indices = std::move(f->indices);
  b.skipped = std::move(f->skipped);
  b.pinned = m.allocator->pinned();
  Slot* slot = f->slot;
  b.lease = std::shared_ptr<void>(slot, [owner = impl_](void* p) { owner->release(static_cast<Slot*>(p)); });
  return b;
}

int64_t Loader::num_batches() const {
  sampler::BatchSampler bs(impl_->sampler, impl_->options.batch_size, impl_->options.drop_last);
  return bs.size();
}

sampler::SamplerState Loader::state() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return {impl_->epoch, impl_->consumed};
}

const LoaderOptions& Loader::options() const { return impl_->options; }
const Dataset& Loader::dataset() const { return *impl_->dataset; }
int64_t Loader::epoch_skips() const { return impl_->epoch_skips.load(); }

LoaderStats Loader::stats() const {
  const Impl& m = *impl_;
  LoaderStats s;
  s.samples = m.samples.load();
  s.skipped = m.skipped.load();
  s.bytes_read = m.bytes_read.load();
  s.read_s = static_cast<double>(m.read_ns.load()) * 1e-9;
  s.decode_s = static_cast<double>(m.decode_ns.load()) * 1e-9;
  s.resize_s = static_cast<double>(m.resize_ns.load()) * 1e-9;
  s.decoded_pixels = m.pixels.load();
  return s;
}

}  // namespace gpufeed::loader
