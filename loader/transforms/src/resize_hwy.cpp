// The resize's portable SIMD kernels, written with Google Highway (header-only: static dispatch,
// nothing of libhwy is linked). One 128-bit target per build:
//  - aarch64: HWY_STATIC_TARGET, NEON (the baseline of every aarch64 CPU, Grace included);
//  - x86: HWY_SSE4, compiled under Highway's own target pragmas and run only where CPUID reports
//    SSE4.2. Highway 1.0.3's static target for the x86-64 baseline is HWY_SCALAR (one lane: it has
//    no SSE2 target, and it turns EMU128 off for GCC < 12.3), which would not run the 128-bit
//    code that aarch64 runs; SSE4 does, so x86 machines test these kernels natively. The x86
//    auto choice stays the hand-written AVX2/AVX-512 kernels (resize.cpp).
// Elsewhere (another architecture) the kernels are not built and available() says no.
//
// Arithmetic: pixels widened u8 -> i16 -> i32, multiplied by the int16 weights in int32 and
// summed from kRound, shifted right arithmetically by 14, then narrowed i32 -> i16 -> u8 with
// saturation (negatives to 0, above 255 to 255): clip8 of resize.cpp, so the bytes are the scalar
// kernels' (tests/test_resize.cpp).

#include "resize_hwy.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include "gpufeed/cpu_features.h"
// SSE4 without PCLMUL and AES (these kernels use neither): the CPU check is SSE4.2 alone.
#define HWY_DISABLE_PCLMUL_AES 1
#endif

#include <hwy/highway.h>

#if HWY_ARCH_X86
// Highway's headers again for its SSE4 target, as hwy/foreach_target.h includes them per target.
#undef HWY_TARGET
#define HWY_TARGET HWY_SSE4
#ifdef HWY_TARGET_TOGGLE
#undef HWY_TARGET_TOGGLE
#else
#define HWY_TARGET_TOGGLE
#endif
#include <hwy/highway.h>
#endif

#if HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_SSE4
#define GPUFEED_RESIZE_HWY 1
#endif

#if GPUFEED_RESIZE_HWY
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

// Byte shuffles: tap t of a 16-byte load (pixels at bytes 3t..3t+2) into the low bytes of int32
// lanes 0-2 (lane 3 zero); 0x80 selects zero.
alignas(16) constexpr uint8_t kTapBytes[4][16] = {
    {0, 0x80, 0x80, 0x80, 1, 0x80, 0x80, 0x80, 2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
    {3, 0x80, 0x80, 0x80, 4, 0x80, 0x80, 0x80, 5, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
    {6, 0x80, 0x80, 0x80, 7, 0x80, 0x80, 0x80, 8, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
    {9, 0x80, 0x80, 0x80, 10, 0x80, 0x80, 0x80, 11, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80}};
// [r g b 0] x 4 -> 12 packed bytes.
alignas(16) constexpr uint8_t kCompact[16] = {0,  1,  2,  4,  5,    6,    8,    9,
                                              10, 12, 13, 14, 0x80, 0x80, 0x80, 0x80};

// The tap whose bytes `shuffle` (kTapBytes) selects from the 16-byte load `v`, as int32 lanes
// [r g b 0], times its weight.
HWY_INLINE V32 tap(hn::Vec128<uint8_t> v, hn::Vec128<uint8_t> shuffle, int16_t weight) {
  const D32 d32;
  return hn::Mul(hn::BitCast(d32, hn::TableLookupBytesOr0(v, shuffle)), hn::Set(d32, weight));
}

// One output pixel's [r g b 0] sums: per group of four taps one 16-byte load.
HWY_INLINE V32 horizontal_pixel(const uint8_t* p, const int16_t* c, int groups) {
  const D8 d8;
  const auto t0 = hn::Load(d8, kTapBytes[0]), t1 = hn::Load(d8, kTapBytes[1]);
  const auto t2 = hn::Load(d8, kTapBytes[2]), t3 = hn::Load(d8, kTapBytes[3]);
  V32 acc = hn::Set(D32(), kRound);
  for (int g = 0; g < groups; ++g, p += 12, c += 4) {
    const auto v = hn::LoadU(d8, p);
    acc = hn::Add(hn::Add(acc, tap(v, t0, c[0])), tap(v, t1, c[1]));
    acc = hn::Add(hn::Add(acc, tap(v, t2, c[2])), tap(v, t3, c[3]));
  }
  return acc;
}

void horizontal(const uint8_t* row, const int* offsets, const int16_t* coeffs, int taps, int width,
                uint8_t* out) {
  const D8 d8;
  const auto compact = hn::Load(d8, kCompact);
  const int groups = taps / 4;
  // Four pixels per step (the last repeated past the row's end), their 12 bytes in one store.
  for (int j0 = 0; j0 < width; j0 += 4) {
    V32 acc[4];
    for (int q = 0; q < 4; ++q) {
      const int j = j0 + q < width ? j0 + q : width - 1;
      const int16_t* c = coeffs + static_cast<size_t>(j) * taps;
      acc[q] = horizontal_pixel(row + offsets[j0 + q], c, groups);
    }
    const auto px = hn::TableLookupBytesOr0(narrow(acc[0], acc[1], acc[2], acc[3]), compact);
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
#endif  // GPUFEED_RESIZE_HWY

namespace gpufeed::transforms::hwy_resize {

#if GPUFEED_RESIZE_HWY

bool available() {
#if HWY_ARCH_X86
  return gpufeed::cpu::x86_features().sse42;
#else
  return true;
#endif
}

bool vertical(const uint8_t* const* rows, const int16_t* c, int count, size_t n, uint8_t* out) {
  return HWY_NAMESPACE::vertical(rows, c, count, n, out);
}

void horizontal(const uint8_t* row, const int* offsets, const int16_t* coeffs, int taps, int width,
                uint8_t* out) {
  HWY_NAMESPACE::horizontal(row, offsets, coeffs, taps, width, out);
}

#else  // no 128-bit Highway target in this build: Resizer::supported(kHighway) is false

bool available() { return false; }
bool vertical(const uint8_t* const*, const int16_t*, int, size_t, uint8_t*) { return false; }
void horizontal(const uint8_t*, const int*, const int16_t*, int, int, uint8_t*) {}

#endif

}  // namespace gpufeed::transforms::hwy_resize
