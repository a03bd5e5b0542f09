#pragma once
// The Highway kernels of adjust_saturation, adjust_contrast and adjust_hue (colour_hwy.cpp),
// private to augment.cpp: the scalar loops' float and double operations in the same order on
// 128-bit vectors, so the same bytes. NEON on aarch64; on x86 Highway's SSE4 target (hwy_target.h).

#include <cstddef>
#include <cstdint>

namespace gpufeed::transforms::hwy_colour {

/// Whether this build has the kernels (aarch64, x86) and this CPU runs them (x86: SSE4.2).
bool available();

/// adjust_saturation's blend of the first pixels of the RGB `image` (n pixels), 16 per step,
/// with ratio = float(factor) and alpha = float(1 - factor). Returns the pixels done (a multiple
/// of 16); the caller does the rest.
size_t adjust_saturation(uint8_t* image, size_t n, float ratio, float alpha);

/// The sum of GrayTables::gray_floor (augment.cpp) over the first pixels of `image`, 16 per
/// step; `done` the pixels summed (a multiple of 16).
int64_t gray_sum(const uint8_t* image, size_t n, size_t& done);

/// adjust_hue of the first pixels of the RGB `image` (n pixels), 16 per step, with hue =
/// float(factor), factor in [-0.5, 0.5]. Returns the pixels done (a multiple of 16); the caller
/// does the rest.
size_t adjust_hue(uint8_t* image, size_t n, float hue);

}  // namespace gpufeed::transforms::hwy_colour
