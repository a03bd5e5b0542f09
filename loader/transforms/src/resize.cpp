// PIL's antialiased bilinear and bicubic resample (Pillow's libImaging/Resample.c:
// precompute_coeffs, normalize_coeffs_8bpc, ImagingResampleHorizontal/Vertical_8bpc), for packed
// RGB, with AVX2 and AVX-512 paths that process four output pixels (horizontal pass; two or four
// per vector) or 32 or 64 bytes (vertical pass) per step, and Highway's 128-bit path
// (resize_hwy.cpp: NEON on aarch64).
//
// Fixed point: weights are int16 with 14 fractional bits, so pmaddwd can multiply-add pairs of
// them with pixels widened to 16 bits; the largest weight (under 1.2: a bicubic output whose
// negative lobe the image edge cuts off) is below 2^15 and a sum of 255 * weights stays far inside
// int32. Bicubic weights can be negative, so a sum can fall below 0 or above 255 << 14: every
// kernel clips it to [0, 255] (PIL's clip8) after the arithmetic shift. All kernels compute
// exactly the same integer sums with one rounding per pass, so their outputs are identical bytes
// (tests/test_resize.cpp).

#include "gpufeed/transforms/resize.h"

#include "resize_hwy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "gpufeed/cpu_features.h"
#define GPUFEED_RESIZE_X86 1
#endif

namespace gpufeed::transforms {
namespace {

constexpr int kPrecisionBits = 14;
constexpr int32_t kRound = 1 << (kPrecisionBits - 1);

inline uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

bool cpu_supports(ResizeKernel kernel) {
#if GPUFEED_RESIZE_X86
  const auto& cpu = gpufeed::cpu::x86_features();
  switch (kernel) {
    case ResizeKernel::kAvx2:
      return cpu.avx2;
    case ResizeKernel::kAvx512:
      return cpu.avx512f && cpu.avx512bw;
    default:
      break;
  }
#else
  if (kernel == ResizeKernel::kAvx2 || kernel == ResizeKernel::kAvx512) return false;
#endif
  return kernel != ResizeKernel::kHighway || hwy_resize::available();
}

// kAuto's choice: on x86 the widest kernel the CPU runs (the hand-written ones; Highway's SSE4
// build is narrower than AVX2), elsewhere Highway's (NEON on aarch64), or the one
// GPUFEED_RESIZE_KERNEL names (scalar|hwy|avx2|avx512), so one machine can measure the paths of
// CPUs that lack AVX-512 or AVX2. A value this build or CPU cannot run, or an unknown one, is
// refused when the first Resizer is made.
ResizeKernel best_kernel() {
  static const ResizeKernel best = [] {
#if GPUFEED_RESIZE_X86
    const ResizeKernel widest = cpu_supports(ResizeKernel::kAvx512) ? ResizeKernel::kAvx512
                                : cpu_supports(ResizeKernel::kAvx2) ? ResizeKernel::kAvx2
                                                                    : ResizeKernel::kScalar;
#else
    const ResizeKernel widest =
        cpu_supports(ResizeKernel::kHighway) ? ResizeKernel::kHighway : ResizeKernel::kScalar;
#endif
    const char* env = std::getenv("GPUFEED_RESIZE_KERNEL");
    if (env == nullptr || *env == '\0' || std::string_view(env) == "auto") return widest;
    const std::string_view name(env);
    const ResizeKernel chosen = name == "scalar" ? ResizeKernel::kScalar
                                : name == "avx2" ? ResizeKernel::kAvx2
                                : name == "avx512" ? ResizeKernel::kAvx512
                                : name == "hwy"    ? ResizeKernel::kHighway
                                                   : ResizeKernel::kAuto;
    if (chosen == ResizeKernel::kAuto)
      throw std::invalid_argument("GPUFEED_RESIZE_KERNEL=" + std::string(name) +
                                  ": expected auto, scalar, hwy, avx2 or avx512");
    if (!cpu_supports(chosen))
      throw std::invalid_argument("GPUFEED_RESIZE_KERNEL=" + std::string(name) +
                                  ": this CPU does not run that kernel");
    return chosen;
  }();
  return best;
}

const char* kernel_name(ResizeKernel k) {
  switch (k) {
    case ResizeKernel::kAuto:
      return "auto";
    case ResizeKernel::kScalar:
      return "scalar";
    case ResizeKernel::kAvx2:
      return "avx2";
    case ResizeKernel::kAvx512:
      return "avx512";
    case ResizeKernel::kHighway:
      return "hwy";
  }
  return "?";
}

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("Resizer::resize: " + what);
}

// --- scalar kernels ------------------------------------------------------------------------------

// out[i] = clip8(round + sum_k c[k] * rows[k][i]) for i < n bytes.
void vertical_scalar(const uint8_t* const* rows, const int16_t* c, int count, size_t n,
                     uint8_t* out, int32_t* acc) {
  for (size_t i = 0; i < n; ++i) acc[i] = kRound;
  for (int k = 0; k < count; ++k) {
    const uint8_t* r = rows[k];
    const int32_t w = c[k];
    for (size_t i = 0; i < n; ++i) acc[i] += w * r[i];
  }
  for (size_t i = 0; i < n; ++i) out[i] = clip8(acc[i]);
}

// One output row: pixel j = sum_k coeffs[j * taps + k] * row pixel (first[j] + k).
void horizontal_scalar(const uint8_t* row, const int* first, const int16_t* coeffs, int taps,
                       int width, uint8_t* out) {
  for (int j = 0; j < width; ++j) {
    const uint8_t* p = row + static_cast<size_t>(first[j]) * 3;
    const int16_t* c = coeffs + static_cast<size_t>(j) * taps;
    int32_t r = kRound, g = kRound, b = kRound;
    for (int k = 0; k < taps; ++k, p += 3) {
      r += c[k] * p[0];
      g += c[k] * p[1];
      b += c[k] * p[2];
    }
    out[j * 3 + 0] = clip8(r);
    out[j * 3 + 1] = clip8(g);
    out[j * 3 + 2] = clip8(b);
  }
}

// --- AVX2 kernels --------------------------------------------------------------------------------

#if GPUFEED_RESIZE_X86

// 32 bytes of output from `count` rows starting at byte offset i; `w[k / 2]` holds the weights of
// taps (k, k + 1) in every int32 (pair_weights). kCount > 0 fixes the count at compile time.
template <int kCount>
__attribute__((target("avx2"))) inline void vertical_chunk_avx2(const uint8_t* const* rows,
                                                                 const __m256i* w, int count,
                                                                 size_t i, uint8_t* out) {
  if constexpr (kCount > 0) count = kCount;
  const __m256i zero = _mm256_setzero_si256();
  __m256i acc0 = _mm256_set1_epi32(kRound), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int k = 0; k < count; k += 2) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k] + i));
    // An odd last tap pairs its row with itself and a zero weight.
    const __m256i b =
        k + 1 < count ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k + 1] + i)) : a;
    const __m256i lo = _mm256_unpacklo_epi8(a, b);  // a0 b0 a1 b1 ... per 128-bit lane
    const __m256i hi = _mm256_unpackhi_epi8(a, b);
    acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), w[k / 2]));
    acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), w[k / 2]));
    acc2 = _mm256_add_epi32(acc2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), w[k / 2]));
    acc3 = _mm256_add_epi32(acc3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), w[k / 2]));
  }
  acc0 = _mm256_srai_epi32(acc0, kPrecisionBits);
  acc1 = _mm256_srai_epi32(acc1, kPrecisionBits);
  acc2 = _mm256_srai_epi32(acc2, kPrecisionBits);
  acc3 = _mm256_srai_epi32(acc3, kPrecisionBits);
  // Per lane: acc0 holds bytes 0-3, acc1 4-7, acc2 8-11, acc3 12-15 of that lane; the packs
  // below restore byte order within each lane (saturating like clip8).
  const __m256i w01 = _mm256_packs_epi32(acc0, acc1);
  const __m256i w23 = _mm256_packs_epi32(acc2, acc3);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_packus_epi16(w01, w23));
}

