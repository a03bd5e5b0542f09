// The resize's portable SIMD kernels, written with Google Highway: one 128-bit target per build
// (hwy_target.h: NEON on aarch64, SSE4 on x86, where the auto choice stays the hand-written
// AVX2/AVX-512 kernels of resize.cpp).
//
// Arithmetic: pixels widened u8 -> i16 -> i32, multiplied by the int16 weights in int32 (what
// clang makes one smlal of on NEON), summed with kRound, shifted right arithmetically by 14, then
// narrowed i32 -> i16 -> u8 with saturation (negatives to 0, above 255 to 255): clip8 of
// resize.cpp. The horizontal pass keeps each channel's even and odd taps in separate lanes and
// adds them once per pixel; integer sums, so the order changes nothing and the bytes are the
// scalar kernels' (tests/test_resize.cpp).

#include "resize_hwy.h"

#include <cstring>

#include "hwy_target.h"

#if GPUFEED_HWY_128
HWY_BEFORE_NAMESPACE();
namespace gpufeed::transforms::hwy_resize {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kPrecisionBits = 14;
constexpr int32_t kRound = 1 << (kPrecisionBits - 1);

using D8 = hn::Full128<uint8_t>;
using D16 = hn::Full128<int16_t>;
using D32 = hn::Full128<int32_t>;
using V32 = hn::Vec128<int32_t>;

// Four vectors of int32 sums (pixel bytes in order) to 16 bytes: shifted, saturated to int16,
// then to uint8 (clip8).
HWY_INLINE hn::Vec128<uint8_t> narrow(V32 a0, V32 a1, V32 a2, V32 a3) {
  const D8 d8;
  const D16 d16;
  const hn::Half<D8> d8h;
  const hn::Half<D16> d16h;
  const auto w01 = hn::Combine(d16, hn::DemoteTo(d16h, hn::ShiftRight<kPrecisionBits>(a1)),
                               hn::DemoteTo(d16h, hn::ShiftRight<kPrecisionBits>(a0)));
  const auto w23 = hn::Combine(d16, hn::DemoteTo(d16h, hn::ShiftRight<kPrecisionBits>(a3)),
                               hn::DemoteTo(d16h, hn::ShiftRight<kPrecisionBits>(a2)));
  return hn::Combine(d8, hn::DemoteTo(d8h, w23), hn::DemoteTo(d8h, w01));
}

// 16 bytes of output at byte i.
HWY_INLINE void vertical_chunk(const uint8_t* const* rows, const int16_t* c, int count, size_t i,
                               uint8_t* out) {
  const D8 d8;
  const D16 d16;
  const D32 d32;
  const hn::Half<D8> d8h;
  const hn::Half<D16> d16h;
  V32 acc0 = hn::Set(d32, kRound), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int k = 0; k < count; ++k) {
    const auto v = hn::LoadU(d8, rows[k] + i);
    const auto lo = hn::PromoteTo(d16, hn::LowerHalf(d8h, v));  // bytes 0-7
    const auto hi = hn::PromoteTo(d16, hn::UpperHalf(d8h, v));  // bytes 8-15
    const V32 w = hn::Set(d32, c[k]);
    acc0 = hn::Add(acc0, hn::Mul(hn::PromoteTo(d32, hn::LowerHalf(d16h, lo)), w));
    acc1 = hn::Add(acc1, hn::Mul(hn::PromoteTo(d32, hn::UpperHalf(d16h, lo)), w));
    acc2 = hn::Add(acc2, hn::Mul(hn::PromoteTo(d32, hn::LowerHalf(d16h, hi)), w));
    acc3 = hn::Add(acc3, hn::Mul(hn::PromoteTo(d32, hn::UpperHalf(d16h, hi)), w));
  }
  hn::StoreU(narrow(acc0, acc1, acc2, acc3), d8, out + i);
}

bool vertical(const uint8_t* const* rows, const int16_t* c, int count, size_t n, uint8_t* out) {
  constexpr size_t kBytes = 16;
  if (n < kBytes) return false;
  size_t i = 0;
  for (; i + kBytes <= n; i += kBytes) vertical_chunk(rows, c, count, i, out);
  // The tail: the last 16 bytes again (overlapping writes of identical values).
  if (i < n) vertical_chunk(rows, c, count, n - kBytes, out);
  return true;
}

// Byte shuffles of a 16-byte load of four taps' pixels: taps 0 and 1 (bytes 0-5), or 2 and 3
// (bytes 6-11), into int16 words r0 r1 g0 g1 b0 b1 0 0; 0x80 selects zero.
alignas(16) constexpr uint8_t kTaps01[16] = {0, 0x80, 3, 0x80, 1,    0x80, 4,    0x80,
                                             2, 0x80, 5, 0x80, 0x80, 0x80, 0x80, 0x80};
alignas(16) constexpr uint8_t kTaps23[16] = {6, 0x80, 9,  0x80, 7,    0x80, 10,   0x80,
                                             8, 0x80, 11, 0x80, 0x80, 0x80, 0x80, 0x80};
