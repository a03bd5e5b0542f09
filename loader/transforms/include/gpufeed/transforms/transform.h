#pragma once
// Transform plans: what to cut out of a source image and how to place it in the output, decided
// from the header alone (width, height) before any pixel is decoded. The random numbers come from
// a counter-based generator keyed by (seed, epoch, sample index), so a sample's augmentation is the
// same whatever thread decodes it and however many threads there are.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/option.h"
#include "gpufeed/transforms/resize.h"

namespace gpufeed::transforms {


using decode::CropRect;

/// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
/// counter-based generator cuRAND and PyTorch's CUDA generator use. Keyed by the run's seed;
/// the counter holds (draw block, stream, sample index, epoch). Draws are a pure function of
/// (seed, epoch, index, stream, n).
class SampleRng {
 public:
  /// `stream` selects one of a sample's independent streams (its counter's second word): 0 is the
  /// sample's transform; multi-crop view k draws from stream k (views.h). A stream holds 2^32
  /// blocks of 4 draws before it would run into the next.
  SampleRng(uint64_t seed, int64_t epoch, int64_t index, uint32_t stream = 0);
  /// The next 32 random bits.
  uint32_t next_u32();
  /// Uniform float in [lo, hi), drawn as torch's uniform_ on a float tensor does
  /// (24 random bits scaled to [0, 1)).
  float uniform(float lo, float hi);
  /// Uniform integer in [lo, hi) (hi > lo), as torch.randint: lo + random() % (hi - lo).
  int64_t randint(int64_t lo, int64_t hi);

 private:
  void refill();
  std::array<uint32_t, 2> key_;
  std::array<uint32_t, 4> counter_;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

/// Where a plan's random numbers come from. SampleRng in the loader; recorded torch draws in the
/// tests that prove the algorithm against torchvision's.
class DrawSource {
 public:
  virtual ~DrawSource() = default;
  /// One draw of torch.empty(1).uniform_(lo, hi).item(), a float32 value in [lo, hi).
  virtual float uniform(float lo, float hi) = 0;
  /// One draw of torch.randint(lo, hi, (1,)).item().
  virtual int64_t randint(int64_t lo, int64_t hi) = 0;
  /// torch.randperm(n) into out[0..n): by default Fisher-Yates over randint draws (randint(i, n)
  /// for i = 0 .. n - 2, swapping i with the drawn position).
  virtual void randperm(int n, int* out);
  /// n standard normals (torch.empty(n).normal_()): by default Box-Muller over pairs of
  /// uniform(0, 1) draws u1, u2: sqrt(-2 ln(1 - u1)) * cos(2 pi u2), then * sin(2 pi u2).
  virtual void normal(float* out, size_t n);
};

/// DrawSource over a SampleRng.
class RngDrawSource : public DrawSource {
 public:
  explicit RngDrawSource(SampleRng& rng) : rng_(rng) {}
  float uniform(float lo, float hi) override { return rng_.uniform(lo, hi); }
  int64_t randint(int64_t lo, int64_t hi) override { return rng_.randint(lo, hi); }

