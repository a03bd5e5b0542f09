#pragma once
// Per-sample augmentations on the loader's pool: TrivialAugmentWide, RandAugment, AutoAugment's
// ImageNet policy, ColorJitter (optionally under RandomApply), RandomGrayscale, GaussianBlur under
// RandomApply, RandomSolarize and RandomErasing, with torchvision.transforms.v2's semantics, run
// on the uint8 output of RandomResizedCrop + flip in the batch slot.
//
// Images here are [H, W, 3] uint8, rows W * 3 bytes apart (the slot's layout); torchvision's
// functional ops see the same pixels as a [3, H, W] uint8 tensor. Every op below reproduces
// torchvision.transforms.v2.functional's uint8 tensor kernel (torchvision 0.26 on torch 2.11's CPU
// kernels), including its float32 arithmetic where it has some: the same float32 operations in
// the same order, fused multiply-adds where ATen's vectorised kernels fuse (blends, linspace),
// the affine grid's unfused (x a + y b) + c, grid_sample's round-half-even (and, for bilinear,
// its fused location and tap accumulation). The golden test
// (tests/test_augment.cpp, goldens made at test time by tests/goldens/gen_augment.py) holds every
// op to torchvision's output with no tolerance, every pixel, over a grid of magnitudes and images
// (non-square, 224x224, low-contrast), and the whole transforms replayed on torchvision's draws.
// Known limits of exactness: gaussian_blur's 1-D kernel comes from torch.softmax, whose exp is
// ATen's vectorised polynomial (exp_u20), not reproduced here: the kernel here is the correctly
// rounded softmax, which can differ from torch's in the last bits of a weight, and a blurred value
// whose float32 sum lies within about 1e-5 of a .5 then rounds the other way: one level, in
// 34 of 5.7 million golden values (tests/test_augment.cpp; the kernel weights are within 3
// units in the last place of torch's, 26 of 144 kernels equal); the convolution itself reproduces
// torch's CPU conv2d as it runs on the x86 CPUs the goldens ran on (float32, taps in row-major
// order, each a fused multiply-add; another ATen or oneDNN path could sum in another order).
// Contrast's mean is exact while H * W * 255 < 2^24 (up to 256x256;
// beyond, torch's float32 sum rounds and a LUT entry may move by one); the geometric ops and hue
// follow torch's float32 rounding as computed on AVX2 CPUs (another ATen CPU capability could
// round a pixel at an exact nearest-neighbour tie differently; the test would show it).
//
// Draw order (a sample's stream is transforms::SampleRng(seed, epoch, index); RandomResizedCrop's
// draws and the flip draw come first, see transform.h). Each "uniform" is one uniform(0, 1) draw
// unless stated, each "randint(n)" one randint(0, n) draw:
//   1. ColorJitter, when any of its factors is on and color_jitter_p > 0: when color_jitter_p < 1,
//      one uniform >= color_jitter_p skips it (RandomApply; no more draws for it); then the order
//      of the four adjustments
//      (randperm(4): Fisher-Yates, randint(i, 4) for i = 0, 1, 2, swapping i and the draw), then
//      one uniform(lo, hi) per enabled factor in the order brightness, contrast, saturation, hue.
//      Then the adjustments in that order (torchvision's ColorJitter.make_params/transform).
//   2. RandomGrayscale, when grayscale_p > 0: uniform >= grayscale_p skips it.
//   3. GaussianBlur, when gaussian_blur.p > 0: uniform >= p skips it (RandomApply); otherwise
//      uniform(sigma_min, sigma_max) is sigma (GaussianBlur.make_params).
//   4. RandomSolarize, when solarize_p > 0: uniform >= solarize_p skips it.
//   5. the auto-augment policy:
//      TrivialAugmentWide: randint(14) op; when the op has magnitudes, randint(num_magnitude_bins)
//        bin; when the op is signed, uniform <= 0.5 negates the magnitude.
//      RandAugment: num_ops times: randint(14) op; when it has magnitudes and is signed,
//        uniform <= 0.5 negates (the bin is the fixed `ra_magnitude`).
//      AutoAugment (ImageNet): randint(25) sub-policy; for each of its two ops: uniform <= p
//        applies it (else no more draws for it); when applied with a signed magnitude,
//        uniform <= 0.5 negates.
//   6. RandomErasing: uniform >= p skips it; otherwise up to 10 attempts of
//      (uniform(scale) area fraction, exp(uniform(log ratio)) aspect); the first box that fits
//      (h < H and w < W, h = round(sqrt(area * aspect)), w = round(sqrt(area / aspect))) then draws,
//      for value "random", 3 * h * w normals (channel-major, Box-Muller over two uniforms each),
//      then randint(H - h + 1) top and randint(W - w + 1) left. No box fits: nothing is erased.
// The op lists are torchvision's _AUGMENTATION_SPACE dicts in their order: Identity, ShearX,
// ShearY, TranslateX, TranslateY, Rotate, Brightness, Color, Contrast, Sharpness, Posterize,
// Solarize, AutoContrast, Equalize.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/transforms/transform.h"

