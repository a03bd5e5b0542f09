#pragma once
// The Highway kernels of gaussian_blur's convolution and the affine warp's bilinear sampling
// (augment_hwy.cpp), private to augment.cpp: the scalar loops' float32 operations, fused
// multiply-adds included, in the same order on 128-bit vectors, so the same bytes. NEON on
// aarch64; on x86 Highway's AVX2 target with 128-bit vectors (hwy_target.h: GPUFEED_HWY_FUSED).

#include <array>
#include <cstddef>
#include <cstdint>

namespace gpufeed::transforms {

// The affine grid of torchvision's _affine_grid in float32: the grid point of output (x, y) is
// base (x - (W-1)/2, y - (H-1)/2, 1) times theta^T / (W/2, H/2), the bmm's products summed
// unfused, (bx * a + by * b) + c (ATen's result, checked against _affine_grid's output):
// gx = (col_x[x] + row_x(y)) + xc, gy = (col_y[x] + row_y(y)) + yc. Built in augment.cpp.
struct AffineGrid {
  float xb, xc, yb, yc, y0;
  const float* col_x;  // bx * a per column, computed once (the same float products per pixel)
  const float* col_y;

  AffineGrid(int height, int width, const std::array<double, 6>& matrix);
  float row_x(int y) const { return (y0 + static_cast<float>(y)) * xb; }
  float row_y(int y) const { return (y0 + static_cast<float>(y)) * yb; }
};

namespace hwy_augment {

/// Whether this build has the kernels (aarch64, x86) and this CPU runs them (x86: AVX2 and FMA).
bool available();

/// The first values of gaussian_blur's output row (blur_row_scalar, augment.cpp): row[n] = the
/// fused multiply-adds from 0 of kernel[i * k + j] * padded[i * padded_row + j * 3 + n] over the
/// k x k taps in row-major order. Blocks of 32 values, then of 4, each block's sums in registers
/// through all taps. Returns the values done (n_values rounded down to a multiple of 4); the
/// caller does the rest.
size_t blur_row(const float* padded, size_t padded_row, const float* kernel, int k, size_t n_values,
                float* row);

/// Columns [0, returned) of every output row of grid_bilinear_body (augment.cpp), 4 per step:
/// the returned count is width rounded down to a multiple of 4; the caller does the rest.
/// `padded` is the image with its one-pixel black border and 4 spare bytes at the end (the
/// 32-bit tap loads).
int grid_bilinear(uint8_t* image, int height, int width, const AffineGrid& g,
                  const uint8_t* padded);

}  // namespace hwy_augment
}  // namespace gpufeed::transforms