 private:
  SampleRng& rng_;
};

/// torchvision.transforms.RandomResizedCrop's arguments and defaults. Output is size x size.
struct RandomResizedCropOptions {
  int size = 224;              ///< output height and width, pixels
  float scale_min = 0.08f;     ///< lower bound of the crop's area fraction
  float scale_max = 1.0f;      ///< upper bound of the crop's area fraction
  float ratio_min = 3.0f / 4;  ///< lower bound of width/height, drawn log-uniformly
  float ratio_max = 4.0f / 3;  ///< upper bound of width/height
};

/// torchvision's eval transform: Resize(resize) of the shorter side, then CenterCrop(crop).
struct ResizeCenterCropOptions {
  int resize = 256;  ///< shorter side after resizing, pixels
  int crop = 224;    ///< output height and width, pixels; must be <= resize
};

/// Which auto-augment policy runs (torchvision references' --auto-augment values).
enum class AutoAugmentPolicy : uint8_t {
  kNone,
  kTrivialAugmentWide,  ///< "ta_wide": TrivialAugmentWide(num_magnitude_bins)
  kRandAugment,         ///< "ra": RandAugment(ra_num_ops, ra_magnitude, num_magnitude_bins)
  kImageNet,            ///< "imagenet": AutoAugment(AutoAugmentPolicy.IMAGENET)
};

/// "none", "ta_wide", "ra", "imagenet".
std::string_view to_string(AutoAugmentPolicy policy);
/// Parses the names above; throws std::invalid_argument naming the accepted values otherwise
/// ("augmix", "cifar10" and "svhn" of the references are not provided).
AutoAugmentPolicy parse_auto_augment(std::string_view name);

/// How the auto-augment policies' geometric ops (ShearX/Y, TranslateX/Y, Rotate) sample:
/// torchvision's InterpolationMode. NEAREST is the policies' default; the classification
/// references pass --interpolation (default bilinear) to them.
enum class InterpolationMode : uint8_t {
  kNearest,   ///< "nearest": exact to torchvision's pixels
  kBilinear,  ///< "bilinear": grid_sample(bilinear) in float32, rounded (augment.h)
};

/// "nearest", "bilinear".
std::string_view to_string(InterpolationMode mode);
/// Parses the names above; throws std::invalid_argument naming the accepted values otherwise.
InterpolationMode parse_interpolation(std::string_view name);

/// "bilinear", "bicubic": the resize filter's name as torchvision's InterpolationMode spells it.
std::string_view to_string(ResizeFilter filter);
/// Parses the names above; throws std::invalid_argument naming the accepted values otherwise.
ResizeFilter parse_resize_filter(std::string_view name);

/// torchvision.transforms.v2.ColorJitter(brightness, contrast, saturation, hue) with single
/// numbers: brightness/contrast/saturation factors uniform in [max(0, 1 - v), 1 + v], hue in
/// [-hue, hue]. 0 switches a factor off (no draw), as in torchvision.
struct ColorJitterOptions {
  float brightness = 0;  ///< >= 0
  float contrast = 0;    ///< >= 0
  float saturation = 0;  ///< >= 0
  float hue = 0;         ///< in [0, 0.5]
  bool enabled() const { return brightness > 0 || contrast > 0 || saturation > 0 || hue > 0; }
};

/// torchvision.transforms.v2.RandomErasing(p, scale, ratio, value) as the references use it,
/// after Normalize: `value` is in normalised units. gpufeed erases the uint8 sample instead (the
/// slot holds uint8) and writes, per channel c, the uint8 that normalises to the value nearest:
/// clamp(round(255 * (mean[c] + std[c] * v)), 0, 255), with AugmentOptions::mean/std the
/// Normalize that follows (value 0 -> the mean colour (124, 116, 104) for ImageNet's mean).
struct RandomErasingOptions {
  float p = 0;                 ///< probability, [0, 1]; 0 = off
  float scale_min = 0.02f;     ///< erased area fraction, 0 <= min <= max <= 1
  float scale_max = 0.33f;
  float ratio_min = 0.3f;      ///< aspect ratio h / w of the box, 0 < min <= max, drawn log-uniformly
  float ratio_max = 3.3f;
  bool random_value = false;   ///< value="random": per-pixel standard normals (normalised units)
  float value = 0;             ///< the constant value in normalised units (when !random_value)
};

/// torchvision.transforms.v2.RandomApply([GaussianBlur(kernel_size, sigma=(sigma_min, sigma_max))],
/// p): with probability p, a Gaussian blur whose sigma is drawn uniformly from
/// [sigma_min, sigma_max] (the same sigma on both axes, as GaussianBlur draws it).
struct GaussianBlurOptions {
  float p = 0;             ///< probability, [0, 1]; 0 = off
  int kernel_size = 9;     ///< odd, >= 1, pixels (square kernel); below 2 x the crop side + 1
  float sigma_min = 0.1f;  ///< 0 < sigma_min <= sigma_max, pixels
  float sigma_max = 2.0f;
};

/// ImageNet's per-channel mean and std (R, G, B) of [0, 1] pixels, torchvision's models'
/// Normalize: the default of the prefetcher's Normalize and of RandomErasing's value mapping.
inline constexpr std::array<float, 3> kImageNetMean{0.485f, 0.456f, 0.406f};
inline constexpr std::array<float, 3> kImageNetStd{0.229f, 0.224f, 0.225f};

/// The per-sample augmentations of the train transform, after RandomResizedCrop + flip.
/// Order: ColorJitter (applied with probability color_jitter_p), RandomGrayscale, GaussianBlur,
/// RandomSolarize (the self-supervised recipes' order: DINO's flip, colour jitter, grayscale,
/// blur, solarize), then the auto-augment policy, then RandomErasing (the references' order: the
/// policy right after the flip, RandomErasing after Normalize).
struct AugmentOptions {
  AutoAugmentPolicy auto_augment = AutoAugmentPolicy::kNone;
  int ra_num_ops = 2;              ///< RandAugment num_ops, >= 0
  int ra_magnitude = 9;            ///< RandAugment magnitude, the bin in [0, num_magnitude_bins)
  int num_magnitude_bins = 31;     ///< RandAugment/TrivialAugmentWide num_magnitude_bins, >= 2
  /// The policies' `interpolation` (their geometric ops); torchvision's default NEAREST.
  InterpolationMode interpolation = InterpolationMode::kNearest;
  ColorJitterOptions color_jitter{};
  /// RandomApply([ColorJitter], p): the probability ColorJitter runs, [0, 1]. 1 (the default) is
  /// a plain ColorJitter, without a draw for it.
  float color_jitter_p = 1;
  /// RandomGrayscale(p): the probability the image becomes gray (3 equal channels), [0, 1]; 0 = off.
  float grayscale_p = 0;
  GaussianBlurOptions gaussian_blur{};
  /// RandomSolarize(threshold, p): the probability, [0, 1]; 0 = off.
  float solarize_p = 0;
  /// RandomSolarize's threshold: values >= it are inverted; [0, 255].
  float solarize_threshold = 128;
  RandomErasingOptions random_erasing{};
  /// The Normalize that follows in the prefetcher (ImageNet's by default); only RandomErasing's
  /// value mapping uses it.
  std::array<float, 3> mean = kImageNetMean;
  std::array<float, 3> std = kImageNetStd;

