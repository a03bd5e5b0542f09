#pragma once
// The Highway kernels of the resize (resize_hwy.cpp), private to resize.cpp: the same integer
// sums as its scalar kernels (14-bit weights, kRound, arithmetic shift, clip to [0, 255]), 128-bit
// vectors. NEON on aarch64; on x86 Highway's SSE4 target (see hwy_target.h).

#include <cstddef>
#include <cstdint>

namespace gpufeed::transforms::hwy_resize {

/// Whether this build has the kernels (aarch64, x86) and this CPU runs them (x86: SSE4.2).
bool available();

/// out[i] = clip8(round + sum_k c[k] * rows[k][i]) for i < n bytes. Returns false, writing
/// nothing, when n is below one vector (16 bytes): the caller runs the scalar kernel then.
bool vertical(const uint8_t* const* rows, const int16_t* c, int count, size_t n, uint8_t* out);

/// One output row of `width` RGB pixels: pixel j = sum over k < taps of weight k * the row's
/// pixel at byte offsets[j] + 3 k, the weights of taps (2i, 2i + 1) in pair_coeffs[(j * taps / 2 +
/// i) * 8 ...] as c0 c1 c0 c1 c0 c1 0 0 (Resizer::prepare_lane_coeffs with one lane; 16-byte
/// aligned). `taps` is a multiple of four; `offsets` has a multiple of four entries (>= width);
/// the row is readable 16 bytes past the last group of taps. Writes only the row's width * 3
/// bytes.
void horizontal(const uint8_t* row, const int* offsets, const int16_t* pair_coeffs, int taps,
                int width, uint8_t* out);

}  // namespace gpufeed::transforms::hwy_resize
