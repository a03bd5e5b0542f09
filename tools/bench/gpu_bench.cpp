// gpufeed_gpu_bench: host-to-device bandwidth from the loader's pinned slots, next to a plain
// cudaMemcpyAsync peak from cudaHostAlloc memory measured in the same run. Prints one JSON object.
// Runs on the GPU machine (tools/gpu_check.sh); exits 2 with a message where no GPU is visible.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "gpufeed/loader/batch.h"
#include "gpufeed/json_text.h"
#include "gpufeed/prefetch/prefetcher.h"

namespace {

double gb_per_s(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  using namespace gpufeed;
  if (!prefetch::cuda_available()) {
    std::fprintf(stderr, "gpufeed_gpu_bench: no CUDA device visible\n");
    return 2;
  }
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 256;
  const int64_t side = argc > 2 ? std::atoll(argv[2]) : 224;
  const int reps = 20;
  const auto bytes = static_cast<size_t>(batch * side * side * 3);
  c10::Device device("cuda:0");
  c10::cuda::CUDAGuard guard(device);
  auto stream = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard sguard(stream);

  // Peak: raw cudaMemcpyAsync from page-locked memory into a preallocated device buffer.
  auto alloc = prefetch::host_allocator_for(device);
  void* host = alloc->allocate(bytes);
  std::memset(host, 7, bytes);
  void* dev = nullptr;
  if (cudaMalloc(&dev, bytes) != cudaSuccess) return 3;
  at::cuda::CUDAEvent a(cudaEventDefault), b(cudaEventDefault);  // timing events
  cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream.stream());  // warm-up
  a.record(stream);
  for (int r = 0; r < reps; ++r) cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream.stream());
  b.record(stream);
  b.synchronize();
  const double peak = gb_per_s(static_cast<double>(bytes) * reps, a.elapsed_time(b));

  // The prefetcher's path: a slot wrapped as a tensor (no copy) and .to(device, non_blocking).
  loader::Batch slot;
  slot.images = static_cast<uint8_t*>(host);
  slot.size = batch;
  slot.height = slot.width = side;
  std::vector<int64_t> labels(static_cast<size_t>(batch), 1);
  slot.labels = labels.data();
  auto [images, lab] = prefetch::as_tensors(slot);
  auto opts = at::TensorOptions().device(device).dtype(at::kByte);
  (void)images.to(opts, /*non_blocking=*/true);
  at::cuda::CUDAEvent c(cudaEventDefault), d(cudaEventDefault);  // timing events
  c.record(stream);
  for (int r = 0; r < reps; ++r) (void)images.to(opts, /*non_blocking=*/true);
  d.record(stream);
  d.synchronize();
  const double slots = gb_per_s(static_cast<double>(bytes) * reps, c.elapsed_time(d));

  // Conversion: the fused kernel on a device batch, bf16 channels_last.
  at::Tensor on_dev = images.to(opts);
  (void)prefetch::convert_images(on_dev, at::kBFloat16, true, {});
  at::cuda::CUDAEvent e(cudaEventDefault), f(cudaEventDefault);  // timing events
  e.record(stream);
  for (int r = 0; r < reps; ++r) (void)prefetch::convert_images(on_dev, at::kBFloat16, true, {});
  f.record(stream);
  f.synchronize();
  const double convert_ms = e.elapsed_time(f) / reps;

  nlohmann::json j = {{"batch", batch}, {"side", side}, {"bytes", bytes},
                      {"memcpy_peak_gb_per_s", peak}, {"slot_h2d_gb_per_s", slots},
                      {"slot_over_peak", slots / peak}, {"convert_bf16_cl_ms", convert_ms},
                      {"convert_gb_per_s", gb_per_s(static_cast<double>(bytes) * 3, convert_ms)}};
  std::printf("%s\n", gpufeed::json_text(j, 2).c_str());
  cudaFree(dev);
  alloc->deallocate(host, bytes);
  return 0;
}
