// uint8 NHWC -> normalised float/bf16/fp16 (or uint8, laid out only) NCHW or channels_last, in one pass over device memory:
// each thread reads one pixel's 3 bytes once and writes its 3 outputs, so the conversion costs one
// read of the uint8 batch and one write of the result (torch ops would make 2-3 passes).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernel_launch.h"

namespace gpufeed::device::detail {
namespace {

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline uint8_t from_float<uint8_t>(float v) { return static_cast<uint8_t>(v); }
template <>
__device__ inline float from_float<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ inline __half from_float<__half>(float v) { return __float2half_rn(v); }

template <typename T, bool kChannelsLast>
__global__ void normalize_nhwc(const uint8_t* __restrict__ src, T* __restrict__ dst, int64_t pixels,
                               int64_t plane, float3 scale, float3 shift) {
  // pixels = N*H*W; plane = H*W (one image's pixels).
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pixels;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t* px = src + p * 3;
    if constexpr (std::is_same_v<T, uint8_t>) {  // layout only: the values pass through
      const int64_t n = p / plane, q = p - n * plane;
      T* out = dst + n * 3 * plane + q;
      out[0] = px[0];
      out[plane] = px[1];
      out[2 * plane] = px[2];
      continue;
    }
    // Explicit round-to-nearest multiply then subtract (no FMA contraction), the same two
    // roundings as the CPU path's mul_ then sub_: float32 results are bit-identical.
    const float r = __fsub_rn(__fmul_rn(px[0], scale.x), shift.x);
    const float g = __fsub_rn(__fmul_rn(px[1], scale.y), shift.y);
    const float b = __fsub_rn(__fmul_rn(px[2], scale.z), shift.z);
    if constexpr (kChannelsLast) {
      T* out = dst + p * 3;
      out[0] = from_float<T>(r);
      out[1] = from_float<T>(g);
      out[2] = from_float<T>(b);
    } else {
      const int64_t n = p / plane, q = p - n * plane;
      T* out = dst + n * 3 * plane + q;
      out[0] = from_float<T>(r);
      out[plane] = from_float<T>(g);
      out[2 * plane] = from_float<T>(b);
    }
  }
}

template <typename T>
cudaError_t launch_typed(const uint8_t* src, void* dst, int64_t n, int64_t h, int64_t w,
                         bool channels_last, const float scale[3], const float shift[3],
                         cudaStream_t stream) {
  const int64_t pixels = n * h * w;
  if (pixels == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks64 = (pixels + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks64 < 65535 * 8 ? blocks64 : 65535 * 8);
  const float3 sc = make_float3(scale[0], scale[1], scale[2]);
  const float3 sh = make_float3(shift[0], shift[1], shift[2]);
  if (channels_last) {
    normalize_nhwc<T, true><<<blocks, kThreads, 0, stream>>>(src, static_cast<T*>(dst), pixels, h * w, sc, sh);
  } else {
    normalize_nhwc<T, false><<<blocks, kThreads, 0, stream>>>(src, static_cast<T*>(dst), pixels, h * w, sc, sh);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_normalize(const uint8_t* src, void* dst, OutputType type, int64_t n, int64_t h,
                             int64_t w, bool channels_last, const float scale[3],
                             const float shift[3], cudaStream_t stream) {
  switch (type) {
    case OutputType::kUInt8:
      if (channels_last) {  // the slot's own layout: a plain copy
        return cudaMemcpyAsync(dst, src, static_cast<size_t>(n * h * w * 3), cudaMemcpyDeviceToDevice, stream);
      }
      return launch_typed<uint8_t>(src, dst, n, h, w, /*channels_last=*/false, scale, shift, stream);
    case OutputType::kFloat32:
      return launch_typed<float>(src, dst, n, h, w, channels_last, scale, shift, stream);
    case OutputType::kBFloat16:
      return launch_typed<__nv_bfloat16>(src, dst, n, h, w, channels_last, scale, shift, stream);
    case OutputType::kFloat16:
      return launch_typed<__half>(src, dst, n, h, w, channels_last, scale, shift, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpufeed::device::detail
