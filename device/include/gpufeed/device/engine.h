#pragma once
// Host batches -> converted batches on a CUDA device, without torch: the one CUDA engine behind
// both the LibTorch prefetcher (gpufeed/prefetch/prefetcher.h) and the Python package.
//
// Per batch: the loader's pinned slot is copied to the device on the engine's own copy stream
// (cudaMemcpyAsync), converted there by the fused kernel (normalize.h), and an event recorded
// after it. next(consumer) makes the consumer's stream wait on that event (cudaStreamWaitEvent),
// so the batch is ready on that stream without the host waiting; a slot returns to the loader
// once the event shows its copy has read it. Up to device_prefetch_depth batches are in flight
// or ready ahead of the consumer. Device memory comes from an injected DeviceAllocator (torch's
// caching allocator for the prefetcher; a stream-ordered CUDA memory pool for Python).
//
// Under the loader's decode_device gpu/auto, the batch's deferred rows (loader::Batch::deferred)
// are decoded on the GPU (gpu_decode.h) after the slot's copy, on the copy stream, before the
// conversion; a row the GPU cannot decode is decoded on the CPU (Loader::decode_deferred_on_cpu,
// under the loader's error policy) and copied over. Under auto the engine moves the loader's GPU
// share by 1/16 per batch: up when the consumer waited for data, down when the decoder's GPU time
// (CUDA events around it) passed gpu_decode_budget of the time between next() calls. The decode
// call itself runs on the thread calling next() (nvImageCodec's parsing, its own few threads).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gpufeed/device/cuda.h"
#include "gpufeed/device/normalize.h"
#include "gpufeed/loader/loader.h"

namespace gpufeed::device {

/// Device memory a DeviceAllocator handed out; freed when the last reference goes.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() const = 0;
  virtual size_t bytes() const = 0;
  /// The batch holding this buffer was handed to `stream`: the buffer must outlive the work
  /// enqueued there before its release (the stream-ordered pool frees it on that stream).
  virtual void used_on(StreamHandle stream) = 0;
};

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  /// `bytes` bytes on `device`, usable by work enqueued on `stream` from now on. Throws
  /// std::runtime_error (or the allocator's own error, e.g. torch's OutOfMemoryError) on failure.
  virtual std::shared_ptr<DeviceBuffer> allocate(size_t bytes, int device, StreamHandle stream) = 0;
};

/// Buffers from a CUDA memory pool of `device` (cudaMallocFromPoolAsync on the copy stream), each
/// freed with cudaFreeAsync on the stream its batch was handed to, so memory is reused as soon as
/// the consumer's work before the release is done. The pool keeps freed memory for reuse instead of
/// returning it to the driver. Throws std::runtime_error in a build without CUDA.
std::shared_ptr<DeviceAllocator> stream_ordered_allocator(int device);

/// CudaEngine's options.
struct EngineOptions {
  int device = 0;                                ///< CUDA device index
  OutputType dtype = OutputType::kFloat32;       ///< kUInt8 skips normalising
  bool channels_last = false;                    ///< NHWC memory for the [N, 3, H, W] result
  NormalizeOptions normalize{};
  /// Batches staged on the device ahead of the consumer (copy and conversion in flight or done);
  /// each holds its loader slot until its copy completed. Not the loader's prefetch_depth, which
  /// counts host slots. >= 1.
  int device_prefetch_depth = 2;
  /// Where device memory comes from; null: stream_ordered_allocator(device).
  std::shared_ptr<DeviceAllocator> allocator;
};

/// One view of a multi-crop batch on the device (loader::LoaderOptions::views): as
/// EngineBatch::images, [size, 3, height, width] of the batch's dtype and layout.
struct EngineView {
  std::shared_ptr<DeviceBuffer> images;
  int64_t height = 0, width = 0;
};

/// One batch on the device, ready on the stream passed to next().
struct EngineBatch {
  /// [size, 3, height, width] of `dtype`: NCHW-contiguous, or channels_last memory ([size, height,
  /// width, 3] in memory) when the options ask for it.
  std::shared_ptr<DeviceBuffer> images;
  std::shared_ptr<DeviceBuffer> labels;  ///< [size] int64
  OutputType dtype = OutputType::kFloat32;
  bool channels_last = false;
  int64_t size = 0, height = 0, width = 0;
  /// Multi-crop: the K views, in order, each copied and converted as `images` is (views[0].images
  /// is `images`); empty without views.
  std::vector<EngineView> views;
  int64_t epoch = 0;
  int64_t batch_index = 0;
  std::vector<int64_t> indices;                // dataset indices, sampler order
  std::vector<loader::SkippedSample> skipped;  // samples the skip policy replaced
  double wait_ms = 0;  ///< wall time next() blocked for this batch (data wait)
  /// decode_device gpu/auto: the share of rows the loader now leaves to the GPU, and the engine's
  /// totals so far of samples the GPU decoded and of samples it could not (decoded on the CPU).
  double gpu_decode_share = 0;
  int64_t gpu_decoded_total = 0;
  int64_t gpu_fallbacks_total = 0;
  /// Marks on the copy stream before this batch's H2D copy and after its conversion.
  std::shared_ptr<const StreamMark> copy_begin, copy_end;
};

class CudaEngine {
 public:
  /// Throws std::invalid_argument for device_prefetch_depth < 1 or a null loader, and
  /// std::runtime_error when the build or the machine has no CUDA device `options.device`, or,
  /// under decode_device gpu/auto, when nvImageCodec cannot be loaded (naming the package).
  CudaEngine(std::shared_ptr<loader::Loader> loader, EngineOptions options);
  /// Waits for the copies still reading pinned slots, then destroys the stream and events.
  ~CudaEngine();
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  /// Starts the loader's epoch (loader::Loader::start_epoch) and drops anything staged.
  void start_epoch(int64_t epoch, int64_t start_batch = 0);
  /// The next batch, ready on `consumer` (the caller's current stream of options.device);
  /// std::nullopt at the epoch's end. Rethrows the loader's errors; throws std::runtime_error
  /// with CUDA's reason on a CUDA error.
  std::optional<EngineBatch> next(StreamHandle consumer);
  /// Waits up to `timeout` (0: does not wait) until next() can return without waiting for the
  /// loader (loader::Loader::wait_ready); true when it can.
  bool wait_ready(std::chrono::nanoseconds timeout);
  loader::Loader& loader();
  const EngineOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::device
