// The per-sample augmentations (augment.h): torchvision.transforms.v2's auto-augment family,
// ColorJitter and RandomErasing on [H, W, 3] uint8 images. Where torchvision computes in float32
// the same float32 operations are done here in the same order (fused multiply-adds where ATen's
// vectorised CPU kernels fuse), so the goldens can hold most ops to every pixel; colour ops whose
// result depends on the pixel value alone run through 256-entry lookup tables.
#include "gpufeed/transforms/augment.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "gpufeed/cpu_features.h"
#endif
#include "gpufeed/glibc_libm.h"

#include "augment_hwy.h"
#include "colour_hwy.h"

namespace gpufeed::transforms {
namespace {

using Op = AugmentOp;

// TrivialAugmentWide's and RandAugment's _AUGMENTATION_SPACE, in dict order.
constexpr std::array<Op, 14> kWideSpace = {
    Op::kIdentity,   Op::kShearX,  Op::kShearY,    Op::kTranslateX, Op::kTranslateY,
    Op::kRotate,     Op::kBrightness, Op::kColor,  Op::kContrast,   Op::kSharpness,
    Op::kPosterize,  Op::kSolarize, Op::kAutoContrast, Op::kEqualize};

// AutoAugment's ImageNet policy (AutoAugment._get_policies(IMAGENET)): (op, probability, bin),
// bin -1 for ops without magnitudes.
struct PolicyOp {
  Op op;
  float probability;
  int bin;
};
constexpr std::array<std::array<PolicyOp, 2>, 25> kImageNetPolicy = {{
    {{{Op::kPosterize, 0.4f, 8}, {Op::kRotate, 0.6f, 9}}},
    {{{Op::kSolarize, 0.6f, 5}, {Op::kAutoContrast, 0.6f, -1}}},
    {{{Op::kEqualize, 0.8f, -1}, {Op::kEqualize, 0.6f, -1}}},
    {{{Op::kPosterize, 0.6f, 7}, {Op::kPosterize, 0.6f, 6}}},
    {{{Op::kEqualize, 0.4f, -1}, {Op::kSolarize, 0.2f, 4}}},
    {{{Op::kEqualize, 0.4f, -1}, {Op::kRotate, 0.8f, 8}}},
    {{{Op::kSolarize, 0.6f, 3}, {Op::kEqualize, 0.6f, -1}}},
    {{{Op::kPosterize, 0.8f, 5}, {Op::kEqualize, 1.0f, -1}}},
    {{{Op::kRotate, 0.2f, 3}, {Op::kSolarize, 0.6f, 8}}},
    {{{Op::kEqualize, 0.6f, -1}, {Op::kPosterize, 0.4f, 6}}},
    {{{Op::kRotate, 0.8f, 8}, {Op::kColor, 0.4f, 0}}},
    {{{Op::kRotate, 0.4f, 9}, {Op::kEqualize, 0.6f, -1}}},
    {{{Op::kEqualize, 0.0f, -1}, {Op::kEqualize, 0.8f, -1}}},
    {{{Op::kInvert, 0.6f, -1}, {Op::kEqualize, 1.0f, -1}}},
    {{{Op::kColor, 0.6f, 4}, {Op::kContrast, 1.0f, 8}}},
    {{{Op::kRotate, 0.8f, 8}, {Op::kColor, 1.0f, 2}}},
    {{{Op::kColor, 0.8f, 8}, {Op::kSolarize, 0.8f, 7}}},
    {{{Op::kSharpness, 0.4f, 7}, {Op::kInvert, 0.6f, -1}}},
    {{{Op::kShearX, 0.6f, 5}, {Op::kEqualize, 1.0f, -1}}},
    {{{Op::kColor, 0.4f, 0}, {Op::kEqualize, 0.6f, -1}}},
    {{{Op::kEqualize, 0.4f, -1}, {Op::kSolarize, 0.2f, 4}}},
    {{{Op::kSolarize, 0.6f, 5}, {Op::kAutoContrast, 0.6f, -1}}},
    {{{Op::kInvert, 0.6f, -1}, {Op::kEqualize, 1.0f, -1}}},
    {{{Op::kColor, 0.6f, 4}, {Op::kContrast, 1.0f, 8}}},
    {{{Op::kEqualize, 0.8f, -1}, {Op::kEqualize, 0.6f, -1}}},
}};

// torch.linspace(start, end, n)[i] in float32 as ATen's CPU kernel computes it: the first half
// from the start, the second from the end, each a fused multiply-add.
float linspace_at(float start, float end, int n, int i) {
  const float step = (end - start) / static_cast<float>(n - 1);
  if (i < n / 2) return std::fma(step, static_cast<float>(i), start);
  return std::fma(-step, static_cast<float>(n - 1 - i), end);
}

// torch's fused multiply-adds, fma(a, b, c) rounded once, without an FMA instruction (the build
// targets baseline x86-64): for a whole a with |a| <= 2^9 and floats b, c below 2^9 in magnitude,
// the double a * b (at most 33 significant bits) and the double sum are exact, so converting the
// sum to float is the single rounding. The kernels below table a * b as doubles ("fma_int").

// Round half to even (nearbyint in the default rounding mode) to an integer, for |v| < 2^22:
// adding 1.5 * 2^23 leaves the rounded value in the sum's low mantissa bits (not folded: no
// -ffast-math).
inline int32_t round_to_int(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return std::bit_cast<int32_t>(v + kMagic) - std::bit_cast<int32_t>(kMagic);
}

// floor for |v| < 2^31, inline.
inline float floor_small(float v) {
  const auto t = static_cast<float>(static_cast<int32_t>(v));
  return t - static_cast<float>(t > v);  // branch-free
}

// Python's round() on a float (half to even, the default rounding mode).
int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }

// CPython's math.degrees / math.radians.
double degrees(double x) { return x * (180.0 / std::numbers::pi); }
double radians(double x) { return x * (std::numbers::pi / 180.0); }

// clamp_(0, 255) then .to(torch.uint8), without branches (the blends saturate on data-dependent
// pixels, which a branch predictor cannot learn): SSE's minss/maxss where there is SSE.
inline uint8_t to_u8_trunc(float v) {
#if defined(__SSE__)
  const __m128 x = _mm_min_ss(_mm_max_ss(_mm_set_ss(v), _mm_setzero_ps()), _mm_set_ss(255.0f));
  return static_cast<uint8_t>(_mm_cvttss_si32(x));
#else
  return static_cast<uint8_t>(static_cast<int>(std::min(std::max(v, 0.0f), 255.0f)));
#endif
}

size_t pixel_count(int height, int width) { return static_cast<size_t>(height) * static_cast<size_t>(width); }

void apply_lut(uint8_t* image, int height, int width, const std::array<std::array<uint8_t, 256>, 3>& lut) {
  const size_t n = pixel_count(height, width);
  for (size_t p = 0; p < n; ++p, image += 3) {
    image[0] = lut[0][image[0]];
    image[1] = lut[1][image[1]];
    image[2] = lut[2][image[2]];
  }
}

void apply_lut(uint8_t* image, int height, int width, const std::array<uint8_t, 256>& lut) {
  const size_t n = pixel_count(height, width) * 3;
  for (size_t k = 0; k < n; ++k) image[k] = lut[image[k]];
}

// _rgb_to_grayscale_image(..., preserve_dtype=False).floor_(): r * 0.2989 + g * 0.587 + b * 0.114
// with add_(alpha=...) fused. The fused adds are fma_int's: the products and the red term are
// tabled as the doubles fma_int would form, so a pixel costs two double adds and two roundings.
struct GrayTables {
  std::array<double, 256> red{}, green{}, blue{};
  GrayTables() {
    for (int v = 0; v < 256; ++v) {
      red[static_cast<size_t>(v)] = static_cast<float>(v) * 0.2989f;  // float product, as torch's mul
      green[static_cast<size_t>(v)] = static_cast<double>(v) * static_cast<double>(0.587f);
      blue[static_cast<size_t>(v)] = static_cast<double>(v) * static_cast<double>(0.114f);
    }
  }
  float gray_floor(uint8_t r, uint8_t g, uint8_t b) const {
    const float l = static_cast<float>(red[r] + green[g]);  // fma_int(g, 0.587f, r * 0.2989f)
    return floor_small(static_cast<float>(static_cast<double>(l) + blue[b]));
  }
};
const GrayTables& gray_tables() {
  static const GrayTables t;
  return t;
}

#if defined(__x86_64__)
// GrayTables::gray_floor of 4 pixels (r, g, b as int32 lanes): the same float and double
// operations (the tables hold exact products: a float product widened, and an 8-bit integer
// times a float, exact in double), so the same values.
__attribute__((target("avx2"), always_inline)) inline __m128 gray_floor4(__m128i r, __m128i g, __m128i b) {
  const __m256d red = _mm256_cvtps_pd(_mm_mul_ps(_mm_cvtepi32_ps(r), _mm_set1_ps(0.2989f)));
  const __m256d green = _mm256_mul_pd(_mm256_cvtepi32_pd(g), _mm256_set1_pd(static_cast<double>(0.587f)));
  const __m128 l = _mm256_cvtpd_ps(_mm256_add_pd(red, green));
  const __m256d blue = _mm256_mul_pd(_mm256_cvtepi32_pd(b), _mm256_set1_pd(static_cast<double>(0.114f)));
  const __m128 t = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_cvtps_pd(l), blue));
  return _mm_round_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

// The r, g, b bytes of 4 pixels at `px` as int32 lanes.
__attribute__((target("avx2"), always_inline)) inline void load_rgb4(const uint8_t* px, __m128i& r, __m128i& g,
                                                                        __m128i& b) {
  r = _mm_setr_epi32(px[0], px[3], px[6], px[9]);
  g = _mm_setr_epi32(px[1], px[4], px[7], px[10]);
  b = _mm_setr_epi32(px[2], px[5], px[8], px[11]);
}

// adjust_saturation's blend of one channel's 4 values `x` with gray term `gterm`:
// to_u8_trunc(float(gterm + double(float(x) * ratio))).
__attribute__((target("avx2"), always_inline)) inline __m128i blend4(__m256d gterm, __m128i x, __m128 ratio) {
  const __m256d scaled = _mm256_cvtps_pd(_mm_mul_ps(_mm_cvtepi32_ps(x), ratio));
  const __m128 v = _mm256_cvtpd_ps(_mm256_add_pd(gterm, scaled));
  return _mm_cvttps_epi32(_mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(255.0f)));
}

