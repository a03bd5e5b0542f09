#include <chrono>
#include <stdexcept>

#include "gpufeed/prefetch/prefetcher.h"
#include "internal.h"

namespace gpufeed::prefetch {
namespace {

// The CPU path: the loader's own slots are the prefetch buffer, so next() converts the ready
// batch synchronously and releases its slot at once.
class CpuPrefetcher final : public Prefetcher {
 public:
  CpuPrefetcher(std::shared_ptr<loader::Loader> loader, PrefetchOptions options)
      : loader_(std::move(loader)), options_(options) {}

  void start_epoch(int64_t epoch, int64_t start_batch) override {
    loader_->start_epoch(epoch, start_batch);
  }

  std::optional<DeviceBatch> next() override {
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<loader::Batch> host = loader_->next();
    const double wait_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!host) return std::nullopt;
    DeviceBatch out = describe(*host);
    auto [images, labels] = as_tensors(*host);
    out.images = convert_images(images, options_.dtype, options_.channels_last, options_.normalize);
    out.labels = labels.clone();
    out.wait_ms = wait_ms;
    return out;  // `host` is released here: its slot returns to the loader's ring
  }

  bool wait_ready(std::chrono::nanoseconds timeout) override { return loader_->wait_ready(timeout); }

  loader::Loader& loader() override { return *loader_; }

 private:
  std::shared_ptr<loader::Loader> loader_;
  PrefetchOptions options_;
};

}  // namespace

DeviceBatch describe(const loader::Batch& host) {
  DeviceBatch out;
  out.epoch = host.epoch;
  out.batch_index = host.batch_index;
  out.indices = host.indices;
  out.skipped = host.skipped;
  return out;
}

std::unique_ptr<Prefetcher> make_cpu_prefetcher(std::shared_ptr<loader::Loader> loader,
                                                const PrefetchOptions& options) {
  return std::make_unique<CpuPrefetcher>(std::move(loader), options);
}

std::unique_ptr<Prefetcher> make_prefetcher(std::shared_ptr<loader::Loader> loader,
                                            const PrefetchOptions& options) {
  if (!loader) throw std::invalid_argument("make_prefetcher: loader is null");
  if (!loader->options().views.empty())
    throw std::invalid_argument(
        "make_prefetcher: the prefetcher yields one image tensor per batch; multi-crop views (LoaderOptions::views) "
        "are served by the Python package and by device::CudaEngine (EngineBatch::views)");
  if (options.device.is_cpu()) return make_cpu_prefetcher(std::move(loader), options);
  if (options.device.is_cuda()) return make_cuda_prefetcher(std::move(loader), options);
  throw std::runtime_error("make_prefetcher: unsupported device " + options.device.str());
}

}  // namespace gpufeed::prefetch