// The row loop for kCount taps (> 0), or `count` (kCount = 0, at most kMaxVerticalTaps). The row
// pointers and weights are copied into locals, which the stores to `out` cannot alias, so with
// a fixed count they stay in registers.
constexpr int kMaxVerticalTaps = 64;

template <int kCount>
__attribute__((target("avx2"))) void vertical_rows_avx2(const uint8_t* const* rows_in,
                                                        const int32_t* pairs, int count, size_t n,
                                                        uint8_t* out) {
  constexpr int kRows = kCount > 0 ? kCount : kMaxVerticalTaps;
  const uint8_t* rows[kRows];
  __m256i w[(kRows + 1) / 2];
  if constexpr (kCount > 0) count = kCount;
  for (int k = 0; k < count; ++k) rows[k] = rows_in[k];
  for (int k = 0; k < (count + 1) / 2; ++k) w[k] = _mm256_set1_epi32(pairs[k]);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) vertical_chunk_avx2<kCount>(rows, w, count, i, out);
  // The tail: recompute the last 32 bytes (overlapping writes of identical values).
  if (i < n) vertical_chunk_avx2<kCount>(rows, w, count, n - 32, out);
}

// The weights of taps (k, k + 1) as one int32 (low word: tap k), for pmaddwd; an odd last tap
// pairs with a zero weight. `pairs` has room for (count + 1) / 2 entries.
void pair_weights(const int16_t* c, int count, int32_t* pairs) {
  for (int k = 0; k < count; k += 2) {
    const auto lo = static_cast<uint32_t>(static_cast<uint16_t>(c[k]));
    const auto hi = k + 1 < count ? static_cast<uint32_t>(static_cast<uint16_t>(c[k + 1])) : 0u;
    pairs[k / 2] = static_cast<int32_t>(lo | (hi << 16));
  }
}