// adjust_saturation on 4 pixels per step; returns the pixels done (the caller does the rest).
__attribute__((target("avx2"))) size_t adjust_saturation_avx2(uint8_t* image, size_t n, float ratio, float alpha) {
  const __m128 vratio = _mm_set1_ps(ratio);
  const __m256d valpha = _mm256_set1_pd(static_cast<double>(alpha));
  alignas(16) int32_t out[3][4];
  size_t p = 0;
  for (; p + 4 <= n; p += 4) {
    uint8_t* px = image + p * 3;
    __m128i r, g, b;
    load_rgb4(px, r, g, b);
    const __m256d gterm = _mm256_mul_pd(_mm256_cvtps_pd(gray_floor4(r, g, b)), valpha);
    _mm_store_si128(reinterpret_cast<__m128i*>(out[0]), blend4(gterm, r, vratio));
    _mm_store_si128(reinterpret_cast<__m128i*>(out[1]), blend4(gterm, g, vratio));
    _mm_store_si128(reinterpret_cast<__m128i*>(out[2]), blend4(gterm, b, vratio));
    for (int j = 0; j < 4; ++j) {
      px[3 * j] = static_cast<uint8_t>(out[0][j]);
      px[3 * j + 1] = static_cast<uint8_t>(out[1][j]);
      px[3 * j + 2] = static_cast<uint8_t>(out[2][j]);
    }
  }
  return p;
}

// The sum of gray_floor over the first pixels of `image`, 4 per step; `done` the pixels summed.
__attribute__((target("avx2"))) int64_t gray_sum_avx2(const uint8_t* image, size_t n, size_t& done) {
  __m256d sum = _mm256_setzero_pd();  // whole numbers below 2^53: exact
  size_t p = 0;
  for (; p + 4 <= n; p += 4) {
    __m128i r, g, b;
    load_rgb4(image + p * 3, r, g, b);
    sum = _mm256_add_pd(sum, _mm256_cvtps_pd(gray_floor4(r, g, b)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, sum);
  done = p;
  return static_cast<int64_t>(lanes[0]) + static_cast<int64_t>(lanes[1]) + static_cast<int64_t>(lanes[2]) +
         static_cast<int64_t>(lanes[3]);
}
#endif

// `kernel` if `supported`; else std::invalid_argument, `no_avx2` for kAvx2.
ColorKernel checked_kernel(ColorKernel kernel, bool supported, const char* no_avx2) {
  if (!supported) {
    throw std::invalid_argument(kernel == ColorKernel::kAvx2 ? no_avx2
                                                             : "ColorKernel::kHighway: not in this build or CPU");
  }
  return kernel;
}

// The vector loop a colour kernel runs for `kernel`, then the scalar loop does the pixels the
// vector one leaves (fewer than its step). kAuto: AVX2 on x86 CPUs with it, Highway elsewhere where
// built; GPUFEED_RESIZE_KERNEL=scalar makes it scalar and =hwy Highway (an x86 machine then runs
// aarch64's choice), other values leave it (resize.cpp checks them).
ColorKernel colour_kernel(ColorKernel kernel) {
  if (kernel == ColorKernel::kAuto) return auto_color_kernel();
  return checked_kernel(kernel, color_kernel_supported(kernel), "ColorKernel::kAvx2 on a CPU without AVX2");
}

// The loop gaussian_blur and the bilinear warp run for `kernel` (fma_kernel_supported in augment.h:
// their sums need fused multiply-adds, so on x86 kAvx2 and kHighway need FMA too). kAuto:
// auto_color_kernel()'s choice (GPUFEED_RESIZE_KERNEL included), kScalar where these lack it.
ColorKernel fma_kernel(ColorKernel kernel) {
  if (kernel != ColorKernel::kAuto) {
    return checked_kernel(kernel, fma_kernel_supported(kernel), "ColorKernel::kAvx2: no AVX2 and FMA on this CPU");
  }
  static const ColorKernel chosen = [] {
    const ColorKernel k = auto_color_kernel();
    return fma_kernel_supported(k) ? k : ColorKernel::kScalar;
  }();
  return chosen;
}

void check_factor(const char* what, double factor) {
  if (!(factor >= 0)) {
    throw std::invalid_argument(fmt::format("{}: factor {} is not non-negative", what, factor));
  }
}

uint8_t* copy_into(AugmentScratch& scratch, const uint8_t* image, int height, int width) {
  const size_t n = pixel_count(height, width) * 3;
  scratch.copy.resize(n);
  std::copy(image, image + n, scratch.copy.data());
  return scratch.copy.data();
}

// The inverse affine matrix of torchvision's _get_inverse_affine_matrix (scale 1), in double and
// in Python's evaluation order, with Python's math functions (glibc's libm: glibc_libm.h).
std::array<double, 6> inverse_affine_matrix(double cx, double cy, double angle, double tx, double ty,
                                            double shear_x, double shear_y) {
  const double rot = radians(angle);
  const double sx = radians(shear_x);
  const double sy = radians(shear_y);
  const double cos_sy = libm::cos(sy);
  const double tan_sx = libm::tan(sx);
  const double rot_minus_sy = rot - sy;
  const double cx_plus_tx = cx + tx;
  const double cy_plus_ty = cy + ty;
  const double a = libm::cos(rot_minus_sy) / cos_sy;
  const double b = -(a * tan_sx + libm::sin(rot));
  const double c = libm::sin(rot_minus_sy) / cos_sy;
  const double d = libm::cos(rot) - c * tan_sx;
  std::array<double, 6> m = {d, -b, 0.0, -c, a, 0.0};
  m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
  m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
  return m;
}

}  // namespace

// AffineGrid (augment_hwy.h, for the Highway warp).
AffineGrid::AffineGrid(int height, int width, const std::array<double, 6>& matrix) {
  std::array<float, 6> t{};
  for (size_t k = 0; k < 6; ++k) t[k] = static_cast<float>(matrix[k]);
  const float half_w = static_cast<float>(0.5 * width);
  const float half_h = static_cast<float>(0.5 * height);
  // rescaled_theta = theta.transpose(1, 2) / [0.5 w, 0.5 h]
  const float xa = t[0] / half_w, ya = t[3] / half_h;
  xb = t[1] / half_w, xc = t[2] / half_w;
  yb = t[4] / half_h, yc = t[5] / half_h;
  const float x0 = (1.0f - static_cast<float>(width)) * 0.5f;
  y0 = (1.0f - static_cast<float>(height)) * 0.5f;
  thread_local std::vector<float> col_xs, col_ys;
  col_xs.resize(static_cast<size_t>(width));
  col_ys.resize(static_cast<size_t>(width));
  for (int x = 0; x < width; ++x) {
    const float bx = x0 + static_cast<float>(x);
    col_xs[static_cast<size_t>(x)] = bx * xa;
    col_ys[static_cast<size_t>(x)] = bx * ya;
  }
  col_x = col_xs.data();  // plain pointers: the uint8 stores may alias anything
  col_y = col_ys.data();
}

namespace {

// Calls sample(out, gx, gy) for the output pixels x in [x_begin, width) of every row.
template <typename Sample>
[[gnu::always_inline]] inline void for_each_grid_point(uint8_t* image, int height, int width, const AffineGrid& g,
                                                       int x_begin, Sample&& sample) {
  const size_t row = static_cast<size_t>(width) * 3;
  for (int y = 0; y < height; ++y) {
    const float row_x = g.row_x(y), row_y = g.row_y(y);
    uint8_t* out = image + static_cast<size_t>(y) * row + static_cast<size_t>(x_begin) * 3;
    for (int x = x_begin; x < width; ++x, out += 3) {
      const float gx = (g.col_x[static_cast<size_t>(x)] + row_x) + g.xc;
      const float gy = (g.col_y[static_cast<size_t>(x)] + row_y) + g.yc;
      sample(out, gx, gy);
    }
  }
}

// grid_sample(mode="nearest", padding_mode="zeros", align_corners=False) + round: the source
// pixel is round-half-even((g + 1) * size/2 - 0.5), black outside the image.
void grid_nearest(uint8_t* image, int height, int width, const std::array<double, 6>& matrix,
                  AugmentScratch& scratch) {
  copy_into(scratch, image, height, width);
  const size_t zero_pixel = scratch.copy.size();  // a black pixel after the copy: out-of-image taps
  scratch.copy.resize(zero_pixel + 3, 0);
  const uint8_t* src = scratch.copy.data();
  const float sx = static_cast<float>(width) / 2, sy = static_cast<float>(height) / 2;
  const size_t row = static_cast<size_t>(width) * 3;
  for_each_grid_point(image, height, width, AffineGrid(height, width, matrix), 0, [&](uint8_t* out, float gx, float gy) {
    const int32_t ix = round_to_int((gx + 1.0f) * sx - 0.5f);
    const int32_t iy = round_to_int((gy + 1.0f) * sy - 0.5f);
    const bool inside = static_cast<uint32_t>(ix) < static_cast<uint32_t>(width) &&
                        static_cast<uint32_t>(iy) < static_cast<uint32_t>(height);
    const size_t at = inside ? static_cast<size_t>(iy) * row + static_cast<size_t>(ix) * 3 : zero_pixel;
    out[0] = src[at];
    out[1] = src[at + 1];
    out[2] = src[at + 2];
  });
}

// grid_sample(mode="bilinear", padding_mode="zeros", align_corners=False) on the image as float32,
// then round-half-even to uint8, as ATen's vectorised CPU kernel (ApplyGridSample<Bilinear>)
// computes it on AVX2: the location fma(g + 1, size/2, -0.5), the weights from floor, and the
// four taps accumulated as fma(se_v, se, fma(sw_v, sw, fma(ne_v, ne, nw_v * nw))), where the
// compiler fused ATen's `a * b + c`. Taps outside the image are 0: `padded` is the image with a
// one-pixel black border ([height + 2, width + 2, 3]), so every tap of a point whose
// north-west tap is in [-1, width - 1] x [-1, height - 1] is a plain read, and a point beyond
// that has four black taps (0). std::fma is exact everywhere; grid_bilinear_fma below is the
// same body compiled for CPUs with the FMA instruction.
[[gnu::always_inline]] inline void grid_bilinear_body(uint8_t* image, int height, int width, const AffineGrid& g,
                                                      int x_begin, const uint8_t* padded) {
  const float sx = static_cast<float>(width) / 2, sy = static_cast<float>(height) / 2;
  const int64_t prow = (static_cast<int64_t>(width) + 2) * 3;
  for_each_grid_point(image, height, width, g, x_begin, [&](uint8_t* out, float gx, float gy) {
    const float x = std::fma(gx + 1.0f, sx, -0.5f);
    const float y = std::fma(gy + 1.0f, sy, -0.5f);
    const float x_w = std::floor(x), y_n = std::floor(y);
    if (!(x_w >= -1.0f && x_w <= static_cast<float>(width - 1) && y_n >= -1.0f &&
          y_n <= static_cast<float>(height - 1))) {
      out[0] = out[1] = out[2] = 0;
      return;
    }
    const float w = x - x_w, e = 1.0f - w;
    const float n = y - y_n, s = 1.0f - n;
    const float nw = s * e, ne = s * w, sw = n * e, se = n * w;
    const uint8_t* p = padded + (static_cast<int64_t>(y_n) + 1) * prow + (static_cast<int64_t>(x_w) + 1) * 3;
    for (int c = 0; c < 3; ++c) {
      const float v = std::fma(static_cast<float>(p[prow + 3 + c]), se,
                               std::fma(static_cast<float>(p[prow + c]), sw,
                                        std::fma(static_cast<float>(p[3 + c]), ne, static_cast<float>(p[c]) * nw)));
      out[c] = static_cast<uint8_t>(std::min(round_to_int(v), 255));
    }
  });
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("fma"))) void grid_bilinear_fma(uint8_t* image, int height, int width, const AffineGrid& g,
                                                      const uint8_t* padded) {
  grid_bilinear_body(image, height, width, g, 0, padded);
}

// Channel c (byte c) of each lane's 32-bit tap, as float.
__attribute__((target("avx2"), always_inline)) inline __m256 tap_channel(__m256i t, int c, __m256i byte) {
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(t, 8 * c), byte));
}

