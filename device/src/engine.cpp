// The CUDA engine (gpufeed/device/engine.h): a copy stream, an event per batch, buffers from an
// injected allocator, the fused conversion kernel.
#include "gpufeed/device/engine.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "gpufeed/device/gpu_decode.h"
#include "gpufeed/log.h"

namespace gpufeed::device {
namespace {

using detail::check;

// A CUDA memory pool of one device that keeps freed memory for reuse (release threshold: never).
class Pool {
 public:
  explicit Pool(int device) {
    detail::DeviceGuard guard(device);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    uint64_t keep = std::numeric_limits<uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  }
  // Returns at once; the driver frees the pool after its last outstanding allocation.
  ~Pool() { cudaMemPoolDestroy(pool_); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  cudaMemPool_t get() const { return pool_; }

 private:
  cudaMemPool_t pool_ = nullptr;
};

class PoolBuffer final : public DeviceBuffer {
 public:
  PoolBuffer(std::shared_ptr<Pool> pool, int device, size_t bytes, cudaStream_t stream)
      : pool_(std::move(pool)), device_(device), bytes_(bytes), release_(stream) {
    check(cudaMallocFromPoolAsync(&data_, bytes == 0 ? 1 : bytes, pool_->get(), stream), "cudaMallocFromPoolAsync");
  }
  // Freed in the order of the stream the batch was handed to (or the copy stream, if never handed
  // out): after the work enqueued there so far. A failure (the context torn down at exit) is moot.
  // On the buffer's device: the null stream (torch's default stream) is the current device's.
  ~PoolBuffer() override {
    int current = -1;
    const bool switch_device = cudaGetDevice(&current) == cudaSuccess && current != device_;
    if (switch_device) cudaSetDevice(device_);
    if (cudaFreeAsync(data_, release_) != cudaSuccess) cudaGetLastError();
    if (switch_device) cudaSetDevice(current);
  }
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;
  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }
  void used_on(StreamHandle stream) override { release_ = static_cast<cudaStream_t>(stream); }

 private:
  std::shared_ptr<Pool> pool_;  // outlives the allocation
  int device_;
  void* data_ = nullptr;
  size_t bytes_;
  cudaStream_t release_;
};

class PoolAllocator final : public DeviceAllocator {
 public:
  explicit PoolAllocator(int device) : device_(device), pool_(std::make_shared<Pool>(device)) {}
  std::shared_ptr<DeviceBuffer> allocate(size_t bytes, int device, StreamHandle stream) override {
    if (device != device_)
      throw std::invalid_argument("stream_ordered_allocator: made for cuda:" + std::to_string(device_) +
                                  ", asked for cuda:" + std::to_string(device));
    return std::make_shared<PoolBuffer>(pool_, device_, bytes, static_cast<cudaStream_t>(stream));
  }

