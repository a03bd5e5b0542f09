// adjust_saturation's blend, adjust_contrast's grayscale sum and adjust_hue's HSV round trip,
// written with Google Highway: one 128-bit target per build (hwy_target.h: NEON on aarch64, SSE4
// on x86, where kAuto stays the AVX2 loops of augment.cpp).
//
// Arithmetic: GrayTables::gray_floor and adjust_saturation's loop (augment.cpp) operation by
// operation. float(r) * 0.2989f in float, widened to double; g and b times the doubles of 0.587f
// and 0.114f in double (exact: an 8-bit integer times a float); double sums narrowed to float
// after each add; Floor; the blend's gray * double(alpha) plus double(float(x) * ratio), narrowed
// to float, clamped to [0, 255] (Max then Min, as to_u8_trunc) and truncated. adjust_hue's loop
// is float32 throughout, its divisions IEEE (NEON's fdiv, SSE's divps). No MulAdd: each product
// and sum rounds where the scalar code's does, and the build's -ffp-contract=off
// (CMakeLists.txt) keeps the compiler from fusing them. Float64 lanes come two per vector
// (aarch64 NEON and SSE4 both have them), so four pixels' doubles are a pair of vectors (Wide).
// 16 pixels per step: LoadInterleaved3/StoreInterleaved3 (NEON's ld3/st3) split and rejoin the
// channels.

#include "colour_hwy.h"

#include "hwy_target.h"