// The same arithmetic, 8 output pixels per step in AVX2 lanes (each lane does the scalar body's
// float32 operations in the same order, so the results are the same bits), the columns left
// over by the scalar body. The taps are 32-bit gathers from the padded image (R, G, B and a
// byte more; `padded` has 4 spare bytes at its end); points outside get index 0 and output 0.
__attribute__((target("avx2,fma"))) void grid_bilinear_avx2(uint8_t* image, int height, int width,
                                                            const AffineGrid& g, const uint8_t* padded) {
  const int32_t prow = (width + 2) * 3;
  const __m256 one = _mm256_set1_ps(1.0f), minus_half = _mm256_set1_ps(-0.5f), minus_one = _mm256_set1_ps(-1.0f);
  const __m256 sx = _mm256_set1_ps(static_cast<float>(width) / 2), sy = _mm256_set1_ps(static_cast<float>(height) / 2);
  const __m256 x_max = _mm256_set1_ps(static_cast<float>(width - 1)), y_max = _mm256_set1_ps(static_cast<float>(height - 1));
  const __m256 xc = _mm256_set1_ps(g.xc), yc = _mm256_set1_ps(g.yc);
  const __m256i byte = _mm256_set1_epi32(0xff), max255 = _mm256_set1_epi32(255);
  const __m256i v_prow = _mm256_set1_epi32(prow), three = _mm256_set1_epi32(3);
  const auto* base_ptr = reinterpret_cast<const int*>(padded);
  const int vector_end = width / 8 * 8;
  const size_t row = static_cast<size_t>(width) * 3;
  alignas(32) int32_t res[3][8];
  for (int y = 0; y < height; ++y) {
    const __m256 row_x = _mm256_set1_ps(g.row_x(y)), row_y = _mm256_set1_ps(g.row_y(y));
    uint8_t* out = image + static_cast<size_t>(y) * row;
    for (int x = 0; x < vector_end; x += 8, out += 24) {
      const __m256 gx = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(g.col_x + x), row_x), xc);
      const __m256 gy = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(g.col_y + x), row_y), yc);
      const __m256 fx = _mm256_fmadd_ps(_mm256_add_ps(gx, one), sx, minus_half);
      const __m256 fy = _mm256_fmadd_ps(_mm256_add_ps(gy, one), sy, minus_half);
      const __m256 x_w = _mm256_floor_ps(fx), y_n = _mm256_floor_ps(fy);
      const __m256 inside = _mm256_and_ps(
          _mm256_and_ps(_mm256_cmp_ps(x_w, minus_one, _CMP_GE_OQ), _mm256_cmp_ps(x_w, x_max, _CMP_LE_OQ)),
          _mm256_and_ps(_mm256_cmp_ps(y_n, minus_one, _CMP_GE_OQ), _mm256_cmp_ps(y_n, y_max, _CMP_LE_OQ)));
      const __m256 w = _mm256_sub_ps(fx, x_w), e = _mm256_sub_ps(one, w);
      const __m256 n = _mm256_sub_ps(fy, y_n), s = _mm256_sub_ps(one, n);
      const __m256 nw = _mm256_mul_ps(s, e), ne = _mm256_mul_ps(s, w), sw = _mm256_mul_ps(n, e),
                   se = _mm256_mul_ps(n, w);
      const __m256i ix = _mm256_cvttps_epi32(_mm256_and_ps(inside, _mm256_add_ps(x_w, one)));  // 0 outside
      const __m256i iy = _mm256_cvttps_epi32(_mm256_and_ps(inside, _mm256_add_ps(y_n, one)));
      const __m256i at = _mm256_add_epi32(_mm256_mullo_epi32(iy, v_prow), _mm256_mullo_epi32(ix, three));
      const __m256i t_nw = _mm256_i32gather_epi32(base_ptr, at, 1);
      const __m256i t_ne = _mm256_i32gather_epi32(base_ptr, _mm256_add_epi32(at, three), 1);
      const __m256i at_s = _mm256_add_epi32(at, v_prow);
      const __m256i t_sw = _mm256_i32gather_epi32(base_ptr, at_s, 1);
      const __m256i t_se = _mm256_i32gather_epi32(base_ptr, _mm256_add_epi32(at_s, three), 1);
      const __m256i inside_i = _mm256_castps_si256(inside);
      for (int c = 0; c < 3; ++c) {
        const __m256 v = _mm256_fmadd_ps(
            tap_channel(t_se, c, byte), se,
            _mm256_fmadd_ps(tap_channel(t_sw, c, byte), sw,
                            _mm256_fmadd_ps(tap_channel(t_ne, c, byte), ne, _mm256_mul_ps(tap_channel(t_nw, c, byte), nw))));
        const __m256i r = _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm256_store_si256(reinterpret_cast<__m256i*>(res[c]), _mm256_and_si256(_mm256_min_epi32(r, max255), inside_i));
      }
      for (int k = 0; k < 8; ++k) {
        out[3 * k] = static_cast<uint8_t>(res[0][k]);
        out[3 * k + 1] = static_cast<uint8_t>(res[1][k]);
        out[3 * k + 2] = static_cast<uint8_t>(res[2][k]);
      }
    }
  }
  if (vector_end < width) grid_bilinear_body(image, height, width, g, vector_end, padded);
}
#endif

// `kernel` as fma_kernel resolves it: AVX2 (8 points per step), Highway (4) or the scalar body
// (compiled for the FMA instruction where the CPU has it); each runs the body from the column
// where its vector loop stops.
void grid_bilinear(uint8_t* image, int height, int width, const std::array<double, 6>& matrix,
                   ColorKernel kernel, AugmentScratch& scratch) {
  const size_t row = static_cast<size_t>(width) * 3, prow = row + 6;
  scratch.copy.assign(prow * (static_cast<size_t>(height) + 2) + 4, 0);  // + 4: the gathers' spare bytes
  for (int y = 0; y < height; ++y) {
    std::copy_n(image + static_cast<size_t>(y) * row, row, scratch.copy.data() + (static_cast<size_t>(y) + 1) * prow + 3);
  }
  const uint8_t* padded = scratch.copy.data();
  const AffineGrid g(height, width, matrix);
  const ColorKernel path = fma_kernel(kernel);
  if (path == ColorKernel::kHighway) {
    const int done = hwy_augment::grid_bilinear(image, height, width, g, padded);
    if (done < width) grid_bilinear_body(image, height, width, g, done, padded);
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  if (path == ColorKernel::kAvx2) return grid_bilinear_avx2(image, height, width, g, padded);
  static const bool has_fma = gpufeed::cpu::x86_features().fma;
  if (has_fma) return grid_bilinear_fma(image, height, width, g, padded);
#endif
  grid_bilinear_body(image, height, width, g, 0, padded);
}

void grid_sample(uint8_t* image, int height, int width, const std::array<double, 6>& matrix,
                 InterpolationMode interpolation, ColorKernel kernel, AugmentScratch& scratch) {
  if (interpolation == InterpolationMode::kBilinear) {
    return grid_bilinear(image, height, width, matrix, kernel, scratch);
  }
  grid_nearest(image, height, width, matrix, scratch);
}

// out(y, x) = in(y - dy, x - dx), 0 outside.
void shift(uint8_t* image, int height, int width, int dx, int dy, AugmentScratch& scratch) {
  const uint8_t* src = copy_into(scratch, image, height, width);
  const size_t row = static_cast<size_t>(width) * 3;
  const int x0 = std::clamp(dx, 0, width), x1 = std::clamp(width + dx, 0, width);  // out columns with a source
  for (int y = 0; y < height; ++y) {
    uint8_t* out = image + static_cast<size_t>(y) * row;
    const int sy = y - dy;
    if (sy < 0 || sy >= height || x0 >= x1) {
      std::fill(out, out + row, uint8_t{0});
      continue;
    }
    std::fill(out, out + static_cast<size_t>(x0) * 3, uint8_t{0});
    std::copy(src + static_cast<size_t>(sy) * row + static_cast<size_t>(x0 - dx) * 3,
              src + static_cast<size_t>(sy) * row + static_cast<size_t>(x1 - dx) * 3, out + static_cast<size_t>(x0) * 3);
    std::fill(out + static_cast<size_t>(x1) * 3, out + row, uint8_t{0});
  }
}

// torch.rot90(image, k, dims=(-2, -1)) on a square image (k = 1, 3) or any image (k = 2).
void rot90(uint8_t* image, int height, int width, int k, AugmentScratch& scratch) {
  const uint8_t* src = copy_into(scratch, image, height, width);
  const size_t row = static_cast<size_t>(width) * 3;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      int sy, sx;
      if (k == 1) {
        sy = x, sx = width - 1 - y;  // flip(W) then transpose
      } else if (k == 3) {
        sy = height - 1 - x, sx = y;  // flip(H) then transpose
      } else {
        sy = height - 1 - y, sx = width - 1 - x;
      }
      const uint8_t* s = src + static_cast<size_t>(sy) * row + static_cast<size_t>(sx) * 3;
      uint8_t* o = image + static_cast<size_t>(y) * row + static_cast<size_t>(x) * 3;
      o[0] = s[0];
      o[1] = s[1];
      o[2] = s[2];
    }
  }
}

