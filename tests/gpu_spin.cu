// A compute kernel of known duration for the overlap test: one block spins on the SM clock.
#include <cuda_runtime.h>

#include "gpu_spin.h"

namespace {

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t launch_spin(double ms, int clock_khz, cudaStream_t stream) {
  const long long cycles = static_cast<long long>(ms * clock_khz);
  spin<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}