 private:
  int device_;
  std::shared_ptr<Pool> pool_;
};

// An event without timing (cheaper), for completion only.
class Event {
 public:
  Event() { check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }
  bool query() const {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    check(e, "cudaEventQuery");
    return false;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

std::shared_ptr<DeviceAllocator> stream_ordered_allocator(int device) {
  return std::make_shared<PoolAllocator>(device);
}

struct CudaEngine::Impl {
  struct Pending {
    EngineBatch batch;
    std::shared_ptr<Event> done;
  };
  struct Copying {
    loader::Batch host;  // holds the pinned slot until the copy has read it
    std::shared_ptr<Event> done;
  };

  std::shared_ptr<loader::Loader> loader;
  EngineOptions options;
  NormalizeConstants constants{};
  cudaStream_t stream = nullptr;
  std::deque<Pending> ready;
  std::deque<Copying> copying;
  bool exhausted = true;

  // decode_device gpu/auto (loader option): the GPU decoder, and auto's controller.
  std::unique_ptr<GpuDecoder> gpu;
  bool auto_share = false;
  double share = 0;
  double budget = 0.25;
  std::chrono::steady_clock::time_point last_next{};
  std::shared_ptr<const StreamMark> decode_begin, decode_end;  // the last GPU decode, on `stream`
  int64_t gpu_samples = 0, cpu_fallbacks = 0;
  std::map<std::string, int64_t> fallback_reasons;

  // Auto's rule, once per handed-out batch: the consumer waited for data -> more of each batch to
  // the GPU; the decoder's GPU time over the step passed the budget -> less. Steps of 1/16.
  void steer(double wait_ms) {
    const auto now = std::chrono::steady_clock::now();
    const double step_ms = last_next.time_since_epoch().count() == 0
                               ? -1.0
                               : std::chrono::duration<double, std::milli>(now - last_next).count();
    last_next = now;
    if (!auto_share || step_ms <= 0) return;
    double gpu_ms = 0;
    if (decode_begin && decode_end && decode_end->reached()) gpu_ms = decode_end->ms_since(*decode_begin);
    constexpr double kStep = 1.0 / 16;
    if (gpu_ms > budget * step_ms) {
      share = std::max(0.0, share - kStep);
    } else if (wait_ms > 0.02 * step_ms) {
      share = std::min(1.0, share + kStep);
    } else {
      return;
    }
    loader->set_gpu_decode_share(share);
  }

  // The batch's deferred rows: decoded on the GPU into `raw` (the device copy of the slot) by work
  // enqueued on the copy stream after the slot's copy; what the GPU cannot decode is decoded here on
  // the CPU into the slot's row and copied over the device row after.
  void decode_deferred(loader::Batch& host, DeviceBuffer& raw, EngineBatch& b) {
    const int64_t row = host.height * host.width * 3;
    std::vector<GpuDecodeItem> items;
    std::vector<uint8_t*> rows;
    items.reserve(host.deferred.size());
    for (const loader::DeferredSample* d : host.deferred) {
      GpuDecodeItem it;
      it.data = d->bytes.data();
      it.size = d->bytes.size();
      it.roi = gpu_decode_region(d->plan, d->info.width, d->info.height);
      it.region = d->plan.region;
      it.flip = d->plan.flip;
      it.output_size = d->plan.output_size;
      it.filter = d->plan.filter;
      it.source = d->source;
      items.push_back(std::move(it));
      rows.push_back(static_cast<uint8_t*>(raw.data()) + d->position * row);
    }
    decode_begin = record_stream_mark(options.device, stream);
    const std::vector<GpuDecodeResult> results = gpu->decode(items, rows, stream);
    decode_end = record_stream_mark(options.device, stream);
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].ok) {
        ++gpu_samples;
        continue;
      }
      const loader::DeferredSample& d = *host.deferred[i];
      if (fallback_reasons[results[i].reason]++ == 0)
        gpufeed::log()->warn("GPU decode: {}: {}; decoding it (and others like it) on the CPU", d.source, results[i].reason);
      ++cpu_fallbacks;
      uint8_t* slot_row = host.images + d.position * row;
      if (std::optional<loader::SkippedSample> skip = loader->decode_deferred_on_cpu(host, d, slot_row)) {
        b.skipped.push_back(std::move(*skip));
      }
      check(cudaMemcpyAsync(rows[i], slot_row, static_cast<size_t>(row), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (CPU-decoded row)");
    }
  }

  void release_finished(bool wait_for_one) {
    while (!copying.empty()) {
      if (!copying.front().done->query()) {
        if (!wait_for_one) break;
        check(cudaEventSynchronize(copying.front().done->get()), "cudaEventSynchronize");
      }
      copying.pop_front();
      wait_for_one = false;
    }
  }

  // Enqueues copies of decoded batches until device_prefetch_depth are ready or copying. Waits
  // for the loader only when `block` and nothing is ready yet: a batch still being decoded cannot
  // be copied any sooner by waiting for it here, and not waiting hands the caller its batch sooner
  // (and lets the Python binding wait in interruptible slices before calling next()).
  void fill(bool block) {
    release_finished(false);
    while (!exhausted && static_cast<int>(ready.size()) < options.device_prefetch_depth) {
      if (!(block && ready.empty()) && !loader->wait_ready(std::chrono::nanoseconds(0))) break;
      // Never hold every loader slot: the loader needs one to work ahead.
      if (static_cast<int>(copying.size()) >= loader->prefetch_depth() - 1 && !copying.empty()) {
        release_finished(true);
      }
      std::optional<loader::Batch> host = loader->next();
      if (!host) {
        exhausted = true;
        break;
      }
      enqueue(std::move(*host));
    }
  }

  // A failure after a copy was queued (an allocation, a launch) waits for the stream before `host`
  // goes: its pinned slot must not return to the loader while a copy may still read it.
  void enqueue(loader::Batch host) {
    try {
      enqueue_copies(host);
    } catch (...) {
      cudaStreamSynchronize(stream);
      throw;
    }
  }

  void enqueue_copies(loader::Batch& host) {
    const int dev = options.device;
    Pending p;
    EngineBatch& b = p.batch;
    b.dtype = options.dtype;
    b.channels_last = options.channels_last;
    b.size = host.size;
    b.height = host.height;
    b.width = host.width;
    b.epoch = host.epoch;
    b.batch_index = host.batch_index;
    b.indices = host.indices;
    b.skipped = host.skipped;
    b.copy_begin = record_stream_mark(dev, stream);
    const auto bytes = static_cast<size_t>(host.image_bytes());
    std::shared_ptr<DeviceBuffer> raw = options.allocator->allocate(bytes, dev, stream);
    check(cudaMemcpyAsync(raw->data(), host.images, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (images)");
    if (!host.deferred.empty()) decode_deferred(host, *raw, b);
    const size_t label_bytes = static_cast<size_t>(host.size) * sizeof(int64_t);
    b.labels = options.allocator->allocate(label_bytes, dev, stream);
    check(cudaMemcpyAsync(b.labels->data(), host.labels, label_bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (labels)");
    b.images = convert(std::move(raw), host.size, host.height, host.width);
    // Multi-crop: every view copied and converted alike (view 0 is `images`).
    for (size_t v = 0; v < host.views.size(); ++v) {
      const loader::BatchView& hv = host.views[v];
      std::shared_ptr<DeviceBuffer> view = b.images;
      if (v > 0) {
        const auto view_bytes = static_cast<size_t>(host.size * hv.height * hv.width * 3);
        view = options.allocator->allocate(view_bytes, dev, stream);
        check(cudaMemcpyAsync(view->data(), hv.images, view_bytes, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync (view)");
        view = convert(std::move(view), host.size, hv.height, hv.width);
      }
      b.views.push_back({std::move(view), hv.height, hv.width});
    }
    p.done = std::make_shared<Event>();
    check(cudaEventRecord(p.done->get(), stream), "cudaEventRecord");
    b.copy_end = record_stream_mark(dev, stream);
    copying.push_back({std::move(host), p.done});
    ready.push_back(std::move(p));
  }

  // `raw`, a device copy of [n, h, w, 3] uint8, as the options' dtype and layout: itself for uint8
  // in the slot's layout (the copy is the result), else the normalize kernel's output (`raw` is
  // freed in the copy stream's order, after the kernel read it).
  std::shared_ptr<DeviceBuffer> convert(std::shared_ptr<DeviceBuffer> raw, int64_t n, int64_t h, int64_t w) {
    if (options.dtype == OutputType::kUInt8 && options.channels_last) return raw;
    const auto bytes = static_cast<size_t>(n * h * w * 3);
    std::shared_ptr<DeviceBuffer> out =
        options.allocator->allocate(bytes * static_cast<size_t>(element_size(options.dtype)), options.device, stream);
    launch_normalize(static_cast<const uint8_t*>(raw->data()), out->data(), options.dtype, n, h, w,
                     options.channels_last, constants, stream);
    return out;
  }

  // Drops staged batches after their copies finished (their slots go back to the loader).
  void drain() {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    ready.clear();
    copying.clear();
  }
};

CudaEngine::CudaEngine(std::shared_ptr<loader::Loader> loader, EngineOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!loader) throw std::invalid_argument("CudaEngine: loader is null");
  if (options.device_prefetch_depth < 1) throw std::invalid_argument("CudaEngine: device_prefetch_depth must be >= 1");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw std::runtime_error("no CUDA device is visible; cannot use cuda:" + std::to_string(options.device) +
                             " (check CUDA_VISIBLE_DEVICES and the driver)");
  }
  if (options.device < 0 || options.device >= count)
    throw std::runtime_error("cuda:" + std::to_string(options.device) + " does not exist: " + std::to_string(count) +
                             " CUDA device(s) visible");
  Impl& m = *impl_;
  m.loader = std::move(loader);
  if (!options.allocator) options.allocator = stream_ordered_allocator(options.device);
  m.options = std::move(options);
  m.constants = normalize_constants(m.options.normalize);
  detail::DeviceGuard guard(m.options.device);
  check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const loader::LoaderOptions& lo = m.loader->options();
  if (lo.decode_device != loader::DecodeDevice::kCpu) {
    GpuDecoderOptions g;
    g.device = m.options.device;
    g.allocator = m.options.allocator;
    try {
      m.gpu = std::make_unique<GpuDecoder>(std::move(g));
    } catch (...) {
      cudaStreamDestroy(m.stream);
      throw;
    }
    m.auto_share = lo.decode_device == loader::DecodeDevice::kAuto;
    m.share = m.auto_share ? 0.5 : 1.0;
    m.budget = lo.gpu_decode_budget;
    m.loader->set_gpu_decode_share(m.share);
  }
}

CudaEngine::~CudaEngine() {
  Impl& m = *impl_;
  if (m.gpu) {
    std::string reasons;
    for (const auto& [why, n] : m.fallback_reasons) reasons += fmt::format("; {} x {}", n, why);
    gpufeed::log()->info("GPU decode: {} samples on the GPU, {} on the CPU after the GPU could not{}; share {:.3f}",
                         m.gpu_samples, m.cpu_fallbacks, reasons, m.share);
  }
  try {
    detail::DeviceGuard guard(m.options.device);
    m.drain();
  } catch (...) {
    m.ready.clear();  // their buffers' frees are queued on the stream before it goes
    m.copying.clear();
  }
  cudaStreamSynchronize(m.stream);  // the frees of the staged buffers, enqueued above
  cudaStreamDestroy(m.stream);
}

void CudaEngine::start_epoch(int64_t epoch, int64_t start_batch) {
  Impl& m = *impl_;
  detail::DeviceGuard guard(m.options.device);
  m.drain();
  m.loader->start_epoch(epoch, start_batch);
  m.exhausted = false;
}

std::optional<EngineBatch> CudaEngine::next(StreamHandle consumer) {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  detail::DeviceGuard guard(m.options.device);
  m.fill(/*block=*/true);
  if (m.ready.empty()) return std::nullopt;
  Impl::Pending p = std::move(m.ready.front());
  m.ready.pop_front();
  // The consumer's stream waits for the copy and conversion; the buffers learn where they are used,
  // so their memory is not reused while the consumer's work still reads it.
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(consumer), p.done->get(), 0), "cudaStreamWaitEvent");
  p.batch.images->used_on(consumer);
  p.batch.labels->used_on(consumer);
  for (size_t v = 1; v < p.batch.views.size(); ++v) p.batch.views[v].images->used_on(consumer);
  p.batch.wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (m.gpu) {
    m.steer(p.batch.wait_ms);
    p.batch.gpu_decode_share = m.share;
    p.batch.gpu_decoded_total = m.gpu_samples;
    p.batch.gpu_fallbacks_total = m.cpu_fallbacks;
  }
  m.fill(/*block=*/false);  // copies in flight behind this step for batches already decoded
  return std::move(p.batch);
}

bool CudaEngine::wait_ready(std::chrono::nanoseconds timeout) {
  Impl& m = *impl_;
  return !m.ready.empty() || m.exhausted || m.loader->wait_ready(timeout);
}

loader::Loader& CudaEngine::loader() { return *impl_->loader; }
const EngineOptions& CudaEngine::options() const { return impl_->options; }

}  // namespace gpufeed::device