// `pairs` from pair_weights. An upscale has two taps per output row, a downscale up to 2x three
// to five: those counts get loops of their own.
__attribute__((target("avx2"))) void vertical_avx2(const uint8_t* const* rows, const int16_t* c,
                                                   int count, size_t n, uint8_t* out,
                                                   int32_t* scratch, const int32_t* pairs) {
  if (n < 32 || count > kMaxVerticalTaps) {
    vertical_scalar(rows, c, count, n, out, scratch);
    return;
  }
  switch (count) {
    case 1: return vertical_rows_avx2<1>(rows, pairs, count, n, out);
    case 2: return vertical_rows_avx2<2>(rows, pairs, count, n, out);
    case 3: return vertical_rows_avx2<3>(rows, pairs, count, n, out);
    case 4: return vertical_rows_avx2<4>(rows, pairs, count, n, out);
    case 5: return vertical_rows_avx2<5>(rows, pairs, count, n, out);
    default: return vertical_rows_avx2<0>(rows, pairs, count, n, out);
  }
}

// 16 bytes from `a` in the low lane, 16 from `b` in the high one.
__attribute__((target("avx2"))) inline __m256i load_2x128(const uint8_t* a, const uint8_t* b) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
}

// One output row, four pixels per step (two per 256-bit vector, one per 128-bit lane), reading
// from byte offsets[j] for pixel j (padded to a multiple of four). `pair_coeffs` holds, per block
// of two pixels, per group of four taps, two 16-word vectors: taps (4g, 4g+1) and (4g+2, 4g+3),
// each lane laid out as [c0 c1 c0 c1 c0 c1 0 0] for the lane's pixel (lane 0: pixel 2b, lane 1:
// pixel 2b+1); then, when the taps are padded to 4 * groups + 2 (`pair`), one more such vector
// for the last two taps. Blocks come in twos (the last pixel repeated past the end).
//
// The AVX2 kernel is the one x86 CPUs without AVX-512 run, where 256-bit operations may cost two
// 128-bit ones (AMD Zen 1): hence taps padded to two, not four (an upscale has two taps per
// output pixel, so half the multiplies were zeros) and four pixels per step, whose 12 bytes leave
// in one store. kGroups >= 0 fixes the group count at compile time for the common tap counts.
template <int kGroups, bool kPair>
__attribute__((target("avx2"))) void horizontal_avx2_t(const uint8_t* row, const int* offsets,
                                                       const int16_t* pair_coeffs, int groups,
                                                       int width, uint8_t* out) {
  if constexpr (kGroups >= 0) groups = kGroups;
  // Bytes of two RGB pixels (0-2, 3-5) into 16-bit words r0 r1 g0 g1 b0 b1 0 0; likewise pixels
  // 2 and 3 (bytes 6-11).
  const __m256i mask01 = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i mask23 =
      _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1, 6, -1, 9, -1, 7,
                       -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
  // [r g b 0] x 4 -> 12 packed bytes.
  const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i round = _mm256_set1_epi32(kRound);
  const size_t block_vectors = static_cast<size_t>(2 * groups + (kPair ? 1 : 0));
  const auto* w = reinterpret_cast<const __m256i*>(pair_coeffs);
  for (int j0 = 0; j0 < width; j0 += 4, w += 2 * block_vectors) {
    const uint8_t* p0 = row + offsets[j0];
    const uint8_t* p1 = row + offsets[j0 + 1];
    const uint8_t* p2 = row + offsets[j0 + 2];
    const uint8_t* p3 = row + offsets[j0 + 3];
    const __m256i* wa = w;                   // pixels j0, j0 + 1
    const __m256i* wb = w + block_vectors;   // pixels j0 + 2, j0 + 3
    __m256i acc_a = round, acc_b = round;
    for (int g = 0; g < groups; ++g, p0 += 12, p1 += 12, p2 += 12, p3 += 12, wa += 2, wb += 2) {
      const __m256i va = load_2x128(p0, p1), vb = load_2x128(p2, p3);
      acc_a = _mm256_add_epi32(acc_a, _mm256_madd_epi16(_mm256_shuffle_epi8(va, mask01), _mm256_load_si256(wa)));
      acc_b = _mm256_add_epi32(acc_b, _mm256_madd_epi16(_mm256_shuffle_epi8(vb, mask01), _mm256_load_si256(wb)));
      acc_a = _mm256_add_epi32(acc_a, _mm256_madd_epi16(_mm256_shuffle_epi8(va, mask23), _mm256_load_si256(wa + 1)));
      acc_b = _mm256_add_epi32(acc_b, _mm256_madd_epi16(_mm256_shuffle_epi8(vb, mask23), _mm256_load_si256(wb + 1)));
    }
    if constexpr (kPair) {
      const __m256i va = load_2x128(p0, p1), vb = load_2x128(p2, p3);
      acc_a = _mm256_add_epi32(acc_a, _mm256_madd_epi16(_mm256_shuffle_epi8(va, mask01), _mm256_load_si256(wa)));
      acc_b = _mm256_add_epi32(acc_b, _mm256_madd_epi16(_mm256_shuffle_epi8(vb, mask01), _mm256_load_si256(wb)));
    }
    // Words, then bytes (saturating like clip8): lane 0 holds pixels j0 and j0 + 2, lane 1
    // pixels j0 + 1 and j0 + 3, each as [r g b 0].
    const __m256i words = _mm256_packs_epi32(_mm256_srai_epi32(acc_a, kPrecisionBits),
                                             _mm256_srai_epi32(acc_b, kPrecisionBits));
    const __m256i bytes = _mm256_packus_epi16(words, words);
    const __m128i px = _mm_shuffle_epi8(
        _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1)), compact);
    uint8_t* d = out + static_cast<size_t>(j0) * 3;
    if (j0 + 6 <= width) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d), px);  // 4 bytes spill into the next pixels
    } else {
      alignas(16) uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), px);
      std::memcpy(d, tmp, static_cast<size_t>(std::min(4, width - j0)) * 3);
    }
  }
}