float uniform01(DrawSource& d) { return d.uniform(0.0f, 1.0f); }

uint8_t erase_value(float v, float mean, float std) {
  return static_cast<uint8_t>(std::clamp(std::nearbyint(255.0f * (mean + std * v)), 0.0f, 255.0f));
}

// RandomApply / _RandomApplyTransform: torch.rand(1) >= p skips. p = 0 is off without a draw.
bool applies(float p, DrawSource& draws) { return p > 0 && !(uniform01(draws) >= p); }

void plan_color_jitter(const ColorJitterOptions& o, float p, DrawSource& draws, AugmentPlan& plan) {
  plan.color_jitter = o.enabled() && p > 0;
  if (!plan.color_jitter) return;
  // RandomApply([ColorJitter], p); p = 1 is the plain ColorJitter, without that draw.
  if (p < 1 && !applies(p, draws)) {
    plan.color_jitter = false;
    return;
  }
  draws.randperm(4, plan.jitter_order.data());
  // torchvision's _check_input: [max(0, 1 - v), 1 + v]; hue [-v, v]; 0 = off (no draw).
  const std::array<float, 4> v = {o.brightness, o.contrast, o.saturation, o.hue};
  for (size_t k = 0; k < 4; ++k) {
    plan.jitter_on[k] = v[k] > 0;
    if (!plan.jitter_on[k]) continue;
    const double x = v[k];
    const float lo = static_cast<float>(k == 3 ? -x : std::max(1.0 - x, 0.0));
    const float hi = static_cast<float>(k == 3 ? x : 1.0 + x);
    plan.jitter_factor[k] = draws.uniform(lo, hi);
  }
}

// One op of a policy with its magnitude bin: the magnitude, negated on a uniform <= 0.5 draw
// when signed (_AutoAugmentBase's forward methods).
AugmentStep policy_step(AutoAugmentPolicy policy, Op op, int bin, int num_bins, int height, int width,
                        DrawSource& draws) {
  AugmentStep s{op, 0.0};
  if (!augment_has_magnitude(op)) return s;
  s.magnitude = augment_magnitude(policy, op, bin, num_bins, height, width);
  if (augment_signed(op) && uniform01(draws) <= 0.5f) s.magnitude = -s.magnitude;
  return s;
}

void plan_policy(const AugmentOptions& o, int height, int width, DrawSource& draws, AugmentPlan& plan) {
  plan.steps.clear();
  const int n_ops = static_cast<int>(kWideSpace.size());
  switch (o.auto_augment) {
    case AutoAugmentPolicy::kNone:
      return;
    case AutoAugmentPolicy::kTrivialAugmentWide: {
      const Op op = kWideSpace[static_cast<size_t>(draws.randint(0, n_ops))];
      const int bin = augment_has_magnitude(op) ? static_cast<int>(draws.randint(0, o.num_magnitude_bins)) : 0;
      plan.steps.push_back(policy_step(o.auto_augment, op, bin, o.num_magnitude_bins, height, width, draws));
      return;
    }
    case AutoAugmentPolicy::kRandAugment:
      for (int k = 0; k < o.ra_num_ops; ++k) {
        const Op op = kWideSpace[static_cast<size_t>(draws.randint(0, n_ops))];
        plan.steps.push_back(
            policy_step(o.auto_augment, op, o.ra_magnitude, o.num_magnitude_bins, height, width, draws));
      }
      return;
    case AutoAugmentPolicy::kImageNet: {
      const auto& sub = kImageNetPolicy[static_cast<size_t>(draws.randint(0, kImageNetPolicy.size()))];
      for (const PolicyOp& p : sub) {
        if (!(uniform01(draws) <= p.probability)) continue;
        plan.steps.push_back(policy_step(o.auto_augment, p.op, p.bin, 10, height, width, draws));
      }
      return;
    }
  }
}

// RandomErasing.make_params with the value mapped to uint8 (RandomErasingOptions).
void plan_erasing(const AugmentOptions& options, int height, int width, DrawSource& draws,
                  AugmentPlan& plan) {
  const RandomErasingOptions& o = options.random_erasing;
  plan.erase = false;
  if (!(o.p > 0)) return;
  if (uniform01(draws) >= o.p) return;  // _RandomApplyTransform: torch.rand(1) >= p skips
  const double area = static_cast<double>(height) * width;
  const float log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * static_cast<double>(draws.uniform(o.scale_min, o.scale_max));
    const double aspect = static_cast<double>(std::exp(draws.uniform(log_lo, log_hi)));
    const int h = py_round(std::sqrt(erase_area * aspect));
    const int w = py_round(std::sqrt(erase_area / aspect));
    if (!(h < height && w < width)) continue;
    plan.erase_pixels.clear();
    if (o.random_value) {
      // torch.empty([3, h, w]).normal_(): channel-major normals, mapped to HWC uint8.
      const size_t n = static_cast<size_t>(h) * static_cast<size_t>(w);
      thread_local std::vector<float> normals;
      normals.resize(3 * n);
      draws.normal(normals.data(), normals.size());
      plan.erase_pixels.resize(3 * n);
      for (size_t c = 0; c < 3; ++c)
        for (size_t p = 0; p < n; ++p)
          plan.erase_pixels[p * 3 + c] = erase_value(normals[c * n + p], options.mean[c], options.std[c]);
    }
    plan.erase_top = static_cast<int>(draws.randint(0, height - h + 1));
    plan.erase_left = static_cast<int>(draws.randint(0, width - w + 1));
    plan.erase_height = h;
    plan.erase_width = w;
    plan.erase = true;
    return;
  }
  // torchvision's fallback box (the whole image) comes with v = None: nothing is erased.
}

}  // namespace

std::string_view to_string(AugmentOp op) {
  switch (op) {
    case Op::kIdentity: return "Identity";
    case Op::kShearX: return "ShearX";
    case Op::kShearY: return "ShearY";
    case Op::kTranslateX: return "TranslateX";
    case Op::kTranslateY: return "TranslateY";
    case Op::kRotate: return "Rotate";
    case Op::kBrightness: return "Brightness";
    case Op::kColor: return "Color";
    case Op::kContrast: return "Contrast";
    case Op::kSharpness: return "Sharpness";
    case Op::kPosterize: return "Posterize";
    case Op::kSolarize: return "Solarize";
    case Op::kAutoContrast: return "AutoContrast";
    case Op::kEqualize: return "Equalize";
    case Op::kInvert: return "Invert";
  }
  return "?";
}

std::string_view to_string(AutoAugmentPolicy policy) {
  switch (policy) {
    case AutoAugmentPolicy::kNone: return "none";
    case AutoAugmentPolicy::kTrivialAugmentWide: return "ta_wide";
    case AutoAugmentPolicy::kRandAugment: return "ra";
    case AutoAugmentPolicy::kImageNet: return "imagenet";
  }
  return "?";
}

AutoAugmentPolicy parse_auto_augment(std::string_view name) {
  for (auto p : {AutoAugmentPolicy::kNone, AutoAugmentPolicy::kTrivialAugmentWide,
                 AutoAugmentPolicy::kRandAugment, AutoAugmentPolicy::kImageNet}) {
    if (name == to_string(p)) return p;
  }
  throw std::invalid_argument(fmt::format(
      "auto_augment: unknown policy '{}' (expected none, ta_wide, ra or imagenet; the references' "
      "augmix, cifar10 and svhn are not provided)",
      name));
}

std::string_view to_string(InterpolationMode mode) {
  return mode == InterpolationMode::kBilinear ? "bilinear" : "nearest";
}

InterpolationMode parse_interpolation(std::string_view name) {
  for (auto m : {InterpolationMode::kNearest, InterpolationMode::kBilinear}) {
    if (name == to_string(m)) return m;
  }
  throw std::invalid_argument(fmt::format("interpolation: unknown mode '{}' (expected nearest or bilinear)", name));
}

std::string to_string(const AugmentOptions& o) {
  std::string s;
  const auto add = [&s](const std::string& part) { s += (s.empty() ? "" : " ") + part; };
  if (o.auto_augment != AutoAugmentPolicy::kNone) add(fmt::format("auto_augment={}", to_string(o.auto_augment)));
  if (o.auto_augment == AutoAugmentPolicy::kRandAugment) {
    add(fmt::format("ra_num_ops={} ra_magnitude={}", o.ra_num_ops, o.ra_magnitude));
  }
  if (o.auto_augment == AutoAugmentPolicy::kRandAugment || o.auto_augment == AutoAugmentPolicy::kTrivialAugmentWide) {
    if (o.num_magnitude_bins != 31) add(fmt::format("num_magnitude_bins={}", o.num_magnitude_bins));
  }
  if (o.auto_augment != AutoAugmentPolicy::kNone && o.interpolation != InterpolationMode::kNearest) {
    add(fmt::format("interpolation={}", to_string(o.interpolation)));
  }
  const ColorJitterOptions& j = o.color_jitter;
  if (j.enabled() && o.color_jitter_p > 0) {
    add(fmt::format("color_jitter={},{},{},{}", j.brightness, j.contrast, j.saturation, j.hue));
    if (o.color_jitter_p < 1) add(fmt::format("color_jitter_p={}", o.color_jitter_p));
  }
  if (o.grayscale_p > 0) add(fmt::format("grayscale_p={}", o.grayscale_p));
  const GaussianBlurOptions& b = o.gaussian_blur;
  if (b.p > 0) {
    add(fmt::format("gaussian_blur_p={} (kernel {}, sigma {}..{})", b.p, b.kernel_size, b.sigma_min, b.sigma_max));
  }
  if (o.solarize_p > 0) add(fmt::format("solarize_p={} (threshold {})", o.solarize_p, o.solarize_threshold));
  const RandomErasingOptions& e = o.random_erasing;
  if (e.p > 0) {
    add(e.random_value ? fmt::format("random_erase={} (value random)", e.p)
                       : fmt::format("random_erase={} (value {})", e.p, e.value));
  }
  return s.empty() ? "none" : s;
}

