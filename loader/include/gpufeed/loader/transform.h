#pragma once
// Transform plans: what to cut out of a source image and how to place it in the output, decided
// from the header alone (width, height) before any pixel is decoded. The random numbers come from
// a counter-based generator keyed by (seed, epoch, sample index), so a sample's augmentation is the
// same whatever thread decodes it and however many threads there are.

#include <array>
#include <cstdint>

#include "gpufeed/decode/decoder.h"

namespace gpufeed::loader {

using decode::CropRect;

/// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
/// counter-based generator cuRAND and PyTorch's CUDA generator use. Keyed by the run's seed;
/// the counter holds (sample index, epoch). Draws are a pure function of (seed, epoch, index, n).
class SampleRng {
 public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t index);
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

  /// Output height = width, pixels ([H, W, 3] per sample).
  int output_size() const { return kind == Kind::kTrain ? rrc.size : eval.crop; }
};

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

/// Everything the loader needs to turn one decoded source into one output sample.
struct SamplePlan {
  CropRect box;       ///< region of the source, source pixels
  bool flip = false;  ///< mirror left-right after resizing
  int output_size = 0;
};

/// Plans sample `index` of `epoch` for a width x height source. Pure function of its arguments.
SamplePlan plan_sample(const TransformOptions& options, int width, int height, uint64_t seed,
                       int64_t epoch, int64_t index);

}  // namespace gpufeed::loader