// `taps` is a multiple of two (see Resizer::resize); the tap counts of upscales and downscales
// up to 2x get a kernel of their own.
__attribute__((target("avx2"))) void horizontal_avx2(const uint8_t* row, const int* offsets,
                                                     const int16_t* pair_coeffs, int taps,
                                                     int width, uint8_t* out) {
  const int groups = taps / 4;
  const bool pair = taps % 4 != 0;
  if (pair) {
    if (groups == 0) return horizontal_avx2_t<0, true>(row, offsets, pair_coeffs, groups, width, out);
    if (groups == 1) return horizontal_avx2_t<1, true>(row, offsets, pair_coeffs, groups, width, out);
    return horizontal_avx2_t<-1, true>(row, offsets, pair_coeffs, groups, width, out);
  }
  if (groups == 1) return horizontal_avx2_t<1, false>(row, offsets, pair_coeffs, groups, width, out);
  if (groups == 2) return horizontal_avx2_t<2, false>(row, offsets, pair_coeffs, groups, width, out);
  return horizontal_avx2_t<-1, false>(row, offsets, pair_coeffs, groups, width, out);
}

// --- AVX-512 kernels: the AVX2 ones at twice the width (pack/unpack/shuffle work per 128-bit
// lane, so the same byte bookkeeping holds) ---------------------------------------------------

#define GPUFEED_AVX512 __attribute__((target("avx512f,avx512bw")))

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_epi32(), a self-initialised variable
// that -Wuninitialized flags once they are inlined into a target("avx512...") function.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC only: clang would warn about the unknown option
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

GPUFEED_AVX512 inline void vertical_chunk_avx512(const uint8_t* const* rows, const int32_t* pairs,
                                                 int count, size_t i, uint8_t* out) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i acc0 = _mm512_set1_epi32(kRound), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int k = 0; k < count; k += 2) {
    const __m512i a = _mm512_loadu_si512(rows[k] + i);
    const __m512i b = k + 1 < count ? _mm512_loadu_si512(rows[k + 1] + i) : a;
    const __m512i w = _mm512_set1_epi32(pairs[k / 2]);
    const __m512i lo = _mm512_unpacklo_epi8(a, b);
    const __m512i hi = _mm512_unpackhi_epi8(a, b);
    acc0 = _mm512_add_epi32(acc0, _mm512_madd_epi16(_mm512_unpacklo_epi8(lo, zero), w));
    acc1 = _mm512_add_epi32(acc1, _mm512_madd_epi16(_mm512_unpackhi_epi8(lo, zero), w));
    acc2 = _mm512_add_epi32(acc2, _mm512_madd_epi16(_mm512_unpacklo_epi8(hi, zero), w));
    acc3 = _mm512_add_epi32(acc3, _mm512_madd_epi16(_mm512_unpackhi_epi8(hi, zero), w));
  }
  acc0 = _mm512_srai_epi32(acc0, kPrecisionBits);
  acc1 = _mm512_srai_epi32(acc1, kPrecisionBits);
  acc2 = _mm512_srai_epi32(acc2, kPrecisionBits);
  acc3 = _mm512_srai_epi32(acc3, kPrecisionBits);
  const __m512i w01 = _mm512_packs_epi32(acc0, acc1);
  const __m512i w23 = _mm512_packs_epi32(acc2, acc3);
  _mm512_storeu_si512(out + i, _mm512_packus_epi16(w01, w23));
}

