#pragma once
// Host batch -> tensors on the training device. Torch enters the house here: the loader's slots
// are wrapped as tensors without copying, converted uint8 NHWC -> float NCHW (or channels_last),
// and normalised with mean/std. The CUDA implementation is the device room's torch-free engine
// (gpufeed/device/engine.h: its copy stream, events and fused kernel) with device memory from
// torch's caching allocator; the CPU implementation runs the same API synchronously, so the
// harness has one code path.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "gpufeed/device/cuda.h"
#include "gpufeed/device/normalize.h"
#include "gpufeed/loader/loader.h"

namespace gpufeed::prefetch {

/// Normalisation applied to x / 255: (x / 255 - mean) / std, per RGB channel (the device room's:
/// ImageNet's statistics by default).
using NormalizeOptions = device::NormalizeOptions;

/// Prefetcher options.
struct PrefetchOptions {
  c10::Device device{c10::kCPU};            ///< "cpu" or "cuda:N" (CUDA_VISIBLE_DEVICES applies)
  c10::ScalarType dtype = c10::kFloat;      ///< kFloat, kBFloat16 or kHalf; kByte skips normalising
  bool channels_last = false;               ///< NHWC strides on a [N, 3, H, W] tensor
  NormalizeOptions normalize{};
  /// CUDA: batches staged on the device ahead of the consumer (their H2D copy and conversion in
  /// flight or done); each holds its loader slot until its copy completed. The CPU path converts
  /// on demand and ignores it. (Not the loader's prefetch_depth, which counts host slots.)
  int device_prefetch_depth = 2;
};

/// A point on a CUDA stream's timeline (gpufeed/device/cuda.h).
using StreamMark = device::StreamMark;

/// Records a mark on `device`'s current CUDA stream. Throws std::runtime_error for a non-CUDA
/// device or a build without the CUDA path.
std::shared_ptr<StreamMark> record_stream_mark(const c10::Device& device);

/// `device`'s current CUDA stream (c10::cuda::getCurrentCUDAStream) as a device::StreamHandle;
/// nullptr (the legacy default stream) for the CPU or a build without the CUDA path.
device::StreamHandle current_stream(const c10::Device& device);

/// One batch on the device, ready for the model.
struct DeviceBatch {
  at::Tensor images;  ///< [N, 3, H, W] dtype (normalised), contiguous or channels_last
  at::Tensor labels;  ///< [N] int64
  int64_t epoch = 0;
  int64_t batch_index = 0;
  std::vector<int64_t> indices;                  ///< dataset indices, sampler order
  std::vector<loader::SkippedSample> skipped;    ///< samples the skip policy replaced
  double wait_ms = 0;  ///< wall time next() blocked for this batch (data wait)
  /// CUDA path: marks on the copy stream before this batch's H2D copy and after its conversion;
  /// null on the CPU path (where the conversion is part of next()'s wall time).
  std::shared_ptr<const StreamMark> copy_begin, copy_end;
};

/// Wraps a host batch's slot as tensors without copying: images [N, H, W, 3] uint8, labels [N]
/// int64, on the CPU. The tensors do not own the memory: keep the Batch alive while they are used.
std::pair<at::Tensor, at::Tensor> as_tensors(const loader::Batch& batch);

/// uint8 [N, H, W, 3] (any device) -> [N, 3, H, W] `dtype`, (x/255 - mean)/std, laid out NCHW
/// contiguous or channels_last. On CUDA one fused kernel (reads the batch once, writes the result
/// once); on the CPU four elementwise passes (copy to float32 in the target layout, multiply,
/// subtract, and a cast for bfloat16/float16), with the same float32 arithmetic, so float32
/// results are bit-identical across devices. For kByte, only the permute and layout are applied.
at::Tensor convert_images(const at::Tensor& nhwc_u8, c10::ScalarType dtype, bool channels_last,
                          const NormalizeOptions& normalize);

/// Batches from a Loader, on a device.
class Prefetcher {
 public:
  virtual ~Prefetcher() = default;
  /// Starts the loader's epoch (see loader::Loader::start_epoch) and drops anything prefetched.
  virtual void start_epoch(int64_t epoch, int64_t start_batch = 0) = 0;
  /// The next batch, ready to use on the caller's current stream; std::nullopt at epoch end.
  /// Rethrows the loader's errors.
  virtual std::optional<DeviceBatch> next() = 0;
  /// Waits up to `timeout` (0: does not wait) until next() can return without waiting for the
  /// loader (see loader::Loader::wait_ready); true when it can.
  virtual bool wait_ready(std::chrono::nanoseconds timeout) = 0;
  /// The loader behind this prefetcher.
  virtual loader::Loader& loader() = 0;
};

/// The host allocator slots should come from for `device`: page-locked (cudaHostAlloc) memory for
/// CUDA, so copies are asynchronous; plain aligned memory for the CPU.
/// Throws std::runtime_error for a CUDA device in a build without the CUDA path.
std::shared_ptr<loader::HostAllocator> host_allocator_for(const c10::Device& device);

/// A CpuPrefetcher for CPU devices, a CudaPrefetcher (copy stream, events) for CUDA devices.
/// Throws std::runtime_error when a CUDA device is asked for and the build or machine has none.
std::unique_ptr<Prefetcher> make_prefetcher(std::shared_ptr<loader::Loader> loader,
                                            const PrefetchOptions& options);

/// True when this build has the CUDA path and a CUDA device is visible.
bool cuda_available();

}  // namespace gpufeed::prefetch
