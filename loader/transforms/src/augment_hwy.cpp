// gaussian_blur's depthwise convolution and the affine warp's bilinear sampling, written with
// Google Highway: one 128-bit target per build (hwy_target.h: NEON on aarch64, AVX2 with 128-bit
// vectors on x86, where the automatic choices stay the AVX2 kernels of augment.cpp).
//
// Arithmetic: each lane does the scalar code's float32 operations in its order. Both kernels
// need fused multiply-adds (std::fma, rounded once), so this file defines GPUFEED_HWY_FUSED: on
// x86 Highway's SSE4 target would make MulAdd a Mul then an Add (two roundings), its AVX2 target
// makes it vfmadd, and NEON's is fmla. Everything else is a plain Mul, Add or Sub (the build's
// -ffp-contract=off keeps the compiler from fusing them).
//  - Blur: row[n] = fma(w, in[n], row[n]) from 0, taps in row-major order; a block of values
//    keeps its sums in registers through all k x k taps (as blur_block32_fma).
//  - Warp: grid_bilinear_body's location fma(g + 1, size/2, -0.5), Floor, the weights, the four
//    taps as fma(se_v, se, fma(sw_v, sw, fma(ne_v, ne, nw_v * nw))), round half to even
//    (NearestInt), min 255, 0 outside. NEON has no gather: GatherOffset loads each lane's 32-bit
//    tap (R, G, B and a byte more) on its own there; AVX2 gathers.

#define GPUFEED_HWY_FUSED 1
#include "augment_hwy.h"

#include "hwy_target.h"