// [r g b 0] x 4 -> 12 packed bytes.
alignas(16) constexpr uint8_t kCompact[16] = {0,  1,  2,  4,  5,    6,    8,    9,
                                              10, 12, 13, 14, 0x80, 0x80, 0x80, 0x80};

// Words r0 r1 g0 g1 b0 b1 0 0 times weights c0 c1 c0 c1 c0 c1 0 0, widened to int32 and added
// to `lo` (r0 c0, r1 c1, g0 c0, g1 c1) and `hi` (b0 c0, b1 c1, 0, 0). NEON: two smlal.
HWY_INLINE void multiply_add_pair(hn::Vec128<int16_t> x, hn::Vec128<int16_t> w, V32& lo, V32& hi) {
  const D32 d32;
  const hn::Half<D16> d16h;
  lo = hn::Add(lo, hn::Mul(hn::PromoteTo(d32, hn::LowerHalf(d16h, x)),
                           hn::PromoteTo(d32, hn::LowerHalf(d16h, w))));
  hi = hn::Add(hi, hn::Mul(hn::PromoteTo(d32, hn::UpperHalf(d16h, x)),
                           hn::PromoteTo(d32, hn::UpperHalf(d16h, w))));
}

// One output pixel's sums [r g b 0] (from kRound): per group of four taps one 16-byte load and
// two pairs of taps; `w` holds the pixel's weights as pair_coeffs (8 words per pair of taps).
HWY_INLINE V32 horizontal_pixel(const uint8_t* p, const int16_t* w, int groups) {
  const D8 d8;
  const D16 d16;
  const D32 d32;
  const auto taps01 = hn::Load(d8, kTaps01), taps23 = hn::Load(d8, kTaps23);
  V32 lo = hn::Zero(d32), hi = lo;
  for (int g = 0; g < groups; ++g, p += 12, w += 16) {
    const auto v = hn::LoadU(d8, p);
    multiply_add_pair(hn::BitCast(d16, hn::TableLookupBytesOr0(v, taps01)), hn::Load(d16, w), lo,
                      hi);
    multiply_add_pair(hn::BitCast(d16, hn::TableLookupBytesOr0(v, taps23)), hn::Load(d16, w + 8),
                      lo, hi);
  }
  // Each channel's two lanes added: [r g b 0].
  const V32 sum = hn::Add(hn::ConcatEven(d32, hi, lo), hn::ConcatOdd(d32, hi, lo));
  return hn::Add(sum, hn::Set(d32, kRound));
}

void horizontal(const uint8_t* row, const int* offsets, const int16_t* pair_coeffs, int taps,
                int width, uint8_t* out) {
  const D8 d8;
  const auto compact = hn::Load(d8, kCompact);
  const int groups = taps / 4;
  const auto weights = [&](int j) {  // pixel j's, the last pixel's past the row's end
    return pair_coeffs + static_cast<size_t>(j < width ? j : width - 1) * (taps / 2) * 8;
  };
  // Four pixels per step, their 12 bytes in one store.
  for (int j0 = 0; j0 < width; j0 += 4) {
    const V32 a0 = horizontal_pixel(row + offsets[j0], weights(j0), groups);
    const V32 a1 = horizontal_pixel(row + offsets[j0 + 1], weights(j0 + 1), groups);
    const V32 a2 = horizontal_pixel(row + offsets[j0 + 2], weights(j0 + 2), groups);
    const V32 a3 = horizontal_pixel(row + offsets[j0 + 3], weights(j0 + 3), groups);
    const auto px = hn::TableLookupBytesOr0(narrow(a0, a1, a2, a3), compact);
    uint8_t* d = out + static_cast<size_t>(j0) * 3;
    if (j0 + 6 <= width) {
      hn::StoreU(px, d8, d);  // 4 bytes spill into the next pixels, written after
    } else {
      alignas(16) uint8_t tmp[16];
      hn::Store(px, d8, tmp);
      std::memcpy(d, tmp, static_cast<size_t>(width - j0 < 4 ? width - j0 : 4) * 3);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace gpufeed::transforms::hwy_resize
HWY_AFTER_NAMESPACE();
#endif  // GPUFEED_HWY_128

namespace gpufeed::transforms::hwy_resize {

#if GPUFEED_HWY_128

bool available() { return hwy_128_available(); }

bool vertical(const uint8_t* const* rows, const int16_t* c, int count, size_t n, uint8_t* out) {
  return HWY_NAMESPACE::vertical(rows, c, count, n, out);
}

void horizontal(const uint8_t* row, const int* offsets, const int16_t* pair_coeffs, int taps,
                int width, uint8_t* out) {
  HWY_NAMESPACE::horizontal(row, offsets, pair_coeffs, taps, width, out);
}

#else  // no 128-bit Highway target in this build: Resizer::supported(kHighway) is false

bool available() { return false; }
bool vertical(const uint8_t* const*, const int16_t*, int, size_t, uint8_t*) { return false; }
void horizontal(const uint8_t*, const int*, const int16_t*, int, int, uint8_t*) {}

#endif

}  // namespace gpufeed::transforms::hwy_resize