  bool enabled() const {
    return auto_augment != AutoAugmentPolicy::kNone || (color_jitter.enabled() && color_jitter_p > 0) ||
           grayscale_p > 0 || gaussian_blur.p > 0 || solarize_p > 0 || random_erasing.p > 0;
  }
  /// Throws std::invalid_argument naming the option, its value and the accepted range.
  void validate() const;
};

/// AugmentOptions' user-facing fields (gpufeed/option.h): auto_augment, ra_num_ops, ra_magnitude,
/// augment_interpolation, color_jitter, color_jitter_p, grayscale_p, gaussian_blur_p,
/// gaussian_blur_kernel, gaussian_blur_sigma, solarize_p, solarize_threshold, random_erase,
/// random_erase_value, mean, std; applying
/// them ends with validate().
const options::Schema<AugmentOptions>& augment_options_schema();

/// The options in the CLI's words, for logs and reports: "none", or e.g.
/// "auto_augment=ta_wide random_erase=0.25 (value 0)".
std::string to_string(const AugmentOptions& options);

/// Which transform the loader applies, and its parameters.
struct TransformOptions {
  enum class Kind {
    kTrain,  ///< RandomResizedCrop(rrc) then RandomHorizontalFlip(flip_probability)
    kEval,   ///< Resize(eval.resize) + CenterCrop(eval.crop), no randomness
  };
  Kind kind = Kind::kTrain;
  RandomResizedCropOptions rrc{};
  ResizeCenterCropOptions eval{};
  float flip_probability = 0.5f;  ///< train only; torchvision's RandomHorizontalFlip p
  /// The interpolation of RandomResizedCrop (train) and Resize (eval): bilinear (torchvision's
  /// default) or bicubic (DINO's crops), PIL's filters (resize.h).
  ResizeFilter interpolation = ResizeFilter::kBilinear;
  /// Train only: ColorJitter, auto-augment policy, RandomErasing after the flip (augment.h).
  AugmentOptions augment{};

  /// Output height = width, pixels ([H, W, 3] per sample).
  int output_size() const { return kind == Kind::kTrain ? rrc.size : eval.crop; }

