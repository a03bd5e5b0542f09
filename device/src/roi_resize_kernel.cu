// The GPU decode path's resize (roi_resize.h): one thread per output pixel, one grid row per
// sample; reads the sample's decoded rectangle, writes its [S, S, 3] row of the batch.
#include <cuda_runtime.h>

#include "roi_resize.h"

namespace gpufeed::device::detail {
namespace {

__global__ void roi_resize(const RoiResizeJob* __restrict__ jobs) {
  const RoiResizeJob job = jobs[blockIdx.y];
  const int S = job.out_size;
  const int pixels = S * S;
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pixels; p += gridDim.x * blockDim.x) {
    resize_pixel(job, p % S, p / S);
  }
}

}  // namespace

int launch_roi_resize(const RoiResizeJob* jobs, int n, int max_side, void* stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int pixels = max_side * max_side;
  int blocks_x = (pixels + kThreads - 1) / kThreads;
  if (blocks_x > 1024) blocks_x = 1024;
  roi_resize<<<dim3(blocks_x, n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(jobs);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gpufeed::device::detail