void AugmentOptions::validate() const {
  const auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (ra_num_ops < 0) fail(fmt::format("`ra_num_ops` must be >= 0, got {}", ra_num_ops));
  if (num_magnitude_bins < 2) fail(fmt::format("num_magnitude_bins must be >= 2, got {}", num_magnitude_bins));
  if (ra_magnitude < 0 || ra_magnitude >= num_magnitude_bins) {
    fail(fmt::format("`ra_magnitude` must be in [0, num_magnitude_bins - 1 = {}], got {}",
                     num_magnitude_bins - 1, ra_magnitude));
  }
  const ColorJitterOptions& j = color_jitter;
  for (auto [name, v] : {std::pair{"brightness", j.brightness}, {"contrast", j.contrast},
                         {"saturation", j.saturation}}) {
    if (!(v >= 0) || !std::isfinite(v)) fail(fmt::format("`color_jitter` {} must be a finite number >= 0, got {}", name, v));
  }
  if (!(j.hue >= 0 && j.hue <= 0.5f)) fail(fmt::format("`color_jitter` hue must be in [0, 0.5], got {}", j.hue));
  for (auto [name, p] : {std::pair{"color_jitter_p", color_jitter_p}, {"grayscale_p", grayscale_p},
                         {"gaussian_blur_p", gaussian_blur.p}, {"solarize_p", solarize_p}}) {
    if (!(p >= 0 && p <= 1)) fail(fmt::format("`{}` probability must be in [0, 1], got {}", name, p));
  }
  const GaussianBlurOptions& b = gaussian_blur;
  if (b.kernel_size < 1 || b.kernel_size % 2 == 0) {
    fail(fmt::format("`gaussian_blur_kernel` must be an odd number >= 1, got {}", b.kernel_size));
  }
  if (!(b.sigma_min > 0 && b.sigma_min <= b.sigma_max && std::isfinite(b.sigma_max))) {
    fail(fmt::format("`gaussian_blur_sigma` must satisfy 0 < min <= max, got ({}, {})", b.sigma_min, b.sigma_max));
  }
  if (!(solarize_threshold >= 0 && solarize_threshold <= 255)) {
    fail(fmt::format("`solarize_threshold` must be in [0, 255], got {}", solarize_threshold));
  }
  const RandomErasingOptions& e = random_erasing;
  if (!(e.p >= 0 && e.p <= 1)) fail(fmt::format("`random_erase` probability must be in [0, 1], got {}", e.p));
  if (!(e.scale_min >= 0 && e.scale_min <= e.scale_max && e.scale_max <= 1)) {
    fail(fmt::format("random_erase scale must satisfy 0 <= min <= max <= 1, got ({}, {})", e.scale_min,
                     e.scale_max));
  }
  if (!(e.ratio_min > 0 && e.ratio_min <= e.ratio_max && std::isfinite(e.ratio_max))) {
    fail(fmt::format("random_erase ratio must satisfy 0 < min <= max, got ({}, {})", e.ratio_min, e.ratio_max));
  }
  if (!std::isfinite(e.value)) fail(fmt::format("`random_erase_value` must be finite, got {}", e.value));
  for (size_t c = 0; c < 3; ++c) {
    if (!(this->std[c] > 0) || !std::isfinite(mean[c])) {
      fail(fmt::format("`std` must be > 0 and mean finite, got mean {} std {} (channel {})",
                       mean[c], this->std[c], c));
    }
  }
}

bool augment_signed(AugmentOp op) {
  switch (op) {
    case Op::kShearX: case Op::kShearY: case Op::kTranslateX: case Op::kTranslateY: case Op::kRotate:
    case Op::kBrightness: case Op::kColor: case Op::kContrast: case Op::kSharpness:
      return true;
    default:
      return false;
  }
}

bool augment_has_magnitude(AugmentOp op) {
  return augment_signed(op) || op == Op::kPosterize || op == Op::kSolarize;
}

float augment_magnitude(AutoAugmentPolicy policy, AugmentOp op, int bin, int num_bins, int height,
                        int width) {
  if (policy == AutoAugmentPolicy::kNone) throw std::invalid_argument("augment_magnitude: no policy");
  if (bin < 0 || bin >= num_bins) {
    throw std::invalid_argument(fmt::format("augment_magnitude: bin {} outside [0, {})", bin, num_bins));
  }
  const bool wide = policy == AutoAugmentPolicy::kTrivialAugmentWide;
  const auto lin = [&](double end) { return linspace_at(0.0f, static_cast<float>(end), num_bins, bin); };
  switch (op) {
    case Op::kShearX: case Op::kShearY:
      return lin(wide ? 0.99 : 0.3);
    case Op::kTranslateX:
      return lin(wide ? 32.0 : 150.0 / 331.0 * width);
    case Op::kTranslateY:
      return lin(wide ? 32.0 : 150.0 / 331.0 * height);
    case Op::kRotate:
      return lin(wide ? 135.0 : 30.0);
    case Op::kBrightness: case Op::kColor: case Op::kContrast: case Op::kSharpness:
      return lin(wide ? 0.99 : 0.9);
    case Op::kPosterize: {
      // (8 - (torch.arange(num_bins) / ((num_bins - 1) / d))).round().int(), float32
      const float div = static_cast<float>((num_bins - 1) / (wide ? 6.0 : 4.0));
      return std::nearbyint(8.0f - static_cast<float>(bin) / div);
    }
    case Op::kSolarize:
      return linspace_at(1.0f, 0.0f, num_bins, bin);
    default:
      return 0.0f;
  }
}

void DrawSource::randperm(int n, int* out) {
  for (int k = 0; k < n; ++k) out[k] = k;
  for (int i = 0; i + 1 < n; ++i) std::swap(out[i], out[randint(i, n)]);
}

void DrawSource::normal(float* out, size_t n) {
  constexpr float kTwoPi = 2.0f * std::numbers::pi_v<float>;
  for (size_t k = 0; k < n; k += 2) {
    const float u1 = uniform(0.0f, 1.0f), u2 = uniform(0.0f, 1.0f);
    const float r = std::sqrt(-2.0f * std::log(1.0f - u1));
    out[k] = r * std::cos(kTwoPi * u2);
    if (k + 1 < n) out[k + 1] = r * std::sin(kTwoPi * u2);
  }
}

// ---------------------------------------------------------------------------------------------
// The functional ops.

bool color_kernel_supported(ColorKernel kernel) {
  switch (kernel) {
    case ColorKernel::kAvx2: {
#if defined(__x86_64__)
      static const bool cpu = gpufeed::cpu::x86_features().avx2;
      return cpu;
#else
      return false;
#endif
    }
    case ColorKernel::kHighway: return hwy_colour::available();
    case ColorKernel::kAuto: case ColorKernel::kScalar: break;
  }
  return true;
}

bool fma_kernel_supported(ColorKernel kernel) {
  if (kernel == ColorKernel::kHighway) return hwy_augment::available();
#if defined(__x86_64__)
  if (kernel == ColorKernel::kAvx2) return color_kernel_supported(kernel) && gpufeed::cpu::x86_features().fma;
#endif
  return color_kernel_supported(kernel);
}

ColorKernel auto_color_kernel() {
  static const ColorKernel chosen = [] {
    const char* env = std::getenv("GPUFEED_RESIZE_KERNEL");
    const std::string_view name = env == nullptr ? "" : env;
    if (name == "scalar") return ColorKernel::kScalar;
    const bool hwy = hwy_colour::available();
    if (name == "hwy") return hwy ? ColorKernel::kHighway : ColorKernel::kScalar;
#if defined(__x86_64__)
    if (color_kernel_supported(ColorKernel::kAvx2)) return ColorKernel::kAvx2;
    return ColorKernel::kScalar;  // x86 without AVX2: as before Highway
#else
    return hwy ? ColorKernel::kHighway : ColorKernel::kScalar;
#endif
  }();
  return chosen;
}

void adjust_brightness(uint8_t* image, int height, int width, double factor) {
  check_factor("adjust_brightness", factor);
  const float f = static_cast<float>(factor);
  std::array<uint8_t, 256> lut{};
  for (int v = 0; v < 256; ++v) lut[static_cast<size_t>(v)] = to_u8_trunc(static_cast<float>(v) * f);
  apply_lut(image, height, width, lut);
}

void adjust_saturation(uint8_t* image, int height, int width, double factor, ColorKernel kernel) {
  check_factor("adjust_saturation", factor);
  // _blend(image, gray, ratio): image.mul(ratio).add_(gray, alpha=1 - ratio), fused.
  const float ratio = static_cast<float>(factor);
  const float alpha = static_cast<float>(1.0 - factor);
  // fma_int(gray, alpha, x * ratio) with both terms tabled as doubles (gray is whole, 0..255).
  std::array<double, 256> scaled{}, gray_term{};
  for (int v = 0; v < 256; ++v) {
    scaled[static_cast<size_t>(v)] = static_cast<float>(v) * ratio;
    gray_term[static_cast<size_t>(v)] = static_cast<double>(v) * static_cast<double>(alpha);
  }
  const GrayTables& gt = gray_tables();
  size_t n = pixel_count(height, width);
  const ColorKernel path = colour_kernel(kernel);
  size_t done = 0;
#if defined(__x86_64__)
  if (path == ColorKernel::kAvx2) done = adjust_saturation_avx2(image, n, ratio, alpha);
#endif
  if (path == ColorKernel::kHighway) done = hwy_colour::adjust_saturation(image, n, ratio, alpha);
  image += done * 3;
  n -= done;
  for (size_t p = 0; p < n; ++p, image += 3) {
    const double g = gray_term[static_cast<uint32_t>(static_cast<int32_t>(gt.gray_floor(image[0], image[1], image[2])))];
    image[0] = to_u8_trunc(static_cast<float>(g + scaled[image[0]]));
    image[1] = to_u8_trunc(static_cast<float>(g + scaled[image[1]]));
    image[2] = to_u8_trunc(static_cast<float>(g + scaled[image[2]]));
  }
}

