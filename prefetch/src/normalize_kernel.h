#pragma once
// Host-side entry of the fused normalisation kernel (normalize_kernel.cu). No torch here, so the
// .cu compiles with nvcc alone.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace gpufeed::prefetch::detail {

enum class OutputType { kFloat32, kBFloat16, kFloat16 };

/// src: [n, h, w, 3] uint8 on the device. dst: [n, 3, h, w] of `type`, NCHW-contiguous, or its
/// channels_last layout ([n, h, w, 3] in memory). out = src * scale[c] - shift[c], computed in
/// float32 and rounded to nearest. Enqueued on `stream`; returns the launch error, if any.
cudaError_t launch_normalize(const uint8_t* src, void* dst, OutputType type, int64_t n, int64_t h,
                             int64_t w, bool channels_last, const float scale[3],
                             const float shift[3], cudaStream_t stream);

}  // namespace gpufeed::prefetch::detail