  /// The ImageNet recipe of torchvision's reference scripts at output side `size`: train is
  /// RandomResizedCrop(size) + RandomHorizontalFlip(); eval is Resize(round(size * 256 / 224)) +
  /// CenterCrop(size) (Resize(256) + CenterCrop(224) at 224).
  static TransformOptions imagenet(Kind kind, int size) {
    TransformOptions t;
    t.kind = kind;
    t.rrc.size = size;
    t.eval.crop = size;
    t.eval.resize = static_cast<int>(size * 256.0 / 224.0 + 0.5);
    return t;
  }
};

/// TransformOptions' user-facing fields (gpufeed/option.h): train, image_size, scale, ratio,
/// interpolation, resize_size (default round(image_size x 256 / 224), as
/// TransformOptions::imagenet), then augment_options_schema()'s. Applying them refuses an eval
/// Resize smaller than its crop.
const options::Schema<TransformOptions>& transform_options_schema();

/// The crop box RandomResizedCrop.get_params would choose for a width x height image, with the
/// same draws in the same order: up to 10 attempts of (uniform area fraction, log-uniform aspect
/// ratio, and when it fits, randint top then randint left), then the center-crop fallback.
/// Rounding follows Python's round (half to even). Returns the box in source pixels.
CropRect random_resized_crop_box(int width, int height, const RandomResizedCropOptions& options,
                                 DrawSource& draws);

/// The source-pixel box that Resize(resize) + CenterCrop(crop) keeps, as torchvision computes the
/// resized size (shorter side = resize, longer = int(resize * long / short)) and the crop offset
/// (int(round((resized - crop) / 2))), mapped back to source pixels and rounded to whole pixels.
/// Throws std::invalid_argument if crop > resize.
CropRect center_crop_box(int width, int height, const ResizeCenterCropOptions& options);

/// The exact source region Resize(resize) + CenterCrop(crop) keeps, in source pixels with
/// fractional edges: torchvision's crop of the resized image (the sizes and offsets
/// center_crop_box uses) mapped back through the resize, x * width / resized_width, without
/// rounding. Resampling this box of the source to crop x crop with PIL's filter, taps clamped to
/// the image, reproduces torchvision's pixels. Throws std::invalid_argument if crop > resize.
BoxF center_crop_region(int width, int height, const ResizeCenterCropOptions& options);

/// Everything the loader needs to turn one decoded source into one output sample.
struct SamplePlan {
  /// Integer region of the source, source pixels: RandomResizedCrop's box (train); the smallest
  /// integer rectangle containing `region` (eval). The decoder's crop starts from it.
  CropRect box;
  /// The source region mapped onto the whole output, source pixels (fractional for eval).
  BoxF region;
  /// Whether the resize filter's taps stop at `box` (train: torchvision crops, then resizes the
  /// crop) or run on to the image edges (eval: torchvision resizes the whole image, then crops).
  bool taps_clamped_to_box = true;
  bool flip = false;    ///< mirror left-right after resizing
  int output_size = 0;  ///< output height = width, pixels
  ResizeFilter filter = ResizeFilter::kBilinear;  ///< TransformOptions::interpolation
  /// Train only: the sample's stream after the crop and flip draws; the augmentations
  /// (augment.h) continue it.
  std::optional<SampleRng> rng;
};

/// The train plan for a width x height source from `rng`: RandomResizedCrop's box with `rrc`
/// (random_resized_crop_box), then the flip draw (torch.rand(1) < flip_probability); plan.rng is
/// the stream after them. plan_sample and the views' plan_view (views.h) both plan through it.
SamplePlan plan_random_resized_crop(const RandomResizedCropOptions& rrc, ResizeFilter filter,
                                    float flip_probability, int width, int height, SampleRng rng);

/// Plans sample `index` of `epoch` for a width x height source. Pure function of its arguments.
SamplePlan plan_sample(const TransformOptions& options, int width, int height, uint64_t seed,
                       int64_t epoch, int64_t index);

/// How to decode a source with header `info` for `plan`: `base`'s limits and error policy, the
/// DCT scale decode::choose_scale picks for plan.box and the output size, and the crop: plan.box,
/// widened (eval only) by the resize filter's reach at that scale, ceil(s * max(region width /
/// output, 8 / scale.num)) + 1 source pixels per side (s = 1 bilinear, 2 bicubic), clamped to the
/// image, so that output pixels near the edges see the neighbours torchvision's whole-image
/// resize sees. This is the
/// whole of the decode work a sample costs; the benchmark's decode floor replays it.
decode::DecodeOptions decode_options_for(const SamplePlan& plan, const decode::ImageInfo& info,
                                         const decode::DecodeOptions& base);

/// Where plan.region lies in the pixels a decode returned (`result` of a decode with
/// decode_options_for(plan, ...)): the region scaled by result.scale.num / 8 (libjpeg's output
/// pixel i covers source [i * 8 / num, (i + 1) * 8 / num)) and shifted by
/// result.scaled_region's origin, clamped to the decoded width x height.
BoxF decoded_region(const SamplePlan& plan, const decode::DecodeResult& result);

/// Resizes a decoded sample into `out` ([S, S, 3] uint8, S = plan.output_size, rows S * 3 bytes
/// apart) with plan.filter, mirrored when plan.flip: `image` must come from a decode with
/// decode_options_for(plan, ...) whose result is `result`. Throws std::invalid_argument when
/// the image does not match the result (a caller's mistake).
void resize_sample(const SamplePlan& plan, const decode::DecodeResult& result,
                   const decode::ImageBuffer& image, Resizer& resizer, uint8_t* out);

}  // namespace gpufeed::transforms