GPUFEED_AVX512 void vertical_avx512(const uint8_t* const* rows, const int16_t* c, int count,
                                    size_t n, uint8_t* out, int32_t* scratch,
                                    const int32_t* pairs) {
  if (n < 64) {
    vertical_avx2(rows, c, count, n, out, scratch, pairs);
    return;
  }
  size_t i = 0;
  for (; i + 64 <= n; i += 64) vertical_chunk_avx512(rows, pairs, count, i, out);
  if (i < n) vertical_chunk_avx512(rows, pairs, count, n - 64, out);
}

// Four output pixels per step; `quad_coeffs` as pair_coeffs in horizontal_avx2 with four lanes.
GPUFEED_AVX512 void horizontal_avx512(const uint8_t* row, const int* offsets,
                                      const int16_t* quad_coeffs, int taps, int width,
                                      uint8_t* out) {
  const __m512i mask01 = _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1));
  const __m512i mask23 = _mm512_broadcast_i32x4(
      _mm_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1));
  // [r g b 0] x 4 -> 12 packed bytes.
  const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const int groups = taps / 4;
  const auto* w = reinterpret_cast<const __m512i*>(quad_coeffs);
  for (int j0 = 0; j0 < width; j0 += 4) {
    const uint8_t* p0 = row + offsets[j0];
    const uint8_t* p1 = row + offsets[j0 + 1];
    const uint8_t* p2 = row + offsets[j0 + 2];
    const uint8_t* p3 = row + offsets[j0 + 3];
    __m512i acc = _mm512_set1_epi32(kRound);
    for (int g = 0; g < groups; ++g, p0 += 12, p1 += 12, p2 += 12, p3 += 12, w += 2) {
      __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0)));
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)), 1);
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2)), 2);
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p3)), 3);
      acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_shuffle_epi8(v, mask01),
                                                    _mm512_load_si512(w)));
      acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_shuffle_epi8(v, mask23),
                                                    _mm512_load_si512(w + 1)));
    }
    // Clipped to [0, 255] like clip8: negative sums (bicubic's negative lobes) to 0 first, as
    // the unsigned saturating narrowing would turn them into 255.
    acc = _mm512_max_epi32(_mm512_srai_epi32(acc, kPrecisionBits), _mm512_setzero_si512());
    const __m128i px = _mm_shuffle_epi8(_mm512_cvtusepi32_epi8(acc), compact);
    uint8_t* d = out + static_cast<size_t>(j0) * 3;
    if (j0 + 6 <= width) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d), px);  // 4 bytes spill into the next pixels
    } else {
      alignas(16) uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), px);
      std::memcpy(d, tmp, static_cast<size_t>(std::min(4, width - j0)) * 3);
    }
  }
}

#pragma GCC diagnostic pop

#endif  // GPUFEED_RESIZE_X86

}  // namespace

bool Resizer::supported(ResizeKernel kernel) { return cpu_supports(kernel); }

Resizer::Resizer(ResizeKernel kernel)
    : kernel_(kernel == ResizeKernel::kAuto ? best_kernel() : kernel) {
  if (!cpu_supports(kernel_))
    throw std::invalid_argument(std::string("Resizer: this CPU cannot run the ") +
                                kernel_name(kernel_) + " kernel");
}

namespace {

// Pillow's bilinear_filter and bicubic_filter (a = -0.5) of Resample.c.
inline double filter_weight(ResizeFilter filter, double x) {
  x = std::abs(x);
  if (filter == ResizeFilter::kBilinear) return x < 1.0 ? 1.0 - x : 0.0;
  constexpr double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

}  // namespace

// Pillow's precompute_coeffs + normalize_coeffs_8bpc, except that the weights are 14-bit and each
// output's taps are stored `taps` apart, zero-padded. With `reverse` the table is stored in
// mirrored output order (entry j describes output pixel n - 1 - j).
void Resizer::compute_axis(ResizeFilter filter, int in_size, double in0, double in1, int out_size,
                           int pad_to, bool reverse, Axis& axis) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  // The filter's support (bilinear 1, bicubic 2) stretched by the downscale.
  const double support = (filter == ResizeFilter::kBicubic ? 2.0 : 1.0) * filterscale;
  const double ss = 1.0 / filterscale;
  axis.first.resize(static_cast<size_t>(out_size));
  axis.count.resize(static_cast<size_t>(out_size));
  // First the tap ranges (PIL's xmin/xmax), so the table's stride is the most taps any output
  // pixel has; entry j describes output pixel xx (mirrored order when `reverse`).
  int max_count = 1;
  for (int j = 0; j < out_size; ++j) {
    const int xx = reverse ? out_size - 1 - j : j;
    const double center = in0 + (xx + 0.5) * scale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    axis.first[static_cast<size_t>(j)] = xmin;
    axis.count[static_cast<size_t>(j)] = std::max(xmax, 0);
    max_count = std::max(max_count, xmax);
  }
  axis.taps = (max_count + pad_to - 1) / pad_to * pad_to;
  axis.coeffs.assign(static_cast<size_t>(out_size) * axis.taps, 0);
  weights_.resize(static_cast<size_t>(max_count));
  for (int j = 0; j < out_size; ++j) {
    const int xx = reverse ? out_size - 1 - j : j;
    const double center = in0 + (xx + 0.5) * scale;
    const int xmin = axis.first[static_cast<size_t>(j)];
    const int n = axis.count[static_cast<size_t>(j)];
    double ww = 0.0;
    for (int x = 0; x < n; ++x) {
      const double w = filter_weight(filter, (x + xmin - center + 0.5) * ss);
      weights_[static_cast<size_t>(x)] = w;
      ww += w;
    }
    // Normalised to sum to one (PIL divides each weight by the sum), then fixed point, rounded
    // half away from zero as normalize_coeffs_8bpc rounds (bicubic weights can be negative).
    const double to_fixed = ww != 0.0 ? (1 << kPrecisionBits) / ww : 0.0;
    int16_t* c = &axis.coeffs[static_cast<size_t>(j) * axis.taps];
    for (int x = 0; x < n; ++x) {
      const double v = weights_[static_cast<size_t>(x)] * to_fixed;
      c[x] = static_cast<int16_t>(v < 0 ? -0.5 + v : 0.5 + v);
    }
  }
}

