// The transforms room's option schemas (gpufeed/option.h), beside their structs (transform.h):
// every user-facing field of AugmentOptions and TransformOptions, declared once. The loader's
// schema mounts them; `gpufeed bench`, `gpufeed train` and gpufeed.DataLoader build their flags and
// keywords from the rows.
#include <fmt/format.h>

// The rows name only the Spec fields they set (designated initialisers); the rest keep their
// defaults on purpose, which GCC's -Wextra would report one by one.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <cmath>

#include "gpufeed/transforms/transform.h"

namespace gpufeed::transforms {
namespace {

using options::Schema;
using options::Spec;
using options::Type;
using options::Value;

constexpr double kMaxSide = 1 << 15;  // pixels: larger sides are refused before any allocation

std::vector<double> floats(const Value& v) { return std::get<std::vector<double>>(v); }

/// A float field as its value reads (0.08f -> 0.08).
double f(float x) { return options::from_float(x); }

/// A (min, max) pair that must be ordered.
std::pair<float, float> ordered_pair(const std::string& name, const Value& v) {
  const auto l = floats(v);
  if (l[0] > l[1]) {
    throw options::OptionError(name, fmt::format("must be (min, max) with min <= max, not ({}, {})",
                                                 options::format_number(l[0]), options::format_number(l[1])));
  }
  return {static_cast<float>(l[0]), static_cast<float>(l[1])};
}

Schema<AugmentOptions> make_augment_schema() {
  Schema<AugmentOptions> s;
  s.add({.name = "auto_augment", .type = Type::kChoice,
         .help = "per-sample policy: ta_wide (TrivialAugmentWide), ra (RandAugment) or imagenet "
                 "(AutoAugment's ImageNet policy); torchvision references' --auto-augment",
         .words = {"none", "ta_wide", "ra", "imagenet"}},
        [](AugmentOptions& o, const Value& v) { o.auto_augment = parse_auto_augment(std::get<std::string>(v)); },
        [](const AugmentOptions& o) -> Value { return std::string(to_string(o.auto_augment)); });
  s.member({.name = "ra_num_ops", .type = Type::kInt, .help = "RandAugment's num_ops", .unit = "ops per sample",
            .min = 0},
           &AugmentOptions::ra_num_ops);
  s.member({.name = "ra_magnitude", .type = Type::kInt,
            .help = "RandAugment's magnitude: the bin in [0, 30] (num_magnitude_bins 31)", .min = 0},
           &AugmentOptions::ra_magnitude);
  s.add({.name = "augment_interpolation", .type = Type::kChoice,
         .help = "the policy's interpolation for its geometric ops: nearest (torchvision's default) or "
                 "bilinear (the references' --interpolation)",
         .words = {"nearest", "bilinear"}},
        [](AugmentOptions& o, const Value& v) { o.interpolation = parse_interpolation(std::get<std::string>(v)); },
        [](const AugmentOptions& o) -> Value { return std::string(to_string(o.interpolation)); });
  s.add({.name = "color_jitter", .type = Type::kFloats,
         .help = "ColorJitter: B (brightness = contrast = saturation = B, hue 0) or B,C,S,H; 0 = off",
         .min = 0, .sizes = {1, 4}},
        [](AugmentOptions& o, const Value& v) {
          const auto l = floats(v);
          const auto at = [&](size_t i) { return static_cast<float>(l[i]); };
          o.color_jitter = l.size() == 1 ? ColorJitterOptions{at(0), at(0), at(0), 0}
                                         : ColorJitterOptions{at(0), at(1), at(2), at(3)};
        },
        [](const AugmentOptions& o) -> Value {
          const auto& j = o.color_jitter;
          return std::vector<double>{f(j.brightness), f(j.contrast), f(j.saturation), f(j.hue)};
        });
  s.member({.name = "color_jitter_p", .type = Type::kFloat,
            .help = "RandomApply([ColorJitter], p): the probability color_jitter runs; 1 = always (no draw)",
            .min = 0, .max = 1},
           &AugmentOptions::color_jitter_p);
  s.member({.name = "grayscale_p", .type = Type::kFloat,
            .help = "RandomGrayscale's probability (3 equal channels); 0 = off", .min = 0, .max = 1},
           &AugmentOptions::grayscale_p);
  s.add({.name = "gaussian_blur_p", .type = Type::kFloat,
         .help = "RandomApply([GaussianBlur(gaussian_blur_kernel, gaussian_blur_sigma)], p): the probability; 0 = off",
         .min = 0, .max = 1},
        [](AugmentOptions& o, const Value& v) { o.gaussian_blur.p = static_cast<float>(std::get<double>(v)); },
        [](const AugmentOptions& o) -> Value { return f(o.gaussian_blur.p); });
  s.add({.name = "gaussian_blur_kernel", .type = Type::kInt, .help = "GaussianBlur's kernel_size (odd)",
         .unit = "pixels", .min = 1, .max = 1001},
        [](AugmentOptions& o, const Value& v) { o.gaussian_blur.kernel_size = static_cast<int>(std::get<int64_t>(v)); },
        [](const AugmentOptions& o) -> Value { return int64_t{o.gaussian_blur.kernel_size}; });
  s.add({.name = "gaussian_blur_sigma", .type = Type::kFloats,
         .help = "GaussianBlur's sigma range (min, max), drawn uniformly per sample", .unit = "pixels",
         .min = 1e-6, .max = 1e6, .sizes = {2}},
        [](AugmentOptions& o, const Value& v) {
          std::tie(o.gaussian_blur.sigma_min, o.gaussian_blur.sigma_max) = ordered_pair("gaussian_blur_sigma", v);
        },
        [](const AugmentOptions& o) -> Value {
          return std::vector<double>{f(o.gaussian_blur.sigma_min), f(o.gaussian_blur.sigma_max)};
        });
  s.member({.name = "solarize_p", .type = Type::kFloat, .help = "RandomSolarize's probability; 0 = off",
            .min = 0, .max = 1},
           &AugmentOptions::solarize_p);
  s.member({.name = "solarize_threshold", .type = Type::kFloat,
            .help = "RandomSolarize's threshold: values >= it are inverted", .min = 0, .max = 255},
           &AugmentOptions::solarize_threshold);
  s.add({.name = "random_erase", .type = Type::kFloat, .help = "RandomErasing's probability; 0 = off",
         .min = 0, .max = 1},
        [](AugmentOptions& o, const Value& v) { o.random_erasing.p = static_cast<float>(std::get<double>(v)); },
        [](const AugmentOptions& o) -> Value { return f(o.random_erasing.p); });
  s.add({.name = "random_erase_value", .type = Type::kFloat,
         .help = "RandomErasing's value in normalised units (0: the mean colour), or random (per-pixel normals)",
         .words = {"random"}},
        [](AugmentOptions& o, const Value& v) {
          o.random_erasing.random_value = std::holds_alternative<std::string>(v);
          if (!o.random_erasing.random_value) o.random_erasing.value = static_cast<float>(std::get<double>(v));
        },
        [](const AugmentOptions& o) -> Value {
          if (o.random_erasing.random_value) return std::string("random");
          return f(o.random_erasing.value);
        });
  const auto channels = [&](const char* name, const char* help, std::array<float, 3> AugmentOptions::*field) {
    s.add({.name = name, .type = Type::kFloats, .help = help, .sizes = {3}},
          [field](AugmentOptions& o, const Value& v) {
            const auto l = floats(v);
            for (size_t c = 0; c < 3; ++c) (o.*field)[c] = static_cast<float>(l[c]);
          },
          [field](const AugmentOptions& o) -> Value {
            const auto& a = o.*field;
            return std::vector<double>{f(a[0]), f(a[1]), f(a[2])};
          });
  };
  channels("mean", "Normalize's per-channel mean (R, G, B), of [0, 1] pixels", &AugmentOptions::mean);
  channels("std", "Normalize's per-channel std (R, G, B), > 0", &AugmentOptions::std);
  s.finish([](AugmentOptions& o, const std::set<std::string>&) { o.validate(); });
  return s;
}

Schema<TransformOptions> make_transform_schema() {
  Schema<TransformOptions> s;
  s.add({.name = "train", .type = Type::kBool,
         .help = "the train transform, RandomResizedCrop + RandomHorizontalFlip (+ augmentations); "
                 "false: the eval transform, Resize + CenterCrop"},
        [](TransformOptions& t, const Value& v) {
          t.kind = std::get<bool>(v) ? TransformOptions::Kind::kTrain : TransformOptions::Kind::kEval;
        },
        [](const TransformOptions& t) -> Value { return t.kind == TransformOptions::Kind::kTrain; });
  s.add({.name = "image_size", .type = Type::kInt,
         .help = "output side: RandomResizedCrop's size (train) or CenterCrop's (eval)", .unit = "pixels",
         .min = 1, .max = kMaxSide, .cli_aliases = {"--train-crop-size"}},
        [](TransformOptions& t, const Value& v) {
          t.rrc.size = t.eval.crop = static_cast<int>(std::get<int64_t>(v));
        },
        [](const TransformOptions& t) -> Value { return int64_t{t.rrc.size}; });
  s.add({.name = "scale", .type = Type::kFloats,
         .help = "RandomResizedCrop's scale: the crop's area fraction (min, max)", .min = 0, .max = 1,
         .sizes = {2}},
        [](TransformOptions& t, const Value& v) { std::tie(t.rrc.scale_min, t.rrc.scale_max) = ordered_pair("scale", v); },
        [](const TransformOptions& t) -> Value { return std::vector<double>{f(t.rrc.scale_min), f(t.rrc.scale_max)}; });
  s.add({.name = "ratio", .type = Type::kFloats,
         .help = "RandomResizedCrop's ratio: the crop's aspect ratio w/h (min, max), drawn log-uniformly",
         .min = 1e-6, .max = 1e6, .sizes = {2}},
        [](TransformOptions& t, const Value& v) { std::tie(t.rrc.ratio_min, t.rrc.ratio_max) = ordered_pair("ratio", v); },
        [](const TransformOptions& t) -> Value { return std::vector<double>{f(t.rrc.ratio_min), f(t.rrc.ratio_max)}; });
  s.add({.name = "interpolation", .type = Type::kChoice,
         .help = "the resize filter of RandomResizedCrop (train) and Resize (eval): bilinear (torchvision's "
                 "default) or bicubic (DINO's crops), as torchvision computes them on PIL images",
         .words = {"bilinear", "bicubic"}},
        [](TransformOptions& t, const Value& v) { t.interpolation = parse_resize_filter(std::get<std::string>(v)); },
        [](const TransformOptions& t) -> Value { return std::string(to_string(t.interpolation)); });
  s.add({.name = "hflip_p", .type = Type::kFloat,
         .help = "train transform: RandomHorizontalFlip's probability (torchvision's p); 0 = never", .min = 0,
         .max = 1},
        [](TransformOptions& t, const Value& v) { t.flip_probability = static_cast<float>(std::get<double>(v)); },
        [](const TransformOptions& t) -> Value { return f(t.flip_probability); });
  s.add({.name = "resize_size", .type = Type::kInt,
         .help = "eval transform: Resize's shorter side before CenterCrop(image_size)", .unit = "pixels",
         .min = 1, .max = kMaxSide, .derived_default = "round(image_size x 256 / 224)"},
        [](TransformOptions& t, const Value& v) { t.eval.resize = static_cast<int>(std::get<int64_t>(v)); },
        [](const TransformOptions& t) -> Value { return int64_t{t.eval.resize}; });
  s.mount(augment_options_schema(), [](TransformOptions& t) -> AugmentOptions& { return t.augment; });
  s.finish([](TransformOptions& t, const std::set<std::string>& given) {
    if (given.count("resize_size") == 0) t.eval.resize = static_cast<int>(std::lround(t.eval.crop * 256.0 / 224.0));
    const GaussianBlurOptions& blur = t.augment.gaussian_blur;
    if (t.kind == TransformOptions::Kind::kTrain && blur.p > 0 && blur.kernel_size / 2 >= t.rrc.size) {
      // torch's reflect padding of kernel_size / 2 needs a larger image (gaussian_blur refuses it).
      throw options::OptionError("gaussian_blur_kernel",
                                 fmt::format("must be below 2 x `image_size` + 1 (reflect padding of {} on a {} "
                                             "pixel crop), not {}", blur.kernel_size / 2, t.rrc.size, blur.kernel_size));
    }
    if (t.kind == TransformOptions::Kind::kEval && t.eval.resize < t.eval.crop) {
      throw options::OptionError("resize_size", fmt::format("must be >= `image_size` (CenterCrop of the Resize), "
                                                            "not {} < {}", t.eval.resize, t.eval.crop));
    }
  });
  return s;
}

}  // namespace

const options::Schema<AugmentOptions>& augment_options_schema() {
  return options::made_once<make_augment_schema>();
}

const options::Schema<TransformOptions>& transform_options_schema() {
  return options::made_once<make_transform_schema>();
}

}  // namespace gpufeed::transforms