void adjust_contrast(uint8_t* image, int height, int width, double factor, ColorKernel kernel) {
  check_factor("adjust_contrast", factor);
  const size_t n = pixel_count(height, width);
  int64_t sum = 0;  // of whole numbers <= 255: torch's float32 sum is exact below 2^24
  const GrayTables& gt = gray_tables();
  size_t done = 0;
  const ColorKernel path = colour_kernel(kernel);
#if defined(__x86_64__)
  if (path == ColorKernel::kAvx2) sum = gray_sum_avx2(image, n, done);
#endif
  if (path == ColorKernel::kHighway) sum = hwy_colour::gray_sum(image, n, done);
  for (const uint8_t* px = image + 3 * done; px != image + 3 * n; px += 3) {
    sum += static_cast<int64_t>(gt.gray_floor(px[0], px[1], px[2]));
  }
  const float mean = static_cast<float>(sum) / static_cast<float>(n);
  const float ratio = static_cast<float>(factor);
  const float alpha = static_cast<float>(1.0 - factor);
  std::array<uint8_t, 256> lut{};
  for (int v = 0; v < 256; ++v) {
    lut[static_cast<size_t>(v)] = to_u8_trunc(std::fma(mean, alpha, static_cast<float>(v) * ratio));
  }
  apply_lut(image, height, width, lut);
}

void adjust_sharpness(uint8_t* image, int height, int width, double factor, AugmentScratch& scratch) {
  check_factor("adjust_sharpness", factor);
  if (height <= 2 || width <= 2) return;
  const uint8_t* src = copy_into(scratch, image, height, width);
  const float alpha = static_cast<float>(1.0 - factor);
  // out = x + (1 - factor) * (round(blur) - x), fused; round(S / 13) is never a tie (13 is odd),
  // so the integer (2 S + 13) / 26 is torch's float conv2d + round_ exactly.
  // fma_int(blur - x, alpha, x) with the product tabled per difference
  std::array<double, 511> diff_term{};
  for (int d = -255; d <= 255; ++d) {
    diff_term[static_cast<size_t>(d + 255)] = static_cast<double>(d) * static_cast<double>(alpha);
  }
  const size_t row = static_cast<size_t>(width) * 3;
  thread_local std::vector<uint16_t> column_sums;
  column_sums.resize(row);
  uint16_t* const column_sum = column_sums.data();  // a local pointer: the uint8 stores below may
                                                    // alias anything, a thread_local would reload
  for (int y = 1; y + 1 < height; ++y) {
    const uint8_t* up = src + static_cast<size_t>(y - 1) * row;
    const uint8_t* mid = up + row;
    const uint8_t* down = mid + row;
    uint8_t* out = image + static_cast<size_t>(y) * row;
    // 3-row column sums first (vectorisable), then the 3x3 sum with the centre weighted 5
    for (size_t k = 0; k < row; ++k) column_sum[k] = static_cast<uint16_t>(up[k] + mid[k] + down[k]);
    for (size_t k = 3; k + 3 < row; ++k) {
      const int s = column_sum[k - 3] + column_sum[k] + column_sum[k + 3] + 4 * mid[k];
      const int blur = (2 * s + 13) / 26;
      const int x = mid[k];
      out[k] = to_u8_trunc(static_cast<float>(diff_term[static_cast<size_t>(blur - x + 255)] + x));
    }
  }
}

namespace {

// adjust_hue's constants, float32 as torchvision computes in float32.
struct HueConstants {
  float inv255 = static_cast<float>(1.0 / 255);
  float sixth = static_cast<float>(1.0 / 6.0);
  float to_u8 = static_cast<float>(255 + 1.0 - 1e-3);
};

#if defined(__x86_64__)
// adjust_hue on 8 pixels at a time: the scalar loop's float32 operations in the same order, on
// 8 lanes (no FMA: every product and sum rounds as the scalar code's do), so the bytes are the
// scalar path's. Returns the pixels done (a multiple of 8); the caller does the rest.
__attribute__((target("avx2"), always_inline)) inline __m256 floor8(__m256 v) {
  return _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
__attribute__((target("avx2"), always_inline)) inline __m256 clamp01(__m256 v) {
  return _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(1.0f));
}

__attribute__((target("avx2"))) size_t adjust_hue_avx2(uint8_t* image, size_t n, float hue) {
  const HueConstants k;
  const __m256 inv255 = _mm256_set1_ps(k.inv255), sixth = _mm256_set1_ps(k.sixth), to_u8 = _mm256_set1_ps(k.to_u8);
  const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
  const __m256 four = _mm256_set1_ps(4.0f), six = _mm256_set1_ps(6.0f), vhue = _mm256_set1_ps(hue);
  alignas(32) float r8[8], g8[8], b8[8];
  alignas(32) int32_t out[3][8];
  size_t p = 0;
  for (; p + 8 <= n; p += 8) {
    uint8_t* px = image + p * 3;
    for (int j = 0; j < 8; ++j) {
      r8[j] = px[3 * j];
      g8[j] = px[3 * j + 1];
      b8[j] = px[3 * j + 2];
    }
    const __m256 r = _mm256_mul_ps(_mm256_load_ps(r8), inv255);
    const __m256 g = _mm256_mul_ps(_mm256_load_ps(g8), inv255);
    const __m256 b = _mm256_mul_ps(_mm256_load_ps(b8), inv255);
    const __m256 maxc = _mm256_max_ps(_mm256_max_ps(r, g), b);
    const __m256 minc = _mm256_min_ps(_mm256_min_ps(r, g), b);
    const __m256 eqc = _mm256_cmp_ps(maxc, minc, _CMP_EQ_OQ);
    const __m256 cr = _mm256_sub_ps(maxc, minc);
    const __m256 s = _mm256_div_ps(cr, _mm256_blendv_ps(maxc, one, eqc));
    const __m256 crd = _mm256_blendv_ps(cr, one, eqc);
    const __m256 rc = _mm256_div_ps(_mm256_sub_ps(maxc, r), crd);
    const __m256 gc = _mm256_div_ps(_mm256_sub_ps(maxc, g), crd);
    const __m256 bc = _mm256_div_ps(_mm256_sub_ps(maxc, b), crd);
    const __m256 max_ne_r = _mm256_cmp_ps(maxc, r, _CMP_NEQ_UQ);
    const __m256 max_eq_g = _mm256_cmp_ps(maxc, g, _CMP_EQ_OQ);
    // The scalar code multiplies by 1.0f or 0.0f; so do these lanes.
    const __m256 hg = _mm256_mul_ps(_mm256_sub_ps(_mm256_add_ps(rc, two), bc),
                                    _mm256_and_ps(_mm256_and_ps(max_eq_g, max_ne_r), one));
    const __m256 hr = _mm256_mul_ps(_mm256_sub_ps(bc, gc), _mm256_andnot_ps(max_ne_r, one));
    const __m256 hb = _mm256_mul_ps(_mm256_sub_ps(_mm256_add_ps(gc, four), rc),
                                    _mm256_and_ps(_mm256_andnot_ps(max_eq_g, max_ne_r), one));
    __m256 h = _mm256_add_ps(_mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(hr, hg), hb), sixth), one);
    h = _mm256_sub_ps(h, floor8(h));
    h = _mm256_add_ps(h, vhue);
    h = _mm256_sub_ps(h, floor8(h));
    const __m256 h6 = _mm256_mul_ps(h, six);
    const __m256 i = floor8(h6);
    const __m256 f = _mm256_sub_ps(h6, i);
    // sector = int(i) mod 6, i in [0, 6]: 6 -> 0
    __m256i sector = _mm256_cvttps_epi32(i);
    sector = _mm256_sub_epi32(sector, _mm256_and_si256(_mm256_cmpgt_epi32(sector, _mm256_set1_epi32(5)),
                                                       _mm256_set1_epi32(6)));
    const __m256 sxf = _mm256_mul_ps(s, f);
    const __m256 one_minus_s = _mm256_sub_ps(one, s);
    const __m256 v = maxc;
    const __m256 q = clamp01(_mm256_mul_ps(_mm256_sub_ps(one, sxf), v));
    const __m256 t = clamp01(_mm256_mul_ps(_mm256_add_ps(sxf, one_minus_s), v));
    const __m256 pp = clamp01(_mm256_mul_ps(one_minus_s, v));
    const __m256 vpqt[4] = {v, pp, q, t};
    static constexpr int kSelect[3][6] = {{0, 2, 1, 1, 3, 0}, {3, 0, 0, 2, 1, 1}, {1, 1, 3, 0, 0, 2}};
    for (int c = 0; c < 3; ++c) {
      __m256 chosen = vpqt[kSelect[c][0]];
      for (int sec = 1; sec < 6; ++sec) {
        const __m256 here = _mm256_castsi256_ps(_mm256_cmpeq_epi32(sector, _mm256_set1_epi32(sec)));
        chosen = _mm256_blendv_ps(chosen, vpqt[kSelect[c][sec]], here);
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(out[c]), _mm256_cvttps_epi32(_mm256_mul_ps(chosen, to_u8)));
    }
    for (int j = 0; j < 8; ++j) {
      px[3 * j] = static_cast<uint8_t>(out[0][j]);
      px[3 * j + 1] = static_cast<uint8_t>(out[1][j]);
      px[3 * j + 2] = static_cast<uint8_t>(out[2][j]);
    }
  }
  return p;
}
#else
size_t adjust_hue_avx2(uint8_t*, size_t, float) { return 0; }
#endif

}  // namespace