namespace {

// Throws std::invalid_argument for the arguments resize() refuses (resize.h).
void check_resize_arguments(const uint8_t* src, int src_width, int src_height, size_t src_stride,
                            const BoxF& box, const uint8_t* dst, int dst_width, int dst_height,
                            size_t dst_stride) {
  if (src == nullptr || dst == nullptr) bad("null image");
  if (src_width <= 0 || src_height <= 0 || dst_width <= 0 || dst_height <= 0)
    bad("sizes must be positive: source " + std::to_string(src_width) + "x" +
        std::to_string(src_height) + ", output " + std::to_string(dst_width) + "x" +
        std::to_string(dst_height));
  if (src_stride < static_cast<size_t>(src_width) * 3 ||
      dst_stride < static_cast<size_t>(dst_width) * 3)
    bad("a stride is shorter than a row");
  if (!(box.x0 >= 0 && box.y0 >= 0 && box.x1 <= src_width && box.y1 <= src_height &&
        box.x1 > box.x0 && box.y1 > box.y0))
    bad("box [" + std::to_string(box.x0) + ", " + std::to_string(box.x1) + ") x [" +
        std::to_string(box.y0) + ", " + std::to_string(box.y1) + ") is empty or outside the " +
        std::to_string(src_width) + "x" + std::to_string(src_height) + " source");
}

}  // namespace

void Resizer::resize(const uint8_t* src, int src_width, int src_height, size_t src_stride,
                     const BoxF& box, uint8_t* dst, int dst_width, int dst_height,
                     size_t dst_stride, bool flip, ResizeFilter filter) {
  check_resize_arguments(src, src_width, src_height, src_stride, box, dst, dst_width, dst_height,
                         dst_stride);
  // Horizontal taps padded to four (two pmaddwd pairs per 16-byte load), or to two for the AVX2
  // kernel, which has a last-pair step (an upscale's two taps would otherwise be half zeros).
  compute_axis(filter, src_width, box.x0, box.x1, dst_width,
               kernel_ == ResizeKernel::kAvx2 ? 2 : 4, flip, horizontal_);
  compute_axis(filter, src_height, box.y0, box.y1, dst_height, 1, false, vertical_);
  if (rows_.size() < static_cast<size_t>(vertical_.taps)) {
    rows_.resize(static_cast<size_t>(vertical_.taps));
    pairs_.resize(static_cast<size_t>(vertical_.taps + 1) / 2);
  }
  const Columns columns = prepare_columns(src_width, dst_width);
  const int16_t* lane_coeffs = prepare_lane_coeffs(dst_width);
  if (filter == ResizeFilter::kBicubic) {
    resize_rows_horizontal_first(src, src_stride, columns, lane_coeffs, dst, dst_width, dst_height,
                                 dst_stride);
  } else {
    resize_rows(src, src_stride, columns, lane_coeffs, dst, dst_width, dst_height, dst_stride);
  }
}

// The horizontal pass of one source row: its columns copied into the padded row buffer (the
// kernels read whole groups of taps past the last column), then filtered into `out`.
void Resizer::horizontal_row(const uint8_t* src_row, Columns columns, const int16_t* lane_coeffs,
                             int dst_width, uint8_t* out) {
  std::memcpy(row_.data(), src_row + static_cast<size_t>(columns.x_begin) * 3, columns.row_bytes);
#if GPUFEED_RESIZE_X86
  if (kernel_ == ResizeKernel::kAvx512)
    return horizontal_avx512(row_.data(), offsets_.data(), lane_coeffs, horizontal_.taps, dst_width, out);
  if (kernel_ == ResizeKernel::kAvx2)
    return horizontal_avx2(row_.data(), offsets_.data(), lane_coeffs, horizontal_.taps, dst_width, out);
#endif
  if (kernel_ == ResizeKernel::kHighway)
    return hwy_resize::horizontal(row_.data(), offsets_.data(), lane_coeffs, horizontal_.taps,
                                  dst_width, out);
  horizontal_scalar(row_.data(), horizontal_.first.data(), horizontal_.coeffs.data(), horizontal_.taps,
                    dst_width, out);
}