namespace gpufeed::transforms {

/// The operations of torchvision's auto-augment family (_AutoAugmentBase's transform ids).
enum class AugmentOp : uint8_t {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
  kInvert,
};

/// torchvision's transform id ("ShearX", ...).
std::string_view to_string(AugmentOp op);

/// The magnitude torchvision's policy uses for `op` at `bin` (its _AUGMENTATION_SPACE entry
/// evaluated at num_bins, height, width, as float32 like torch.linspace's CPU kernel), before the
/// sign. Posterize returns its bit count, ops without magnitudes 0. `policy` must not be kNone.
float augment_magnitude(AutoAugmentPolicy policy, AugmentOp op, int bin, int num_bins, int height,
                        int width);
/// Whether the op is signed in that policy (a uniform <= 0.5 draw negates its magnitude).
bool augment_signed(AugmentOp op);
/// Whether the op has magnitudes (draws a bin in TrivialAugmentWide).
bool augment_has_magnitude(AugmentOp op);

/// One chosen op with its signed magnitude.
struct AugmentStep {
  AugmentOp op = AugmentOp::kIdentity;
  double magnitude = 0;
};

/// Everything drawn for one sample's augmentations; apply_augment replays it. Buffers keep their
/// capacity across samples (the loader keeps one plan per thread).
struct AugmentPlan {
  InterpolationMode interpolation = InterpolationMode::kNearest;  ///< the policy's geometric ops
  bool color_jitter = false;
  std::array<int, 4> jitter_order{0, 1, 2, 3};  ///< 0 brightness, 1 contrast, 2 saturation, 3 hue
  std::array<double, 4> jitter_factor{};         ///< per adjustment; unused when switched off
  std::array<bool, 4> jitter_on{};
  bool grayscale = false;                        ///< RandomGrayscale applies
  bool blur = false;                             ///< GaussianBlur applies
  int blur_kernel_size = 0;
  double blur_sigma = 0;                         ///< the drawn sigma (a float32 value)
  bool solarize = false;                         ///< RandomSolarize applies
  double solarize_threshold = 0;
  std::vector<AugmentStep> steps;                ///< the policy's ops, in order
  bool erase = false;
  int erase_top = 0, erase_left = 0, erase_height = 0, erase_width = 0;
  /// value="random": the erased pixels, [erase_height, erase_width, 3] uint8 (already mapped to
  /// uint8); empty for a constant value, which is erase_color.
  std::vector<uint8_t> erase_pixels;
  std::array<uint8_t, 3> erase_color{};
};

/// Draws `plan` for an image of height x width from `draws`, in the documented order.
/// `options` must be valid (validate()).
void plan_augment(const AugmentOptions& options, int height, int width, DrawSource& draws,
                  AugmentPlan& plan);

/// Scratch memory for the ops that need a copy of the input (sharpness, geometry, blur), reused.
struct AugmentScratch {
  std::vector<uint8_t> copy;
  std::vector<float> padded, row;  ///< gaussian_blur's padded float image and accumulator row
};

/// Applies `plan` in place to `image` ([height, width, 3] uint8, contiguous).
void apply_augment(const AugmentPlan& plan, uint8_t* image, int height, int width,
                   AugmentScratch& scratch);

// ---------------------------------------------------------------------------------------------
// The functional ops, in place on [height, width, 3] uint8 contiguous images. Each names the
// torchvision.transforms.v2.functional kernel it reproduces. Factors outside torchvision's
// accepted range throw std::invalid_argument as torchvision raises.

/// adjust_brightness: trunc(min(x * f, 255)) in float32. f >= 0.
void adjust_brightness(uint8_t* image, int height, int width, double factor);

/// adjust_sharpness: blend with the rounded 3x3 [1 1 1; 1 5 1; 1 1 1] / 13 blur; borders kept.
void adjust_sharpness(uint8_t* image, int height, int width, double factor, AugmentScratch& scratch);
/// Which implementation the colour kernels (adjust_hue, adjust_saturation, adjust_contrast) run,
/// and gaussian_blur's convolution and the bilinear warp of affine and rotate (there with the
/// fused multiply-adds they need: fma_kernel_supported). All give identical bytes (the same float
/// and double operations in the same order, several pixels per step; tests/test_augment.cpp
/// compares them on every 24-bit colour, and blur and warp on random images).
enum class ColorKernel {
  kAuto,     ///< auto_color_kernel(): on x86 kAvx2 where the CPU has it, else kScalar; elsewhere
             ///< kHighway where built (aarch64: NEON), else kScalar. GPUFEED_RESIZE_KERNEL=scalar
             ///< (resize.h) makes it kScalar, =hwy kHighway (kScalar where unsupported)
  kScalar,   ///< portable C++
  kAvx2,     ///< x86 AVX2 (no FMA; blur and warp: AVX2 and FMA); std::invalid_argument on a CPU
             ///< without it
  kHighway,  ///< Google Highway, 128-bit vectors, one target per build: NEON on aarch64, SSE4 on
             ///< x86 (CPUs with SSE4.2; kAuto never picks it there); 16 pixels per step. The blur
             ///< and warp's Highway build on x86 is its AVX2 target (fma_kernel_supported).
             ///< std::invalid_argument where this build or CPU lacks it (other architectures; x86
             ///< without SSE4.2, or for blur and warp without AVX2 and FMA)
};
/// Whether this build and CPU run `kernel`: kAuto and kScalar always; kAvx2 and kHighway as
/// ColorKernel says (checked once at run time).
bool color_kernel_supported(ColorKernel kernel);
/// The kernel kAuto runs in the colour kernels (kAvx2, kHighway or kScalar), fixed at the first
/// call.
ColorKernel auto_color_kernel();
/// Whether gaussian_blur and the bilinear affine and rotate run `kernel` in this build and CPU:
/// kAuto and kScalar always; kAvx2 on x86 with AVX2 and FMA; kHighway on aarch64 (NEON) and on
/// x86 with AVX2 and FMA (Highway's AVX2 target with 128-bit vectors: SSE4 has no fused
/// multiply-add). kAuto runs auto_color_kernel()'s choice where this is true for it, else kScalar
/// (so NEON on aarch64, AVX2 on x86, GPUFEED_RESIZE_KERNEL=scalar|hwy as for the colour kernels).
bool fma_kernel_supported(ColorKernel kernel);
/// adjust_hue: RGB -> HSV -> shift -> RGB in float32 (torchvision's _rgb_to_hsv/_hsv_to_rgb).
/// factor in [-0.5, 0.5]. `kernel`: the AVX2 loop does 8 pixels per step, Highway's 16, then
/// the scalar loop the rest (the same operations).
void adjust_hue(uint8_t* image, int height, int width, double factor, ColorKernel kernel = ColorKernel::kAuto);
/// adjust_saturation: blend with floor(0.2989 r + 0.587 g + 0.114 b) (float32, fused adds).
/// `kernel` as adjust_hue's (the AVX2 loop does 4 pixels per step, Highway's 16: the same
/// operations).
void adjust_saturation(uint8_t* image, int height, int width, double factor, ColorKernel kernel = ColorKernel::kAuto);
/// adjust_contrast: blend with the float32 mean of the floored grayscale. `kernel` as
/// adjust_saturation's (for the grayscale sum).
void adjust_contrast(uint8_t* image, int height, int width, double factor, ColorKernel kernel = ColorKernel::kAuto);
/// posterize: keep the top `bits` bits; bits in [0, 8].
void posterize(uint8_t* image, int height, int width, int bits);
/// solarize: x >= threshold (compared in float32) becomes 255 - x; threshold <= 255.
void solarize(uint8_t* image, int height, int width, double threshold);
/// rgb_to_grayscale(image, num_output_channels=3): every channel becomes
/// trunc(0.2989 r + 0.587 g + 0.114 b) in float32 (as adjust_saturation's gray).
void rgb_to_grayscale(uint8_t* image, int height, int width);
/// gaussian_blur(image, [k, k], [sigma, sigma]): the float32 1-D kernel softmax(-(x / sigma)^2)
/// over x = linspace(-(k - 1) / (2 sqrt 2), (k - 1) / (2 sqrt 2), k), its float32 outer product,
/// reflect padding by k / 2, a float32 depthwise convolution, rounded half to even. k odd >= 1,
/// k / 2 below height and width (torch's reflect padding), sigma > 0; otherwise
/// std::invalid_argument as torchvision raises. Exact up to the kernel's last bit (see above).
/// `kernel`: the convolution's loop (fma_kernel_supported; std::invalid_argument where it is
/// false): AVX2 does 32 values per block, Highway 32 then 4, each value the same fused
/// multiply-adds in the same order.
void gaussian_blur(uint8_t* image, int height, int width, int kernel_size, double sigma,
                   AugmentScratch& scratch, ColorKernel kernel = ColorKernel::kAuto);
/// The 1-D kernel gaussian_blur uses (k float32 weights), for tests.
std::vector<float> gaussian_kernel1d(int kernel_size, double sigma);
/// autocontrast: per channel, (x - min) / ((max - min) / 255) truncated (float32).
void autocontrast(uint8_t* image, int height, int width);
/// equalize: per channel, PIL's histogram equalisation LUT (as torchvision's equalize_image).
void equalize(uint8_t* image, int height, int width);
/// invert: 255 - x.
void invert(uint8_t* image, int height, int width);
/// F.affine(image, angle, [translate_x, translate_y], scale=1, [shear_x, shear_y], interpolation,
/// fill=None, center) with angle and shears in degrees, translations in pixels, and center = [0, 0]
/// (the top-left corner, as the auto-augment shears use) when `center_top_left`, else None (the
/// image centre). Pixels mapped from outside the image are 0 (bilinear blends them in as 0).
/// `kernel`: the bilinear sampling's loop as gaussian_blur's (AVX2 8 pixels per step, Highway
/// 4); nearest sampling and whole-pixel shifts have one loop and ignore it.
void affine(uint8_t* image, int height, int width, double angle, double translate_x, double translate_y,
            double shear_x, double shear_y, bool center_top_left, InterpolationMode interpolation,
            AugmentScratch& scratch, ColorKernel kernel = ColorKernel::kAuto);
/// rotate(image, angle, interpolation, expand=False, fill=None) about the centre, angle in
/// degrees, counter-clockwise; 0/180 (and 90/270 on square images) are exact transposes as in
/// torchvision. `kernel` as affine's.
void rotate(uint8_t* image, int height, int width, double angle, InterpolationMode interpolation,
            AugmentScratch& scratch, ColorKernel kernel = ColorKernel::kAuto);

/// torchvision's _AutoAugmentBase._apply_image_or_video_transform(op, magnitude, interpolation,
/// fill=None) (fill None: 0, the default of TrivialAugmentWide/RandAugment/AutoAugment).
void apply_augment_op(AugmentOp op, double magnitude, uint8_t* image, int height, int width,
                      InterpolationMode interpolation, AugmentScratch& scratch);

}  // namespace gpufeed::transforms