void adjust_hue(uint8_t* image, int height, int width, double factor, ColorKernel kernel) {
  if (!(factor >= -0.5 && factor <= 0.5)) {
    throw std::invalid_argument(fmt::format("adjust_hue: factor {} is not in [-0.5, 0.5]", factor));
  }
  const float hue = static_cast<float>(factor);
  const HueConstants k;
  const float inv255 = k.inv255, sixth = k.sixth, to_u8 = k.to_u8;
  size_t n = pixel_count(height, width);
  const ColorKernel path = colour_kernel(kernel);
  size_t done = 0;
  if (path == ColorKernel::kAvx2) done = adjust_hue_avx2(image, n, hue);
  if (path == ColorKernel::kHighway) done = hwy_colour::adjust_hue(image, n, hue);
  image += done * 3;
  n -= done;
  for (size_t p = 0; p < n; ++p, image += 3) {
    const float r = static_cast<float>(image[0]) * inv255;
    const float g = static_cast<float>(image[1]) * inv255;
    const float b = static_cast<float>(image[2]) * inv255;
    // _rgb_to_hsv
    const float maxc = std::max(std::max(r, g), b);
    const float minc = std::min(std::min(r, g), b);
    const bool eqc = maxc == minc;
    const float cr = maxc - minc;
    const float s = cr / (eqc ? 1.0f : maxc);
    const float crd = eqc ? 1.0f : cr;
    const float rc = (maxc - r) / crd, gc = (maxc - g) / crd, bc = (maxc - b) / crd;
    const bool max_ne_r = maxc != r, max_eq_g = maxc == g;
    const float hg = ((rc + 2.0f) - bc) * static_cast<float>(max_eq_g && max_ne_r);
    const float hr = (bc - gc) * static_cast<float>(!max_ne_r);
    const float hb = ((gc + 4.0f) - rc) * static_cast<float>(max_ne_r && !max_eq_g);
    // fmod(x, 1) of x in (0, 2] is x - floor(x), exactly
    float h = (hr + hg + hb) * sixth + 1.0f;
    h = h - floor_small(h);
    // h.add_(hue_factor).remainder_(1.0)
    h = h + hue;
    h = h - floor_small(h);
    // _hsv_to_rgb
    const float h6 = h * 6.0f;
    const float i = floor_small(h6);
    const float f = h6 - i;
    int sector = static_cast<int>(i) % 6;
    if (sector < 0) sector += 6;
    const float sxf = s * f;
    const float one_minus_s = 1.0f - s;
    const float v = maxc;
    const float q = std::clamp((1.0f - sxf) * v, 0.0f, 1.0f);
    const float t = std::clamp((sxf + one_minus_s) * v, 0.0f, 1.0f);
    const float pp = std::clamp(one_minus_s * v, 0.0f, 1.0f);
    const float vpqt[4] = {v, pp, q, t};
    static constexpr int kSelect[3][6] = {{0, 2, 1, 1, 3, 0}, {3, 0, 0, 2, 1, 1}, {1, 1, 3, 0, 0, 2}};
    for (int c = 0; c < 3; ++c) {
      image[c] = static_cast<uint8_t>(vpqt[kSelect[c][sector]] * to_u8);
    }
  }
}

void posterize(uint8_t* image, int height, int width, int bits) {
  if (bits < 0 || bits > 8) throw std::invalid_argument(fmt::format("posterize: bits {} not in [0, 8]", bits));
  if (bits == 8) return;
  const auto mask = static_cast<uint8_t>(((1 << bits) - 1) << (8 - bits));
  const size_t n = pixel_count(height, width) * 3;
  for (size_t k = 0; k < n; ++k) image[k] &= mask;
}

void solarize(uint8_t* image, int height, int width, double threshold) {
  if (threshold > 255) {
    throw std::invalid_argument(fmt::format("solarize: threshold {} exceeds 255", threshold));
  }
  const float t = static_cast<float>(threshold);
  std::array<uint8_t, 256> lut{};
  for (int v = 0; v < 256; ++v) {
    lut[static_cast<size_t>(v)] = static_cast<float>(v) >= t ? static_cast<uint8_t>(255 - v) : static_cast<uint8_t>(v);
  }
  apply_lut(image, height, width, lut);
}

void rgb_to_grayscale(uint8_t* image, int height, int width) {
  const GrayTables& t = gray_tables();
  const size_t n = pixel_count(height, width);
  for (size_t p = 0; p < n; ++p, image += 3) {
    // .to(torch.uint8) truncates; the gray value is >= 0, so its floor is the same.
    const auto g = static_cast<uint8_t>(t.gray_floor(image[0], image[1], image[2]));
    image[0] = image[1] = image[2] = g;
  }
}

std::vector<float> gaussian_kernel1d(int k, double sigma) {
  // _get_gaussian_kernel1d: linspace(-lim, lim, k) in float32, .div(sigma) (the scalar as
  // float32), .pow(2).neg(), softmax: exp(x - max) / sum, here correctly rounded (augment.h).
  const double lim = (k - 1) / (2.0 * std::sqrt(2.0));
  const float s = static_cast<float>(sigma);
  std::vector<float> q(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    const float x = k == 1 ? static_cast<float>(-lim) : linspace_at(static_cast<float>(-lim), static_cast<float>(lim), k, i);
    const float d = x / s;
    q[static_cast<size_t>(i)] = -(d * d);
  }
  const float top = *std::max_element(q.begin(), q.end());
  std::vector<double> e(q.size());
  double sum = 0;
  for (size_t i = 0; i < q.size(); ++i) sum += e[i] = std::exp(static_cast<double>(q[i] - top));
  std::vector<float> out(q.size());
  for (size_t i = 0; i < q.size(); ++i) out[i] = static_cast<float>(e[i] / sum);
  return out;
}

namespace {

// One output row of the depthwise convolution: row[n] = sum over taps (i, j), row-major, of
// kernel[i * k + j] * padded[(y + i) * padded_row + j * 3 + n], each a float32 fused multiply-add
// from 0 (torch's CPU conv2d order), for n < n_values. The AVX2+FMA version does 8 values at once
// with the same per-value order, so both give the same bits.
void blur_row_scalar(const float* padded, size_t padded_row, const float* kernel, int k, size_t n_values,
                     float* row) {
  std::fill(row, row + n_values, 0.0f);
  for (int i = 0; i < k; ++i) {
    const float* in = padded + static_cast<size_t>(i) * padded_row;
    for (int j = 0; j < k; ++j, in += 3) {
      const float w = kernel[i * k + j];
      for (size_t n = 0; n < n_values; ++n) row[n] = std::fma(w, in[n], row[n]);
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
// 32 values of the row at once, their sums kept in registers through all k x k taps (the same
// fused multiply-adds in the same tap order as the loop below, so the same values, without a
// load and store of the sums per tap).
__attribute__((target("avx2,fma"))) void blur_block32_fma(const float* padded, size_t padded_row, const float* kernel,
                                                          int k, float* row) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (int i = 0; i < k; ++i) {
    const float* in = padded + static_cast<size_t>(i) * padded_row;
    for (int j = 0; j < k; ++j, in += 3) {
      const __m256 wv = _mm256_set1_ps(kernel[i * k + j]);
      a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(in), a0);
      a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(in + 8), a1);
      a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(in + 16), a2);
      a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(in + 24), a3);
    }
  }
  _mm256_storeu_ps(row, a0);
  _mm256_storeu_ps(row + 8, a1);
  _mm256_storeu_ps(row + 16, a2);
  _mm256_storeu_ps(row + 24, a3);
}

__attribute__((target("avx2,fma"))) void blur_row_fma(const float* padded, size_t padded_row, const float* kernel,
                                                      int k, size_t n_values, float* row) {
  const size_t blocks = n_values / 32 * 32;
  for (size_t n = 0; n < blocks; n += 32) blur_block32_fma(padded + n, padded_row, kernel, k, row + n);
  // The rest (under 32 values): the sums in memory, as before.
  padded += blocks;
  row += blocks;
  n_values -= blocks;
  std::fill(row, row + n_values, 0.0f);
  const size_t vec_end = n_values / 8 * 8;
  for (int i = 0; i < k; ++i) {
    const float* in = padded + static_cast<size_t>(i) * padded_row;
    for (int j = 0; j < k; ++j, in += 3) {
      const float w = kernel[i * k + j];
      const __m256 wv = _mm256_set1_ps(w);
      size_t n = 0;
      for (; n < vec_end; n += 8) {
        _mm256_storeu_ps(row + n, _mm256_fmadd_ps(wv, _mm256_loadu_ps(in + n), _mm256_loadu_ps(row + n)));
      }
      for (; n < n_values; ++n) row[n] = __builtin_fmaf(w, in[n], row[n]);
    }
  }
}

#endif

// One output row for `kernel` as fma_kernel resolves it: AVX2+FMA, Highway (then the scalar loop
// for the last values) or scalar.
void blur_row(const float* padded, size_t padded_row, const float* kernel, int k, size_t n_values, float* row,
              ColorKernel path) {
  if (path == ColorKernel::kHighway) {
    const size_t done = hwy_augment::blur_row(padded, padded_row, kernel, k, n_values, row);
    return blur_row_scalar(padded + done, padded_row, kernel, k, n_values - done, row + done);
  }
#if defined(__x86_64__) || defined(__i386__)
  if (path == ColorKernel::kAvx2) return blur_row_fma(padded, padded_row, kernel, k, n_values, row);
#endif
  blur_row_scalar(padded, padded_row, kernel, k, n_values, row);
}

// torch's reflect padding: -1 -> 1, n -> n - 2.
inline int reflect(int i, int n) { return i < 0 ? -i : (i >= n ? 2 * n - 2 - i : i); }

}  // namespace

void gaussian_blur(uint8_t* image, int height, int width, int k, double sigma, AugmentScratch& scratch,
                   ColorKernel kernel_path) {
  if (k < 1 || k % 2 == 0) {
    throw std::invalid_argument(fmt::format("gaussian_blur: kernel_size should be an odd positive integer, got {}", k));
  }
  if (!(sigma > 0)) throw std::invalid_argument(fmt::format("gaussian_blur: sigma should be positive, got {}", sigma));
  const int pad = k / 2;
  if (pad >= height || pad >= width) {
    throw std::invalid_argument(fmt::format(
        "gaussian_blur: kernel_size {} needs an image larger than {} pixels on each side (reflect padding), got {}x{}",
        k, pad, width, height));
  }
  const ColorKernel path = fma_kernel(kernel_path);
  const std::vector<float> k1 = gaussian_kernel1d(k, sigma);
  // _get_gaussian_kernel2d: kernel1d_y.unsqueeze(-1) * kernel1d_x, float32 products.
  thread_local std::vector<float> kernel;
  kernel.resize(static_cast<size_t>(k) * static_cast<size_t>(k));
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) kernel[static_cast<size_t>(i * k + j)] = k1[static_cast<size_t>(i)] * k1[static_cast<size_t>(j)];
  const int pw = width + 2 * pad, ph = height + 2 * pad;
  const size_t padded_row = static_cast<size_t>(pw) * 3;
  scratch.padded.resize(padded_row * static_cast<size_t>(ph));
  for (int y = 0; y < ph; ++y) {
    const uint8_t* in = image + static_cast<size_t>(reflect(y - pad, height)) * width * 3;
    float* out = scratch.padded.data() + static_cast<size_t>(y) * padded_row;
    for (int x = 0; x < pw; ++x) {
      const uint8_t* px = in + static_cast<size_t>(reflect(x - pad, width)) * 3;
      out[x * 3 + 0] = px[0];
      out[x * 3 + 1] = px[1];
      out[x * 3 + 2] = px[2];
    }
  }
  const size_t n_values = static_cast<size_t>(width) * 3;
  scratch.row.resize(n_values);
  float* row = scratch.row.data();
  for (int y = 0; y < height; ++y) {
    const float* top = scratch.padded.data() + static_cast<size_t>(y) * padded_row;
    blur_row(top, padded_row, kernel.data(), k, n_values, row, path);
    // .round_() (half to even) then .to(torch.uint8); the weights sum to one, so 0..255.
    uint8_t* out = image + static_cast<size_t>(y) * n_values;
    for (size_t n = 0; n < n_values; ++n) out[n] = static_cast<uint8_t>(std::clamp(round_to_int(row[n]), 0, 255));
  }
}