// PIL's order (horizontal pass first, its 8-bit intermediate clipped, then the vertical pass):
// the bicubic filter's overshoots are clipped where PIL clips them. Every source row the output
// needs is filtered once into intermediate_.
void Resizer::resize_rows_horizontal_first(const uint8_t* src, size_t src_stride, Columns columns,
                                           const int16_t* lane_coeffs, uint8_t* dst, int dst_width,
                                           int dst_height, size_t dst_stride) {
  int y_begin = vertical_.first[0], y_end = 0;
  for (int v = 0; v < dst_height; ++v) {
    y_begin = std::min(y_begin, vertical_.first[static_cast<size_t>(v)]);
    y_end = std::max(y_end, vertical_.first[static_cast<size_t>(v)] + vertical_.count[static_cast<size_t>(v)]);
  }
  const size_t out_bytes = static_cast<size_t>(dst_width) * 3;
  // + 16: the horizontal kernels' last 16-byte store may spill past a row's end.
  const size_t rows = static_cast<size_t>(std::max(y_end - y_begin, 0));
  if (intermediate_.size() < rows * out_bytes + 16) intermediate_.resize(rows * out_bytes + 16);
  for (int y = y_begin; y < y_end; ++y)
    horizontal_row(src + static_cast<size_t>(y) * src_stride, columns, lane_coeffs, dst_width,
                   intermediate_.data() + static_cast<size_t>(y - y_begin) * out_bytes);
  if (acc_.size() < out_bytes) acc_.resize(out_bytes);
  const uint8_t** row_ptrs = rows_.data();
  for (int v = 0; v < dst_height; ++v) {
    const int first = vertical_.first[static_cast<size_t>(v)];
    const int count = vertical_.count[static_cast<size_t>(v)];
    const int16_t* c = &vertical_.coeffs[static_cast<size_t>(v) * vertical_.taps];
    for (int k = 0; k < count; ++k)
      row_ptrs[k] = intermediate_.data() + static_cast<size_t>(first + k - y_begin) * out_bytes;
    uint8_t* out = dst + static_cast<size_t>(v) * dst_stride;
#if GPUFEED_RESIZE_X86
    if (kernel_ == ResizeKernel::kAvx512 || kernel_ == ResizeKernel::kAvx2) {
      pair_weights(c, count, pairs_.data());
      if (kernel_ == ResizeKernel::kAvx512) {
        vertical_avx512(row_ptrs, c, count, out_bytes, out, acc_.data(), pairs_.data());
      } else {
        vertical_avx2(row_ptrs, c, count, out_bytes, out, acc_.data(), pairs_.data());
      }
      continue;
    }
#endif
    if (kernel_ == ResizeKernel::kHighway && hwy_resize::vertical(row_ptrs, c, count, out_bytes, out))
      continue;
    vertical_scalar(row_ptrs, c, count, out_bytes, out, acc_.data());
  }
}

Resizer::Columns Resizer::prepare_columns(int src_width, int dst_width) {
  // The source columns the horizontal pass reads; the vertical pass produces only those.
  int x_begin = src_width, x_end = 0;
  for (int j = 0; j < dst_width; ++j) {
    x_begin = std::min(x_begin, horizontal_.first[static_cast<size_t>(j)]);
    x_end = std::max(x_end, horizontal_.first[static_cast<size_t>(j)] +
                                horizontal_.count[static_cast<size_t>(j)]);
  }
  for (int& f : horizontal_.first) f -= x_begin;
  // Byte offsets of each output pixel's first tap, for the SIMD kernels: padded to a whole block
  // of four by repeating the last pixel.
  offsets_.resize(static_cast<size_t>(dst_width + 3) / 4 * 4);
  for (size_t j = 0; j < offsets_.size(); ++j)
    offsets_[j] = horizontal_.first[std::min(j, static_cast<size_t>(dst_width - 1))] * 3;
  const size_t row_bytes = static_cast<size_t>(x_end - x_begin) * 3;
  // Padding: the horizontal pass reads whole groups of taps (zero weights past the real ones)
  // and 16 bytes per group.
  const size_t padded = row_bytes + static_cast<size_t>(horizontal_.taps) * 3 + 16;
  if (row_.size() < padded) row_.resize(padded);
  std::memset(row_.data() + row_bytes, 0, padded - row_bytes);
  if (acc_.size() < row_bytes) acc_.resize(row_bytes);
  return {x_begin, row_bytes};
}

