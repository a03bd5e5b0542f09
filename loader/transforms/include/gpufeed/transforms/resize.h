#pragma once
// Antialiased bilinear or bicubic resize of packed RGB, PIL's algorithm: what torchvision's Resize
// and RandomResizedCrop compute on the PIL images ImageFolder yields (antialias=True, BILINEAR or
// BICUBIC).
// The loader's hot path: it writes the sample straight into its batch slot row, mirrored when the
// plan flips it, and allocates nothing once its tables have grown to the largest sizes seen.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpufeed::transforms {

/// A rectangle with fractional edges, [x0, x1) x [y0, y1), in pixels of the image it refers to
/// (pixel i covers [i, i + 1)). PIL's `box` argument of Image.resize.
struct BoxF {
  double x0 = 0;
  double y0 = 0;
  double x1 = 0;
  double y1 = 0;
  double width() const { return x1 - x0; }
  double height() const { return y1 - y0; }
};

/// The resampling filter: PIL's (and torchvision's InterpolationMode on PIL images).
enum class ResizeFilter : uint8_t {
  kBilinear,  ///< PIL's BILINEAR: the triangle 1 - |x| on [-1, 1]
  kBicubic,   ///< PIL's BICUBIC: Keys' cubic with a = -0.5 on [-2, 2]; its negative lobes can
              ///< overshoot, the results are clipped to [0, 255] after each pass as in PIL
};

/// Which implementation Resizer runs. All give identical bytes; the explicit choices exist for
/// tests that prove it and for CPUs that lack the wider ones.
enum class ResizeKernel {
  kAuto,     ///< on x86 the widest the CPU runs (checked once at run time): kAvx512, kAvx2 or
             ///< kScalar; on aarch64 kHighway (NEON). The environment variable
             ///< GPUFEED_RESIZE_KERNEL=scalar|hwy|avx2|avx512 picks another (to measure an
             ///< AVX2-only CPU's path on an AVX-512 machine); a kernel this build or CPU cannot
             ///< run, or another value, makes Resizer's constructor throw std::invalid_argument
             ///< naming the variable
  kScalar,   ///< portable C++
  kAvx2,     ///< x86 AVX2: four output pixels (two per vector; or 32 bytes of a row) per step
  kAvx512,   ///< x86 AVX-512 F+BW: four output pixels (or 64 bytes) per step
  kHighway,  ///< Google Highway, 128-bit vectors, compiled for one target per build (no runtime
             ///< dispatch): NEON on aarch64 (every aarch64 CPU); SSE4 on x86 (CPUs with SSE4.2),
             ///< where it exists so x86 machines test it (kAuto never picks it there). One output
             ///< pixel (or 16 bytes of a row) per vector. Absent on other architectures
};

/// Resizes regions of RGB images. Holds the filter tables and one intermediate row, reused across
/// calls, so keep one per thread: after the first few calls it allocates nothing. Not
/// thread-safe itself.
///
/// The filter is PIL's ImagingResample with the BILINEAR (triangle) or BICUBIC filter: for an
/// output of n pixels over a box of width w, scale = w / n, support = s * max(scale, 1) input
/// pixels on either side of the output pixel's centre x0 + (i + 0.5) * scale (s = 1 bilinear,
/// 2 bicubic), weights filter(d / max(scale, 1)) normalised to sum to one, taps clamped to the
/// source image (not to the box). Two separable passes with an 8-bit intermediate clipped to
/// [0, 255], like PIL's. Bilinear runs vertical first (PIL: horizontal first), one output row at
/// a time, so the intermediate is a single row that stays in L1; bicubic runs Pillow's order
/// (horizontal first over every source row the output needs, an intermediate of those rows x the
/// output width), since its negative lobes overshoot and where the overshoots are clipped shows.
/// Weights in 14-bit fixed point (PIL: 22 bits), rounded half away from zero as PIL rounds its.
/// Bilinear differs from PIL by at most two levels, 0.25 levels on average on random noise, under
/// 0.02 on smooth images. Bicubic differs by a level or two where Pillow filters horizontally
/// first, but the venv's Pillow 13.0 runs some resizes (most that shrink the height more than the
/// width) vertical first, and clips the overshoots after the other pass: up to 21 levels at
/// sharp edges, 0.37 levels on average on random noise, 0.034 on smooth images
/// (tests/test_resize.cpp).
class Resizer {
 public:
  /// Throws std::invalid_argument when this build or CPU cannot run `kernel` (see supported()).
  explicit Resizer(ResizeKernel kernel = ResizeKernel::kAuto);