void autocontrast(uint8_t* image, int height, int width) {
  const size_t n = pixel_count(height, width);
  uint8_t lo0 = 255, lo1 = 255, lo2 = 255, hi0 = 0, hi1 = 0, hi2 = 0;
  for (const uint8_t* px = image; px != image + 3 * n; px += 3) {
    lo0 = std::min(lo0, px[0]), hi0 = std::max(hi0, px[0]);
    lo1 = std::min(lo1, px[1]), hi1 = std::max(hi1, px[1]);
    lo2 = std::min(lo2, px[2]), hi2 = std::max(hi2, px[2]);
  }
  const std::array<uint8_t, 3> lo{lo0, lo1, lo2}, hi{hi0, hi1, hi2};
  std::array<std::array<uint8_t, 256>, 3> lut{};
  const float inv_bound = static_cast<float>(1.0 / 255);
  for (size_t c = 0; c < 3; ++c) {
    float minimum = lo[c];
    float inv_scale = (static_cast<float>(hi[c]) - static_cast<float>(lo[c])) * inv_bound;
    if (hi[c] == lo[c]) minimum = 0, inv_scale = 1;
    for (int v = 0; v < 256; ++v) {
      lut[c][static_cast<size_t>(v)] = to_u8_trunc((static_cast<float>(v) - minimum) / inv_scale);
    }
  }
  apply_lut(image, height, width, lut);
}

void equalize(uint8_t* image, int height, int width) {
  const size_t n = pixel_count(height, width);
  std::array<std::array<int64_t, 256>, 3> hist{};
  for (const uint8_t* px = image; px != image + 3 * n; px += 3) {
    ++hist[0][px[0]];
    ++hist[1][px[1]];
    ++hist[2][px[2]];
  }
  std::array<std::array<uint8_t, 256>, 3> lut{};
  for (size_t c = 0; c < 3; ++c) {
    // PIL's scheme as torchvision's equalize_image: step = (pixels not of the last non-empty
    // value) // 255; lut[0] = 0, lut[k] = min((cum[k-1] + step // 2) // step, 255); step 0 keeps
    // the channel.
    size_t last = 255;
    while (last > 0 && hist[c][last] == 0) --last;
    const int64_t step = (static_cast<int64_t>(n) - hist[c][last]) / 255;
    int64_t cum = 0;
    for (size_t v = 0; v < 256; ++v) {
      if (step == 0) {
        lut[c][v] = static_cast<uint8_t>(v);
        continue;
      }
      lut[c][v] = v == 0 ? 0 : static_cast<uint8_t>(std::min<int64_t>((cum + step / 2) / step, 255));
      cum += hist[c][v];
    }
  }
  apply_lut(image, height, width, lut);
}

void invert(uint8_t* image, int height, int width) {
  const size_t n = pixel_count(height, width) * 3;
  for (size_t k = 0; k < n; ++k) image[k] = static_cast<uint8_t>(255 - image[k]);
}

void affine(uint8_t* image, int height, int width, double angle, double translate_x, double translate_y,
            double shear_x, double shear_y, bool center_top_left, InterpolationMode interpolation,
            AugmentScratch& scratch, ColorKernel kernel) {
  if (angle == 0 && shear_x == 0 && shear_y == 0 && translate_x == std::trunc(translate_x) &&
      translate_y == std::trunc(translate_y) && std::abs(translate_x) < 1 << 20 && std::abs(translate_y) < 1 << 20) {
    // A whole-pixel translation: the float32 grid lands within rounding of the shifted pixel
    // centres, far from any tie, so nearest sampling is the shift itself, and bilinear weights
    // are within rounding of 1 and 0, which round to the same pixel (the goldens check both).
    return shift(image, height, width, static_cast<int>(translate_x), static_cast<int>(translate_y), scratch);
  }
  // affine_image: center [0, 0] becomes (0 - w/2, 0 - h/2) relative to the image centre.
  const double cx = center_top_left ? 0.0 - width * 0.5 : 0.0;
  const double cy = center_top_left ? 0.0 - height * 0.5 : 0.0;
  grid_sample(image, height, width, inverse_affine_matrix(cx, cy, angle, translate_x, translate_y, shear_x, shear_y),
              interpolation, kernel, scratch);
}

void rotate(uint8_t* image, int height, int width, double angle, InterpolationMode interpolation,
            AugmentScratch& scratch, ColorKernel kernel) {
  // rotate_image: angle % 360 (Python's modulo), transposes for the right angles, else the affine
  // grid with -angle.
  double a = std::fmod(angle, 360.0);
  if (a != 0 && a < 0) a += 360.0;
  if (a == 0) return;
  if (a == 180) return rot90(image, height, width, 2, scratch);
  if (height == width && a == 90) return rot90(image, height, width, 1, scratch);
  if (height == width && a == 270) return rot90(image, height, width, 3, scratch);
  grid_sample(image, height, width, inverse_affine_matrix(0, 0, -a, 0, 0, 0, 0), interpolation, kernel, scratch);
}

void apply_augment_op(AugmentOp op, double m, uint8_t* image, int height, int width,
                      InterpolationMode interpolation, AugmentScratch& scratch) {
  const InterpolationMode mode = interpolation;
  switch (op) {
    case Op::kIdentity:
      return;
    case Op::kShearX:  // shear = degrees(atan(magnitude)), about the top-left corner
      return affine(image, height, width, 0.0, 0, 0, degrees(libm::atan(m)), 0.0, true, mode, scratch);
    case Op::kShearY:
      return affine(image, height, width, 0.0, 0, 0, 0.0, degrees(libm::atan(m)), true, mode, scratch);
    case Op::kTranslateX:  // translate = [int(magnitude), 0]
      return affine(image, height, width, 0.0, std::trunc(m), 0, 0, 0, false, mode, scratch);
    case Op::kTranslateY:
      return affine(image, height, width, 0.0, 0, std::trunc(m), 0, 0, false, mode, scratch);
    case Op::kRotate:
      return rotate(image, height, width, m, mode, scratch);
    case Op::kBrightness:
      return adjust_brightness(image, height, width, 1.0 + m);
    case Op::kColor:
      return adjust_saturation(image, height, width, 1.0 + m);
    case Op::kContrast:
      return adjust_contrast(image, height, width, 1.0 + m);
    case Op::kSharpness:
      return adjust_sharpness(image, height, width, 1.0 + m, scratch);
    case Op::kPosterize:
      return posterize(image, height, width, static_cast<int>(m));
    case Op::kSolarize:  // threshold = 255 * magnitude
      return solarize(image, height, width, 255.0 * m);
    case Op::kAutoContrast:
      return autocontrast(image, height, width);
    case Op::kEqualize:
      return equalize(image, height, width);
    case Op::kInvert:
      return invert(image, height, width);
  }
}

void plan_augment(const AugmentOptions& options, int height, int width, DrawSource& draws,
                  AugmentPlan& plan) {
  plan.interpolation = options.interpolation;
  plan_color_jitter(options.color_jitter, options.color_jitter_p, draws, plan);
  plan.grayscale = applies(options.grayscale_p, draws);
  const GaussianBlurOptions& blur = options.gaussian_blur;
  plan.blur = applies(blur.p, draws);
  if (plan.blur) {
    plan.blur_kernel_size = blur.kernel_size;
    plan.blur_sigma = draws.uniform(blur.sigma_min, blur.sigma_max);  // GaussianBlur.make_params
  }
  plan.solarize = applies(options.solarize_p, draws);
  plan.solarize_threshold = options.solarize_threshold;
  plan_policy(options, height, width, draws, plan);
  plan_erasing(options, height, width, draws, plan);
  if (plan.erase && !options.random_erasing.random_value) {
    plan.erase_pixels.clear();  // the constant colour is written by apply_augment
    for (size_t c = 0; c < 3; ++c) {
      plan.erase_color[c] = erase_value(options.random_erasing.value, options.mean[c], options.std[c]);
    }
  }
}

void apply_augment(const AugmentPlan& plan, uint8_t* image, int height, int width,
                   AugmentScratch& scratch) {
  if (plan.color_jitter) {
    for (int fn : plan.jitter_order) {
      const auto k = static_cast<size_t>(fn);
      if (!plan.jitter_on[k]) continue;
      const double f = plan.jitter_factor[k];
      switch (fn) {
        case 0: adjust_brightness(image, height, width, f); break;
        case 1: adjust_contrast(image, height, width, f); break;
        case 2: adjust_saturation(image, height, width, f); break;
        default: adjust_hue(image, height, width, f); break;
      }
    }
  }
  if (plan.grayscale) rgb_to_grayscale(image, height, width);
  if (plan.blur) gaussian_blur(image, height, width, plan.blur_kernel_size, plan.blur_sigma, scratch);
  if (plan.solarize) solarize(image, height, width, plan.solarize_threshold);
  for (const AugmentStep& s : plan.steps) {
    apply_augment_op(s.op, s.magnitude, image, height, width, plan.interpolation, scratch);
  }
  if (plan.erase) {
    const size_t row = static_cast<size_t>(width) * 3;
    const size_t box_row = static_cast<size_t>(plan.erase_width) * 3;
    for (int y = 0; y < plan.erase_height; ++y) {
      uint8_t* out = image + static_cast<size_t>(plan.erase_top + y) * row + static_cast<size_t>(plan.erase_left) * 3;
      if (!plan.erase_pixels.empty()) {
        const uint8_t* in = plan.erase_pixels.data() + static_cast<size_t>(y) * box_row;
        std::copy(in, in + box_row, out);
      } else {
        for (int x = 0; x < plan.erase_width; ++x, out += 3) {
          out[0] = plan.erase_color[0];
          out[1] = plan.erase_color[1];
          out[2] = plan.erase_color[2];
        }
      }
    }
  }
}

}  // namespace gpufeed::transforms