// The SIMD kernels read the horizontal weights rearranged per block of `lanes` output pixels
// and per group of four taps: two vectors, taps (4g, 4g+1) and (4g+2, 4g+3), whose 128-bit lane
// l holds [c0 c1 c0 c1 c0 c1 0 0] for pixel (block * lanes + l) (the last pixel repeated past
// the end), to multiply words r0 r1 g0 g1 b0 b1 0 0 of two source pixels; when the taps end in
// a pair (AVX2 only: 4 * groups + 2 taps), one more vector for it. AVX2 reads blocks of two
// pixels two at a time, so their count is made even. The Highway kernel's vectors are one lane.
const int16_t* Resizer::prepare_lane_coeffs(int dst_width) {
  const int lanes = kernel_ == ResizeKernel::kAvx512    ? 4
                    : kernel_ == ResizeKernel::kAvx2    ? 2
                    : kernel_ == ResizeKernel::kHighway ? 1
                                                        : 0;
  if (lanes == 0) return nullptr;
  const int groups = horizontal_.taps / 4;
  const int vectors = 2 * groups + (horizontal_.taps % 4 != 0 ? 1 : 0);  // per block
  size_t blocks = static_cast<size_t>(dst_width + lanes - 1) / lanes;
  if (kernel_ == ResizeKernel::kAvx2) blocks = (blocks + 1) / 2 * 2;
  const size_t words = static_cast<size_t>(lanes) * 8;  // one vector: lanes * 8 words
  lane_coeffs_.resize(blocks * vectors * words + 32);  // + room to align to 64 bytes
  int16_t* lane_coeffs = reinterpret_cast<int16_t*>(
      (reinterpret_cast<uintptr_t>(lane_coeffs_.data()) + 63) & ~uintptr_t{63});
  for (size_t b = 0; b < blocks; ++b) {
    for (int lane = 0; lane < lanes; ++lane) {
      const int j = std::min(static_cast<int>(b * lanes) + lane, dst_width - 1);
      const int16_t* c = &horizontal_.coeffs[static_cast<size_t>(j) * horizontal_.taps];
      for (int k = 0; k < vectors; ++k) {  // vector k: taps 2k, 2k + 1
        int16_t* l = lane_coeffs + (b * vectors + k) * words + lane * 8;
        const int16_t c0 = c[2 * k], c1 = c[2 * k + 1];
        l[0] = l[2] = l[4] = c0;
        l[1] = l[3] = l[5] = c1;
        l[6] = l[7] = 0;
      }
    }
  }
  return lane_coeffs;
}

void Resizer::resize_rows(const uint8_t* src, size_t src_stride, Columns columns,
                          const int16_t* lane_coeffs, uint8_t* dst, int dst_width, int dst_height,
                          size_t dst_stride) {
  const size_t row_bytes = columns.row_bytes;
  const uint8_t** rows = rows_.data();
  for (int v = 0; v < dst_height; ++v) {
    const int first = vertical_.first[static_cast<size_t>(v)];
    const int count = vertical_.count[static_cast<size_t>(v)];
    const int16_t* c = &vertical_.coeffs[static_cast<size_t>(v) * vertical_.taps];
    for (int k = 0; k < count; ++k)
      rows[k] = src + static_cast<size_t>(first + k) * src_stride +
                static_cast<size_t>(columns.x_begin) * 3;
    uint8_t* out = dst + static_cast<size_t>(v) * dst_stride;
#if GPUFEED_RESIZE_X86
    if (kernel_ == ResizeKernel::kAvx512) {
      pair_weights(c, count, pairs_.data());
      vertical_avx512(rows, c, count, row_bytes, row_.data(), acc_.data(), pairs_.data());
      horizontal_avx512(row_.data(), offsets_.data(), lane_coeffs, horizontal_.taps,
                        dst_width, out);
      continue;
    }
    if (kernel_ == ResizeKernel::kAvx2) {
      pair_weights(c, count, pairs_.data());
      vertical_avx2(rows, c, count, row_bytes, row_.data(), acc_.data(), pairs_.data());
      horizontal_avx2(row_.data(), offsets_.data(), lane_coeffs, horizontal_.taps,
                      dst_width, out);
      continue;
    }
#endif
    if (kernel_ == ResizeKernel::kHighway) {
      if (!hwy_resize::vertical(rows, c, count, row_bytes, row_.data()))
        vertical_scalar(rows, c, count, row_bytes, row_.data(), acc_.data());
      hwy_resize::horizontal(row_.data(), offsets_.data(), lane_coeffs, horizontal_.taps, dst_width,
                             out);
      continue;
    }
    vertical_scalar(rows, c, count, row_bytes, row_.data(), acc_.data());
    horizontal_scalar(row_.data(), horizontal_.first.data(), horizontal_.coeffs.data(),
                      horizontal_.taps, dst_width, out);
  }
}

}  // namespace gpufeed::transforms
