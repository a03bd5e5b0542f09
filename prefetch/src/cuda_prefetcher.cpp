// The CUDA path: pinned slots, a copy stream per prefetcher, an event per batch.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <deque>
#include <stdexcept>
#include <string>

#include "gpufeed/prefetch/prefetcher.h"
#include "internal.h"

namespace gpufeed::prefetch {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// Page-locked host memory, so H2D copies from slots are truly asynchronous.
class PinnedAllocator final : public loader::HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { cudaFreeHost(p); }
  bool pinned() const override { return true; }
};

// A timing-enabled event recorded on a stream at construction.
class CudaStreamMark final : public StreamMark {
 public:
  explicit CudaStreamMark(const c10::cuda::CUDAStream& stream) : event_(cudaEventDefault) {
    event_.record(stream);
  }
  bool reached() const override { return event_.query(); }
  double ms_since(const StreamMark& earlier) const override {
    const auto* e = dynamic_cast<const CudaStreamMark*>(&earlier);
    if (!e) throw std::invalid_argument("StreamMark::ms_since: not a CUDA stream mark");
    e->event_.synchronize();
    event_.synchronize();
    return e->event_.elapsed_time(event_);
  }

 private:
  at::cuda::CUDAEvent event_;
};

class CudaPrefetcher final : public Prefetcher {
 public:
  CudaPrefetcher(std::shared_ptr<loader::Loader> loader, PrefetchOptions options)
      : loader_(std::move(loader)),
        options_(options),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, options.device.index())) {
    if (options_.device_prefetch_depth < 1)
      throw std::invalid_argument("CudaPrefetcher: device_prefetch_depth must be >= 1");
  }

  ~CudaPrefetcher() override {
    // Copies still reading pinned slots must finish before the slots can go back.
    try {
      stream_.synchronize();
    } catch (...) {
    }
  }

  void start_epoch(int64_t epoch, int64_t start_batch) override {
    stream_.synchronize();
    ready_.clear();
    copying_.clear();
    loader_->start_epoch(epoch, start_batch);
    exhausted_ = false;
  }

  std::optional<DeviceBatch> next() override {
    const auto t0 = std::chrono::steady_clock::now();
    fill(/*block=*/true);
    if (ready_.empty()) return std::nullopt;
    Pending p = std::move(ready_.front());
    ready_.pop_front();
    // The consumer's stream waits for the copy and conversion; the caching allocator learns that
    // the tensors are used there, so their memory is not reused while the step still reads it.
    auto current = c10::cuda::getCurrentCUDAStream(options_.device.index());
    p.done->block(current);
    c10::cuda::CUDACachingAllocator::recordStream(p.batch.images.storage().data_ptr(), current);
    c10::cuda::CUDACachingAllocator::recordStream(p.batch.labels.storage().data_ptr(), current);
    p.batch.wait_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    fill(/*block=*/false);  // copies in flight behind this step for batches already decoded
    return std::move(p.batch);
  }

  bool wait_ready(std::chrono::nanoseconds timeout) override {
    return !ready_.empty() || exhausted_ || loader_->wait_ready(timeout);
  }

  loader::Loader& loader() override { return *loader_; }

 private:
  struct Pending {
    DeviceBatch batch;
    std::shared_ptr<at::cuda::CUDAEvent> done;
  };
  struct Copying {
    loader::Batch host;  // holds the pinned slot until the copy has read it
    std::shared_ptr<at::cuda::CUDAEvent> done;
  };

  void release_finished(bool wait_for_one) {
    while (!copying_.empty()) {
      if (!copying_.front().done->query()) {
        if (!wait_for_one) break;
        copying_.front().done->synchronize();
      }
      copying_.pop_front();
      wait_for_one = false;
    }
  }

  // Enqueues copies of decoded batches until `device_prefetch_depth` are ready or copying. Waits for the loader
  // only when `block` and nothing is ready yet: a batch still being decoded cannot be copied
  // any sooner by waiting for it here, and not waiting hands the caller its batch sooner (and
  // lets the Python binding wait in interruptible slices before calling next()).
  void fill(bool block) {
    release_finished(false);
    while (!exhausted_ && static_cast<int>(ready_.size()) < options_.device_prefetch_depth) {
      if (!(block && ready_.empty()) && !loader_->wait_ready(std::chrono::nanoseconds(0))) break;
      // Never hold every loader slot: the loader needs one to work ahead.
      if (static_cast<int>(copying_.size()) >= loader_->prefetch_depth() - 1 &&
          !copying_.empty()) {
        release_finished(true);
      }
      std::optional<loader::Batch> host = loader_->next();
      if (!host) {
        exhausted_ = true;
        break;
      }
      enqueue(std::move(*host));
    }
  }

  void enqueue(loader::Batch host) {
    c10::cuda::CUDAStreamGuard guard(stream_);
    auto copy_begin = std::make_shared<CudaStreamMark>(stream_);
    auto [images, labels] = as_tensors(host);
    const auto dev = at::TensorOptions().device(options_.device);
    at::Tensor d_images = images.to(dev.dtype(at::kByte), /*non_blocking=*/true);
    at::Tensor d_labels = labels.to(dev.dtype(at::kLong), /*non_blocking=*/true);
    Pending p;
    p.batch = describe(host);
    p.batch.images = convert_images(d_images, options_.dtype, options_.channels_last, options_.normalize);
    p.batch.labels = d_labels;
    p.done = std::make_shared<at::cuda::CUDAEvent>();
    p.done->record(stream_);
    p.batch.copy_begin = std::move(copy_begin);
    p.batch.copy_end = std::make_shared<CudaStreamMark>(stream_);
    copying_.push_back({std::move(host), p.done});
    ready_.push_back(std::move(p));
  }

  std::shared_ptr<loader::Loader> loader_;
  PrefetchOptions options_;
  c10::cuda::CUDAStream stream_;
  std::deque<Pending> ready_;
  std::deque<Copying> copying_;
  bool exhausted_ = true;
};

}  // namespace

std::shared_ptr<StreamMark> record_stream_mark(const c10::Device& device) {
  if (!device.is_cuda()) {
    throw std::runtime_error("record_stream_mark: " + device.str() + " is not a CUDA device");
  }
  return std::make_shared<CudaStreamMark>(c10::cuda::getCurrentCUDAStream(device.index()));
}

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::shared_ptr<loader::HostAllocator> host_allocator_for(const c10::Device& device) {
  if (device.is_cuda()) return std::make_shared<PinnedAllocator>();
  return loader::default_host_allocator();
}

std::unique_ptr<Prefetcher> make_cuda_prefetcher(std::shared_ptr<loader::Loader> loader,
                                                 const PrefetchOptions& options) {
  if (!cuda_available()) {
    throw std::runtime_error("no CUDA device is visible; cannot use " + options.device.str() +
                             " (check CUDA_VISIBLE_DEVICES and the driver)");
  }
  return std::make_unique<CudaPrefetcher>(std::move(loader), options);
}

}  // namespace gpufeed::prefetch
