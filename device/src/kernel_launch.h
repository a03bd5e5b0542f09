#pragma once
// The kernel's host entry (normalize_kernel.cu), for normalize.cpp only: nvcc compiles the .cu as
// C++17 with CUDA's headers alone, so the public C++20 headers stay out of it.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace gpufeed::device::detail {

enum class OutputType { kUInt8, kFloat32, kBFloat16, kFloat16 };

/// src: [n, h, w, 3] uint8 on the device. dst: [n, 3, h, w] of `type`, NCHW-contiguous, or its
/// channels_last layout ([n, h, w, 3] in memory). out = src * scale[c] - shift[c], computed in
/// float32 and rounded to nearest (kUInt8: src's values). Enqueued on `stream`; returns the launch
/// error, if any.
cudaError_t launch_normalize(const uint8_t* src, void* dst, OutputType type, int64_t n, int64_t h,
                             int64_t w, bool channels_last, const float scale[3],
                             const float shift[3], cudaStream_t stream);

}  // namespace gpufeed::device::detail