#if GPUFEED_HWY_128
HWY_BEFORE_NAMESPACE();
namespace gpufeed::transforms::hwy_augment {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::Full128<float>;
using DI = hn::Full128<int32_t>;
using VF = hn::Vec128<float>;
using VI = hn::Vec128<int32_t>;
constexpr size_t kLanes = 4;

// kVectors * 4 values of the row at once, their sums kept in registers through all k x k taps.
template <size_t kVectors>
HWY_INLINE void blur_block(const float* padded, size_t padded_row, const float* kernel, int k,
                           float* row) {
  const DF df;
  VF sum[kVectors];
  for (size_t v = 0; v < kVectors; ++v) sum[v] = hn::Zero(df);
  for (int i = 0; i < k; ++i) {
    const float* in = padded + static_cast<size_t>(i) * padded_row;
    for (int j = 0; j < k; ++j, in += 3) {
      const VF w = hn::Set(df, kernel[i * k + j]);
      for (size_t v = 0; v < kVectors; ++v)
        sum[v] = hn::MulAdd(w, hn::LoadU(df, in + v * kLanes), sum[v]);
    }
  }
  for (size_t v = 0; v < kVectors; ++v) hn::StoreU(sum[v], df, row + v * kLanes);
}

size_t blur_row(const float* padded, size_t padded_row, const float* kernel, int k, size_t n_values,
                float* row) {
  constexpr size_t kBlock = 8 * kLanes;  // 8 sums of NEON's 32 registers (x86: of 16)
  size_t n = 0;
  for (; n + kBlock <= n_values; n += kBlock)
    blur_block<8>(padded + n, padded_row, kernel, k, row + n);
  for (; n + kLanes <= n_values; n += kLanes)
    blur_block<1>(padded + n, padded_row, kernel, k, row + n);
  return n;
}

// Channel c (byte c) of each lane's 32-bit tap, as float.
template <int c>
HWY_INLINE VF tap_channel(VI tap) {
  return hn::ConvertTo(DF(), hn::And(hn::ShiftRight<8 * c>(tap), hn::Set(DI(), 0xff)));
}

// The four lanes' 32-bit taps at byte offsets `at`, `at` + 3 (east), a row below, and both.
struct Taps {
  VI nw, ne, sw, se;
};

HWY_INLINE Taps load_taps(const uint8_t* padded, VI at, int32_t prow) {
  const DI di;
  const auto* base = reinterpret_cast<const int32_t*>(padded);
  const VI three = hn::Set(di, 3), at_s = hn::Add(at, hn::Set(di, prow));
  return {hn::GatherOffset(di, base, at), hn::GatherOffset(di, base, hn::Add(at, three)),
          hn::GatherOffset(di, base, at_s), hn::GatherOffset(di, base, hn::Add(at_s, three))};
}

// The weights of the four taps.
struct Weights {
  VF nw, ne, sw, se;
};

// Channel c of the four pixels: the taps' weighted sum rounded half to even, at most 255, 0
// where the point is outside.
template <int c>
HWY_INLINE void blend_channel(const Taps& t, const Weights& w, hn::Mask128<int32_t> inside,
                              int32_t* out) {
  const DI di;
  const VF v = hn::MulAdd(
      tap_channel<c>(t.se), w.se,
      hn::MulAdd(tap_channel<c>(t.sw), w.sw,
                 hn::MulAdd(tap_channel<c>(t.ne), w.ne, hn::Mul(tap_channel<c>(t.nw), w.nw))));
  const VI r = hn::Min(hn::NearestInt(v), hn::Set(di, 255));
  hn::Store(hn::IfThenElseZero(inside, r), di, out);
}

int grid_bilinear(uint8_t* image, int height, int width, const AffineGrid& g,
                  const uint8_t* padded) {
  const DF df;
  const DI di;
  const int32_t prow = (width + 2) * 3;
  const VF one = hn::Set(df, 1.0f), minus_half = hn::Set(df, -0.5f), minus_one = hn::Set(df, -1.0f);
  const VF sx = hn::Set(df, static_cast<float>(width) / 2),
           sy = hn::Set(df, static_cast<float>(height) / 2);
  const VF x_max = hn::Set(df, static_cast<float>(width - 1)),
           y_max = hn::Set(df, static_cast<float>(height - 1));
  const VF xc = hn::Set(df, g.xc), yc = hn::Set(df, g.yc);
  const VI v_prow = hn::Set(di, prow), three = hn::Set(di, 3);
  const int vector_end = width / 4 * 4;
  const size_t row = static_cast<size_t>(width) * 3;
  alignas(16) int32_t res[3][kLanes];
  for (int y = 0; y < height; ++y) {
    const VF row_x = hn::Set(df, g.row_x(y)), row_y = hn::Set(df, g.row_y(y));
    uint8_t* out = image + static_cast<size_t>(y) * row;
    for (int x = 0; x < vector_end; x += 4, out += 12) {
      const VF gx = hn::Add(hn::Add(hn::LoadU(df, g.col_x + x), row_x), xc);
      const VF gy = hn::Add(hn::Add(hn::LoadU(df, g.col_y + x), row_y), yc);
      const VF fx = hn::MulAdd(hn::Add(gx, one), sx, minus_half);
      const VF fy = hn::MulAdd(hn::Add(gy, one), sy, minus_half);
      const VF x_w = hn::Floor(fx), y_n = hn::Floor(fy);
      const auto inside = hn::And(hn::And(hn::Ge(x_w, minus_one), hn::Le(x_w, x_max)),
                                  hn::And(hn::Ge(y_n, minus_one), hn::Le(y_n, y_max)));
      const VF w = hn::Sub(fx, x_w), e = hn::Sub(one, w);
      const VF n = hn::Sub(fy, y_n), s = hn::Sub(one, n);
      const Weights weights{hn::Mul(s, e), hn::Mul(s, w), hn::Mul(n, e), hn::Mul(n, w)};
      // The north-west tap's byte offset in `padded`; 0 (a black pixel) outside.
      const VI ix = hn::ConvertTo(di, hn::IfThenElseZero(inside, hn::Add(x_w, one)));
      const VI iy = hn::ConvertTo(di, hn::IfThenElseZero(inside, hn::Add(y_n, one)));
      const Taps taps = load_taps(padded, hn::Add(hn::Mul(iy, v_prow), hn::Mul(ix, three)), prow);
      const auto inside_i = hn::RebindMask(di, inside);
      blend_channel<0>(taps, weights, inside_i, res[0]);
      blend_channel<1>(taps, weights, inside_i, res[1]);
      blend_channel<2>(taps, weights, inside_i, res[2]);
      for (size_t k = 0; k < kLanes; ++k) {
        out[3 * k] = static_cast<uint8_t>(res[0][k]);
        out[3 * k + 1] = static_cast<uint8_t>(res[1][k]);
        out[3 * k + 2] = static_cast<uint8_t>(res[2][k]);
      }
    }
  }
  return vector_end;
}

}  // namespace HWY_NAMESPACE
}  // namespace gpufeed::transforms::hwy_augment
HWY_AFTER_NAMESPACE();
#endif  // GPUFEED_HWY_128

namespace gpufeed::transforms::hwy_augment {

#if GPUFEED_HWY_128

bool available() { return hwy_128_fused_available(); }

size_t blur_row(const float* padded, size_t padded_row, const float* kernel, int k, size_t n_values,
                float* row) {
  return HWY_NAMESPACE::blur_row(padded, padded_row, kernel, k, n_values, row);
}

int grid_bilinear(uint8_t* image, int height, int width, const AffineGrid& g,
                  const uint8_t* padded) {
  return HWY_NAMESPACE::grid_bilinear(image, height, width, g, padded);
}

#else  // no 128-bit Highway target in this build: fma_kernel_supported(kHighway) is false

bool available() { return false; }
size_t blur_row(const float*, size_t, const float*, int, size_t, float*) { return 0; }
int grid_bilinear(uint8_t*, int, int, const AffineGrid&, const uint8_t*) { return 0; }

#endif

}  // namespace gpufeed::transforms::hwy_augment
