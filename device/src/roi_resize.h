#pragma once
// One output pixel of the GPU decode path's resize, shared by the CUDA kernel (roi_resize_kernel.cu)
// and the host loop of the CPU-only backend (gpu_decode.cpp), so both compute the same bytes.
//
// The filter is PIL's antialiased resample (the one torchvision's RandomResizedCrop and Resize use on
// PIL images): for output pixel i along an axis, scale = region / S, support = filter support *
// max(scale, 1), centre = region start + (i + 0.5) * scale, taps j in [floor(centre - support + 0.5),
// floor(centre + support + 0.5)) clamped to the decoded rectangle, weights filter((j - centre + 0.5) /
// max(scale, 1)) normalised to sum 1. PIL resamples one axis, rounds to uint8, then the other; this
// computes the 2D sum in float and rounds once, so values differ from the CPU path by a level or two
// where PIL's intermediate rounding moves them (docs/PERFORMANCE.md has the measured differences).
// Plain C++17 with CUDA's qualifiers when nvcc compiles it.
#include <cstdint>

#if defined(__CUDACC__)
#define GPUFEED_HD __host__ __device__
#else
#define GPUFEED_HD
#endif

namespace gpufeed::device::detail {

/// One sample's resize: the decoded rectangle (interleaved RGB rows) -> [S, S, 3] uint8.
struct RoiResizeJob {
  const uint8_t* src = nullptr;  ///< the decoded pixels, interleaved RGB, rows src_stride bytes apart
  int64_t src_stride = 0;
  int src_x = 0, src_y = 0;  ///< source pixel of src's first byte: the region's corner, or 0, 0 for a whole image
  int roi_x = 0, roi_y = 0, roi_w = 0, roi_h = 0;  ///< the rectangle the taps stay in, source pixels
  float rx0 = 0, ry0 = 0, rw = 0, rh = 0;          ///< region mapped onto the output, source pixels
  int out_size = 0;
  int flip = 0;     ///< mirror left-right
  int bicubic = 0;  ///< 0 bilinear (support 1), 1 bicubic a = -0.5 (support 2)
  uint8_t* dst = nullptr;  ///< [S, S, 3] uint8
};

GPUFEED_HD inline float resize_filter(float x, int bicubic) {
  x = x < 0 ? -x : x;
  if (!bicubic) return x < 1.0f ? 1.0f - x : 0.0f;
  const float a = -0.5f;
  if (x < 1.0f) return ((a + 2.0f) * x - (a + 3.0f)) * x * x + 1.0f;
  if (x < 2.0f) return (((x - 5.0f) * x + 8.0f) * x - 4.0f) * a;
  return 0.0f;
}

/// The taps of output pixel i along one axis: first tap `lo_tap`, `count` taps, centre and
/// 1 / max(scale, 1) for the weights. Taps stop at [lo, hi) (the decoded rectangle).
struct AxisTaps {
  int first = 0, count = 0;
  float centre = 0, inv = 1;
};

GPUFEED_HD inline AxisTaps axis_taps(float r0, float rl, int out, int i, int lo, int hi, int bicubic) {
  const float scale = rl / static_cast<float>(out);
  const float fscale = scale > 1.0f ? scale : 1.0f;
  const float support = (bicubic ? 2.0f : 1.0f) * fscale;
  AxisTaps t;
  t.centre = r0 + (static_cast<float>(i) + 0.5f) * scale;
  t.inv = 1.0f / fscale;
  int a = static_cast<int>(t.centre - support + 0.5f);
  if (t.centre - support + 0.5f < 0) a = 0;  // truncation toward zero, as PIL; below 0 clamps anyway
  int b = static_cast<int>(t.centre + support + 0.5f);
  if (a < lo) a = lo;
  if (b > hi) b = hi;
  t.first = a;
  t.count = b > a ? b - a : 0;
  return t;
}

/// Output pixel (ox, oy) of `job`: its 3 bytes at dst + (oy * S + ox) * 3.
GPUFEED_HD inline void resize_pixel(const RoiResizeJob& job, int ox, int oy) {
  const int S = job.out_size;
  const int sx = job.flip ? S - 1 - ox : ox;  // mirrored after resizing: output column ox shows column S-1-ox
  const AxisTaps tx = axis_taps(job.rx0, job.rw, S, sx, job.roi_x, job.roi_x + job.roi_w, job.bicubic);
  const AxisTaps ty = axis_taps(job.ry0, job.rh, S, oy, job.roi_y, job.roi_y + job.roi_h, job.bicubic);
  float wsx = 0, wsy = 0;
  for (int k = 0; k < tx.count; ++k) wsx += resize_filter((static_cast<float>(tx.first + k) - tx.centre + 0.5f) * tx.inv, job.bicubic);
  for (int k = 0; k < ty.count; ++k) wsy += resize_filter((static_cast<float>(ty.first + k) - ty.centre + 0.5f) * ty.inv, job.bicubic);
  float acc[3] = {0, 0, 0};
  for (int ky = 0; ky < ty.count; ++ky) {
    const float wy = resize_filter((static_cast<float>(ty.first + ky) - ty.centre + 0.5f) * ty.inv, job.bicubic);
    if (wy == 0.0f) continue;
    const uint8_t* row = job.src + static_cast<int64_t>(ty.first + ky - job.src_y) * job.src_stride +
                         static_cast<int64_t>(tx.first - job.src_x) * 3;
    float racc[3] = {0, 0, 0};
    for (int kx = 0; kx < tx.count; ++kx) {
      const float wx = resize_filter((static_cast<float>(tx.first + kx) - tx.centre + 0.5f) * tx.inv, job.bicubic);
      racc[0] += wx * row[kx * 3 + 0];
      racc[1] += wx * row[kx * 3 + 1];
      racc[2] += wx * row[kx * 3 + 2];
    }
    acc[0] += wy * racc[0];
    acc[1] += wy * racc[1];
    acc[2] += wy * racc[2];
  }
  const float norm = (wsx != 0.0f && wsy != 0.0f) ? 1.0f / (wsx * wsy) : 0.0f;
  uint8_t* out = job.dst + (static_cast<int64_t>(oy) * S + ox) * 3;
  for (int c = 0; c < 3; ++c) {
    float v = acc[c] * norm + 0.5f;
    v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
    out[c] = static_cast<uint8_t>(v);
  }
}

/// Enqueues every job's pixels on `stream`: jobs is a device array of n jobs, max_side the largest
/// out_size among them. Returns the launch error (roi_resize_kernel.cu).
int launch_roi_resize(const RoiResizeJob* jobs, int n, int max_side, void* stream);

}  // namespace gpufeed::device::detail