#if GPUFEED_HWY_128
HWY_BEFORE_NAMESPACE();
namespace gpufeed::transforms::hwy_colour {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D8 = hn::Full128<uint8_t>;
using D16 = hn::Full128<int16_t>;
using D32 = hn::Full128<int32_t>;
using DF = hn::Full128<float>;
using DD = hn::Full128<double>;
using V8 = hn::Vec128<uint8_t>;
using VI = hn::Vec128<int32_t>;
using VF = hn::Vec128<float>;
using VD = hn::Vec128<double>;

// Four doubles: lanes 0-1 and 2-3 of a float or int32 vector.
struct Wide {
  VD lo, hi;
};

HWY_INLINE Wide widen(VF v) {
  const DD dd;
  const hn::Half<DF> dfh;
  return {hn::PromoteTo(dd, hn::LowerHalf(dfh, v)), hn::PromoteTo(dd, hn::UpperHalf(dfh, v))};
}
HWY_INLINE Wide widen(VI v) {
  const DD dd;
  const hn::Half<D32> dih;
  return {hn::PromoteTo(dd, hn::LowerHalf(dih, v)), hn::PromoteTo(dd, hn::UpperHalf(dih, v))};
}
HWY_INLINE Wide add(Wide a, Wide b) { return {hn::Add(a.lo, b.lo), hn::Add(a.hi, b.hi)}; }
HWY_INLINE Wide mul(Wide a, VD c) { return {hn::Mul(a.lo, c), hn::Mul(a.hi, c)}; }
// Each double rounded to float.
HWY_INLINE VF narrow(Wide w) {
  const DF df;
  const hn::Half<DF> dfh;
  return hn::Combine(df, hn::DemoteTo(dfh, w.hi), hn::DemoteTo(dfh, w.lo));
}

// Bytes 4q .. 4q + 3 of v as int32 lanes.
template <int q>
HWY_INLINE VI quarter(V8 v) {
  const D16 d16;
  const D32 d32;
  const hn::Half<D8> d8h;
  const hn::Half<D16> d16h;
  const auto w = hn::PromoteTo(d16, q < 2 ? hn::LowerHalf(d8h, v) : hn::UpperHalf(d8h, v));
  return hn::PromoteTo(d32, q % 2 == 0 ? hn::LowerHalf(d16h, w) : hn::UpperHalf(d16h, w));
}

// GrayTables::gray_floor of four pixels: float(float(red + green) + blue), floored.
HWY_INLINE VF gray_floor(VI r, VI g, VI b) {
  const DF df;
  const DD dd;
  const Wide red = widen(hn::Mul(hn::ConvertTo(df, r), hn::Set(df, 0.2989f)));
  const Wide green = mul(widen(g), hn::Set(dd, static_cast<double>(0.587f)));
  const VF l = narrow(add(red, green));
  const Wide blue = mul(widen(b), hn::Set(dd, static_cast<double>(0.114f)));
  return hn::Floor(narrow(add(widen(l), blue)));
}

// The blend of one channel's four values x with the gray term: the truncation of
// float(gterm + double(float(x) * ratio)) clamped to [0, 255].
HWY_INLINE VI blend(Wide gterm, VI x, VF ratio) {
  const DF df;
  const D32 d32;
  const VF v = narrow(add(gterm, widen(hn::Mul(hn::ConvertTo(df, x), ratio))));
  return hn::ConvertTo(d32, hn::Min(hn::Max(v, hn::Zero(df)), hn::Set(df, 255.0f)));
}

// Four int32 vectors of values in [0, 255] (bytes in order) to 16 bytes.
HWY_INLINE V8 to_bytes(VI a0, VI a1, VI a2, VI a3) {
  const D8 d8;
  const D16 d16;
  const hn::Half<D8> d8h;
  const hn::Half<D16> d16h;
  const auto w01 = hn::Combine(d16, hn::DemoteTo(d16h, a1), hn::DemoteTo(d16h, a0));
  const auto w23 = hn::Combine(d16, hn::DemoteTo(d16h, a3), hn::DemoteTo(d16h, a2));
  return hn::Combine(d8, hn::DemoteTo(d8h, w23), hn::DemoteTo(d8h, w01));
}

// The 16-pixel steps of the first pixels of the RGB `image` (n pixels): ld3, Kernel::on_quarter<q>
// of pixels 4q .. 4q + 3 into out[channel][q] (with `args`), st3. Returns the pixels done (a
// multiple of 16).
template <class Kernel, class... Args>
HWY_INLINE size_t map_steps(uint8_t* image, size_t n, Args... args) {
  const D8 d8;
  size_t p = 0;
  for (; p + 16 <= n; p += 16) {
    uint8_t* px = image + p * 3;
    V8 r8, g8, b8;
    hn::LoadInterleaved3(d8, px, r8, g8, b8);
    VI out[3][4];
    Kernel::template on_quarter<0>(r8, g8, b8, args..., out);
    Kernel::template on_quarter<1>(r8, g8, b8, args..., out);
    Kernel::template on_quarter<2>(r8, g8, b8, args..., out);
    Kernel::template on_quarter<3>(r8, g8, b8, args..., out);
    const auto bytes = [&](int c) { return to_bytes(out[c][0], out[c][1], out[c][2], out[c][3]); };
    hn::StoreInterleaved3(bytes(0), bytes(1), bytes(2), d8, px);
  }
  return p;
}

// The saturation blend of pixels 4q .. 4q + 3 of the step's channels into out[channel][q].
struct Saturate {
  template <int q>
  static HWY_INLINE void on_quarter(V8 r8, V8 g8, V8 b8, VF ratio, VD alpha, VI (&out)[3][4]) {
    const VI r = quarter<q>(r8), g = quarter<q>(g8), b = quarter<q>(b8);
    const Wide gterm = mul(widen(gray_floor(r, g, b)), alpha);
    out[0][q] = blend(gterm, r, ratio);
    out[1][q] = blend(gterm, g, ratio);
    out[2][q] = blend(gterm, b, ratio);
  }
};

size_t adjust_saturation(uint8_t* image, size_t n, float ratio, float alpha) {
  return map_steps<Saturate>(image, n, hn::Set(DF(), ratio),
                             hn::Set(DD(), static_cast<double>(alpha)));
}

// Pixels 4q .. 4q + 3's gray_floor added to sum (whole numbers below 2^53: exact in any order).
template <int q>
HWY_INLINE void sum_quarter(V8 r8, V8 g8, V8 b8, Wide& sum) {
  sum = add(sum, widen(gray_floor(quarter<q>(r8), quarter<q>(g8), quarter<q>(b8))));
}

int64_t gray_sum(const uint8_t* image, size_t n, size_t& done) {
  const D8 d8;
  const DD dd;
  Wide sum{hn::Zero(dd), hn::Zero(dd)};
  size_t p = 0;
  for (; p + 16 <= n; p += 16) {
    V8 r8, g8, b8;
    hn::LoadInterleaved3(d8, image + p * 3, r8, g8, b8);
    sum_quarter<0>(r8, g8, b8, sum);
    sum_quarter<1>(r8, g8, b8, sum);
    sum_quarter<2>(r8, g8, b8, sum);
    sum_quarter<3>(r8, g8, b8, sum);
  }
  alignas(16) double lanes[4];
  hn::Store(sum.lo, dd, lanes);
  hn::Store(sum.hi, dd, lanes + 2);
  done = p;
  return static_cast<int64_t>(lanes[0]) + static_cast<int64_t>(lanes[1]) +
         static_cast<int64_t>(lanes[2]) + static_cast<int64_t>(lanes[3]);
}

// adjust_hue's HSV round trip (augment.cpp's scalar loop) of pixels 4q .. 4q + 3 into
// out[channel][q]: its float operations in its order, its selects as IfThenElse, its floor_small
// as Floor (equal for these values: |v| < 8, no NaN). The scalar code multiplies each hue term by
// 1.0f or 0.0f (not a select: a product can be -0.0f); so do these lanes.
struct Hue {
  template <int q>
  static HWY_INLINE void on_quarter(V8 r8, V8 g8, V8 b8, VF hue, VI (&out)[3][4]) {
    const DF df;
    const D32 d32;
    const VF one = hn::Set(df, 1.0f), inv255 = hn::Set(df, static_cast<float>(1.0 / 255));
    const VF r = hn::Mul(hn::ConvertTo(df, quarter<q>(r8)), inv255);
    const VF g = hn::Mul(hn::ConvertTo(df, quarter<q>(g8)), inv255);
    const VF b = hn::Mul(hn::ConvertTo(df, quarter<q>(b8)), inv255);
    // _rgb_to_hsv
    const VF maxc = hn::Max(hn::Max(r, g), b);
    const VF minc = hn::Min(hn::Min(r, g), b);
    const auto eqc = hn::Eq(maxc, minc);
    const VF cr = hn::Sub(maxc, minc);
    const VF s = hn::Div(cr, hn::IfThenElse(eqc, one, maxc));
    const VF crd = hn::IfThenElse(eqc, one, cr);
    const VF rc = hn::Div(hn::Sub(maxc, r), crd);
    const VF gc = hn::Div(hn::Sub(maxc, g), crd);
    const VF bc = hn::Div(hn::Sub(maxc, b), crd);
    const auto max_ne_r = hn::Ne(maxc, r);
    const auto max_eq_g = hn::Eq(maxc, g);
    const VF hg = hn::Mul(hn::Sub(hn::Add(rc, hn::Set(df, 2.0f)), bc),
                          hn::IfThenElseZero(hn::And(max_eq_g, max_ne_r), one));
    const VF hr = hn::Mul(hn::Sub(bc, gc), hn::IfThenZeroElse(max_ne_r, one));
    const VF hb = hn::Mul(hn::Sub(hn::Add(gc, hn::Set(df, 4.0f)), rc),
                          hn::IfThenElseZero(hn::AndNot(max_eq_g, max_ne_r), one));
    const VF sixth = hn::Set(df, static_cast<float>(1.0 / 6.0));
    VF h = hn::Add(hn::Mul(hn::Add(hn::Add(hr, hg), hb), sixth), one);
    h = hn::Sub(h, hn::Floor(h));
    h = hn::Add(h, hue);
    h = hn::Sub(h, hn::Floor(h));  // 1.0f where h + hue is in [-2^-25, 0): 1 + it rounds up
    // _hsv_to_rgb
    const VF h6 = hn::Mul(h, hn::Set(df, 6.0f));
    const VF i = hn::Floor(h6);
    const VF f = hn::Sub(h6, i);
    const VF sector =
        hn::IfThenZeroElse(hn::Eq(i, hn::Set(df, 6.0f)), i);  // int(i) % 6, i in [0, 6]
    const VF sxf = hn::Mul(s, f);
    const VF one_minus_s = hn::Sub(one, s);
    const auto clamp01 = [&](VF x) { return hn::Min(hn::Max(x, hn::Zero(df)), one); };
    const VF vpqt[4] = {maxc, clamp01(hn::Mul(one_minus_s, maxc)),
                        clamp01(hn::Mul(hn::Sub(one, sxf), maxc)),
                        clamp01(hn::Mul(hn::Add(sxf, one_minus_s), maxc))};
    static constexpr int kSelect[3][6] = {
        {0, 2, 1, 1, 3, 0}, {3, 0, 0, 2, 1, 1}, {1, 1, 3, 0, 0, 2}};
    const VF to_u8 = hn::Set(df, static_cast<float>(255 + 1.0 - 1e-3));
    for (int c = 0; c < 3; ++c) {
      VF chosen = vpqt[kSelect[c][5]];  // sector 5 unless one of 0 .. 4
      for (int sec = 0; sec < 5; ++sec) {
        chosen = hn::IfThenElse(hn::Eq(sector, hn::Set(df, static_cast<float>(sec))),
                                vpqt[kSelect[c][sec]], chosen);
      }
      // chosen * to_u8 is in [0, 256): truncated, a byte's value
      out[c][q] = hn::ConvertTo(d32, hn::Mul(chosen, to_u8));
    }
  }
};

size_t adjust_hue(uint8_t* image, size_t n, float hue) {
  return map_steps<Hue>(image, n, hn::Set(DF(), hue));
}

}  // namespace HWY_NAMESPACE
}  // namespace gpufeed::transforms::hwy_colour
HWY_AFTER_NAMESPACE();
#endif  // GPUFEED_HWY_128

namespace gpufeed::transforms::hwy_colour {

#if GPUFEED_HWY_128

bool available() { return hwy_128_available(); }

size_t adjust_saturation(uint8_t* image, size_t n, float ratio, float alpha) {
  return HWY_NAMESPACE::adjust_saturation(image, n, ratio, alpha);
}

int64_t gray_sum(const uint8_t* image, size_t n, size_t& done) {
  return HWY_NAMESPACE::gray_sum(image, n, done);
}

size_t adjust_hue(uint8_t* image, size_t n, float hue) {
  return HWY_NAMESPACE::adjust_hue(image, n, hue);
}

#else  // no 128-bit Highway target in this build: color_kernel_supported(kHighway) is false

bool available() { return false; }
size_t adjust_saturation(uint8_t*, size_t, float, float) { return 0; }
size_t adjust_hue(uint8_t*, size_t, float) { return 0; }
int64_t gray_sum(const uint8_t*, size_t, size_t& done) {
  done = 0;
  return 0;
}

#endif

}  // namespace gpufeed::transforms::hwy_colour