  /// Whether this build and CPU run `kernel` (kAuto and kScalar always).
  static bool supported(ResizeKernel kernel);

  /// Resizes `box` of `src` into `dst`.
  ///  - src: [src_height, src_width, 3] uint8 RGB, rows src_stride bytes apart (>= src_width * 3);
  ///  - box: the source region mapped onto the whole output, in src pixels; it may be fractional
  ///    and must lie inside [0, src_width] x [0, src_height] with positive width and height;
  ///  - dst: [dst_height, dst_width, 3] uint8 RGB, rows dst_stride bytes apart (>= dst_width * 3);
  ///  - flip: mirror left-right (torchvision's RandomHorizontalFlip after the resize), at no cost;
  ///  - filter: the resampling filter (bilinear: PIL's BILINEAR, the loader's default).
  /// Throws std::invalid_argument for null pointers, non-positive sizes, short strides or a box
  /// outside the source. src and dst must not overlap.
  void resize(const uint8_t* src, int src_width, int src_height, size_t src_stride, const BoxF& box,
              uint8_t* dst, int dst_width, int dst_height, size_t dst_stride, bool flip = false,
              ResizeFilter filter = ResizeFilter::kBilinear);

  /// The kernel this resizer runs (kAuto resolved to a concrete one).
  ResizeKernel kernel() const { return kernel_; }

 private:
  struct Axis {
    int taps = 0;                 // taps per output pixel, padded (multiple of 4 horizontally)
    std::vector<int> first;       // [n] first source index of each output pixel's taps
    std::vector<int> count;       // [n] real taps of each output pixel (<= taps)
    std::vector<int16_t> coeffs;  // [n, taps] fixed-point weights, zero past the real taps
  };
  void compute_axis(ResizeFilter filter, int in_size, double in0, double in1, int out_size,
                    int pad_to, bool reverse, Axis& axis);
  // The source columns the horizontal pass reads: from x_begin, row_bytes bytes of each row.
  struct Columns {
    int x_begin = 0;
    size_t row_bytes = 0;
  };
  // The steps of resize() after the tap tables: the source columns (and the row buffers sized
  // for them), the SIMD kernels' weight layout (nullptr for the scalar kernel), the rows.
  Columns prepare_columns(int src_width, int dst_width);
  const int16_t* prepare_lane_coeffs(int dst_width);
  void resize_rows(const uint8_t* src, size_t src_stride, Columns columns,
                   const int16_t* lane_coeffs, uint8_t* dst, int dst_width, int dst_height,
                   size_t dst_stride);
  // The bicubic filter's order, PIL's: horizontal pass first (see resize.cpp).
  void horizontal_row(const uint8_t* src_row, Columns columns, const int16_t* lane_coeffs,
                      int dst_width, uint8_t* out);
  void resize_rows_horizontal_first(const uint8_t* src, size_t src_stride, Columns columns,
                                    const int16_t* lane_coeffs, uint8_t* dst, int dst_width,
                                    int dst_height, size_t dst_stride);

  ResizeKernel kernel_;
  std::vector<double> weights_;           // one output pixel's weights, before fixed point
  Axis horizontal_, vertical_;
  std::vector<uint8_t> row_;              // one vertically filtered row (+ padding for SIMD)
  std::vector<int> offsets_;              // byte offset of each output pixel's first tap
  std::vector<int32_t> acc_;              // the scalar vertical pass's accumulators
  std::vector<const uint8_t*> rows_;      // the source rows of one output row
  std::vector<int32_t> pairs_;            // their weights, two int16 per int32 (AVX2)
  std::vector<int16_t> lane_coeffs_;      // SIMD layout of horizontal_.coeffs (see resize.cpp)
  std::vector<uint8_t> intermediate_;     // bicubic: the horizontally filtered source rows
};

}  // namespace gpufeed::transforms
