// The CUDA path: the device room's engine (copy stream, events, fused kernel), with device memory
// from torch's caching allocator so the batches are ordinary tensors.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "gpufeed/device/engine.h"
#include "gpufeed/prefetch/prefetcher.h"
#include "internal.h"

namespace gpufeed::prefetch {
namespace {

// A byte tensor from the caching allocator, allocated on the engine's copy stream.
class TorchBuffer final : public device::DeviceBuffer {
 public:
  explicit TorchBuffer(at::Tensor t) : tensor_(std::move(t)) {}
  void* data() const override { return tensor_.data_ptr(); }
  size_t bytes() const override { return static_cast<size_t>(tensor_.numel()); }
  // The caching allocator learns that the consumer's stream uses the memory, so it is not reused
  // while the step still reads it.
  void used_on(device::StreamHandle stream) override {
    c10::cuda::CUDACachingAllocator::recordStream(
        tensor_.storage().data_ptr(),
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), tensor_.device().index()));
  }
  const at::Tensor& tensor() const { return tensor_; }

 private:
  at::Tensor tensor_;
};

class TorchAllocator final : public device::DeviceAllocator {
 public:
  std::shared_ptr<device::DeviceBuffer> allocate(size_t bytes, int dev, device::StreamHandle stream) override {
    c10::cuda::CUDAStreamGuard guard(
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), static_cast<c10::DeviceIndex>(dev)));
    return std::make_shared<TorchBuffer>(
        at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, dev)));
  }
};

device::OutputType output_type(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kByte:
      return device::OutputType::kUInt8;
    case at::kFloat:
      return device::OutputType::kFloat32;
    case at::kBFloat16:
      return device::OutputType::kBFloat16;
    case at::kHalf:
      return device::OutputType::kFloat16;
    default:
      throw std::invalid_argument(std::string("CudaPrefetcher: unsupported dtype ") + c10::toString(dtype));
  }
}

const at::Tensor& tensor_of(const std::shared_ptr<device::DeviceBuffer>& b) {
  return static_cast<const TorchBuffer&>(*b).tensor();
}

class CudaPrefetcher final : public Prefetcher {
 public:
  // "cuda" without an index is resolved once, here: the engine and the consumer's stream agree.
  CudaPrefetcher(std::shared_ptr<loader::Loader> loader, const PrefetchOptions& options)
      : options_(resolved(options)), engine_(std::move(loader), engine_options(options_)) {}

  void start_epoch(int64_t epoch, int64_t start_batch) override { engine_.start_epoch(epoch, start_batch); }

  std::optional<DeviceBatch> next() override {
    std::optional<device::EngineBatch> b = engine_.next(current_stream(options_.device));
    if (!b) return std::nullopt;
    DeviceBatch out;
    out.epoch = b->epoch;
    out.batch_index = b->batch_index;
    out.indices = std::move(b->indices);
    out.skipped = std::move(b->skipped);
    out.wait_ms = b->wait_ms;
    out.copy_begin = b->copy_begin;
    out.copy_end = b->copy_end;
    // The byte buffers reinterpreted as the batch: [N, 3, H, W] (NCHW strides, or the NHWC
    // strides of channels_last memory) and [N] int64.
    const at::Tensor images = tensor_of(b->images).view(options_.dtype);
    out.images = b->channels_last ? images.view({b->size, b->height, b->width, 3}).permute({0, 3, 1, 2})
                                  : images.view({b->size, 3, b->height, b->width});
    out.labels = tensor_of(b->labels).view(at::kLong);
    return out;
  }

  bool wait_ready(std::chrono::nanoseconds timeout) override { return engine_.wait_ready(timeout); }

  loader::Loader& loader() override { return engine_.loader(); }

 private:
  static PrefetchOptions resolved(PrefetchOptions o) {
    if (!o.device.has_index()) o.device = c10::Device(c10::kCUDA, c10::cuda::current_device());
    return o;
  }

  static device::EngineOptions engine_options(const PrefetchOptions& o) {
    device::EngineOptions e;
    e.device = o.device.index();
    e.dtype = output_type(o.dtype);
    e.channels_last = o.channels_last;
    e.normalize = o.normalize;
    e.device_prefetch_depth = o.device_prefetch_depth;
    e.allocator = std::make_shared<TorchAllocator>();
    return e;
  }

  PrefetchOptions options_;
  device::CudaEngine engine_;
};

}  // namespace

std::shared_ptr<StreamMark> record_stream_mark(const c10::Device& device) {
  if (!device.is_cuda()) {
    throw std::runtime_error("record_stream_mark: " + device.str() + " is not a CUDA device");
  }
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  return device::record_stream_mark(index, current_stream(c10::Device(c10::kCUDA, index)));
}

device::StreamHandle current_stream(const c10::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return c10::cuda::getCurrentCUDAStream(device.has_index() ? device.index() : c10::cuda::current_device()).stream();
}

bool cuda_available() { return device::cuda_available(); }

std::shared_ptr<loader::HostAllocator> host_allocator_for(const c10::Device& device) {
  if (device.is_cuda()) return device::pinned_host_allocator();
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
