// The loader's option schemas (gpufeed/option.h): every user-facing field of AugmentOptions,
// TransformOptions, LoaderOptions and DataOptions, declared once. `gpufeed bench`, `gpufeed
// train` and gpufeed.DataLoader build their flags and keywords from these rows.
#include <fmt/format.h>

// The rows name only the Spec fields they set (designated initialisers); the rest keep their
// defaults on purpose, which GCC's -Wextra would report one by one.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <cmath>

#include "gpufeed/loader/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/transform.h"

namespace gpufeed::loader {
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

Schema<LoaderOptions> make_loader_schema() {
  Schema<LoaderOptions> s;
  s.member({.name = "batch_size", .type = Type::kInt, .help = "samples per batch (DataLoader's batch_size)",
            .unit = "samples", .min = 1},
           &LoaderOptions::batch_size);
  s.member({.name = "drop_last", .type = Type::kBool,
            .help = "drop each epoch's last, shorter batch (DataLoader's drop_last)"},
           &LoaderOptions::drop_last);
  s.add({.name = "num_workers", .type = Type::kInt,
         .help = "decode threads; 0 = the CPU budget (the affinity mask's CPUs capped by the cgroup CPU quota); "
                 "auto = the fewest that keep the consumer's data wait under 1%, measured and adapted as it runs",
         .unit = "threads", .min = 0, .max = kMaxNumWorkers, .words = {"auto"}, .cli_aliases = {"--workers"}},
        [](LoaderOptions& o, const Value& v) {
          o.num_workers = std::holds_alternative<std::string>(v) ? kAutoNumWorkers : static_cast<int>(std::get<int64_t>(v));
        },
        [](const LoaderOptions& o) -> Value {
          if (o.num_workers == kAutoNumWorkers) return std::string("auto");
          return static_cast<int64_t>(o.num_workers);
        });
  s.add({.name = "prefetch_depth", .type = Type::kInt,
         .help = "batch slots, the one the consumer holds included; auto = 3, and one more (up to 16, within 1/16 "
                 "of the machine's memory) whenever the consumer waited after the loader had filled them all",
         .unit = "batches", .min = 1, .max = 1 << 16, .words = {"auto"}},
        [](LoaderOptions& o, const Value& v) {
          o.prefetch_depth =
              std::holds_alternative<std::string>(v) ? kAutoPrefetchDepth : static_cast<int>(std::get<int64_t>(v));
        },
        [](const LoaderOptions& o) -> Value {
          if (o.prefetch_depth == kAutoPrefetchDepth) return std::string("auto");
          return static_cast<int64_t>(o.prefetch_depth);
        });
  s.add({.name = "seed", .type = Type::kInt,
         .help = "seed of the shuffled order and of the augmentations' draws (sample i of epoch e draws from (seed, e, i))"},
        [](LoaderOptions& o, const Value& v) { o.seed = static_cast<uint64_t>(std::get<int64_t>(v)); },
        [](const LoaderOptions& o) -> Value { return static_cast<int64_t>(o.seed); });
  s.add({.name = "on_error", .type = Type::kChoice,
         .help = "a file that cannot be read or decoded: raise (stop, naming it) or skip (replace it by the "
                 "next good sample, counted and reported)",
         .words = {"raise", "skip"}},
        [](LoaderOptions& o, const Value& v) { o.error_policy = parse_error_policy(std::get<std::string>(v)); },
        [](const LoaderOptions& o) -> Value { return std::string(to_string(o.error_policy)); });
  s.member({.name = "max_skips", .type = Type::kInt,
            .help = "on_error skip: more skips than this in one epoch is an error", .unit = "samples", .min = 0},
           &LoaderOptions::max_skips);
  s.add({.name = "strict_decode", .type = Type::kBool,
         .help = "every decoder warning is an error (by default benign warnings and JPEG damage confined to "
                 "restart intervals are accepted and counted)"},
        [](LoaderOptions& o, const Value& v) { o.decode.strict = std::get<bool>(v); },
        [](const LoaderOptions& o) -> Value { return o.decode.strict; });
  s.member({.name = "max_image_size", .type = Type::kInt,
            .help = "train transform: the largest side set_image_size may set later (progressive resizing); "
                    "0 = image_size",
            .unit = "pixels", .min = 0, .max = kMaxSide},
           &LoaderOptions::max_image_size);
  s.member({.name = "prefetch_next_epoch", .type = Type::kBool,
            .help = "decode the next epoch's first batches while this one ends, so it starts without a wait"},
           &LoaderOptions::prefetch_next_epoch);
  s.mount(transform_options_schema(), [](LoaderOptions& o) -> TransformOptions& { return o.transform; });
  return s;
}

Schema<DataOptions> make_data_schema() {
  Schema<DataOptions> s;
  s.member({.name = "index_cache", .type = Type::kString,
            .help = "where the dataset's listing is cached: unset for the user's cache folder "
                    "($XDG_CACHE_HOME/gpufeed, else ~/.cache/gpufeed), beside (<parent>/<name>.gpufeed-index, "
                    "never in a folder whose mode forbids writing), off, or a folder"},
           &DataOptions::index_cache);
  s.member({.name = "endpoint_url", .type = Type::kString,
            .help = "the S3 endpoint of s3:// data (MinIO, Ceph, R2, ...): unset for AWS_ENDPOINT_URL_S3, "
                    "AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS"},
           &DataOptions::endpoint_url);
  s.member({.name = "max_requests", .type = Type::kInt, .help = "ranged GETs of remote data in flight at once, per loader",
            .unit = "requests", .min = 1, .max = 4096},
           &DataOptions::max_requests);
  s.member({.name = "read_ahead", .type = Type::kInt,
            .help = "remote sample bytes requested ahead of the loader, per loader", .unit = "MiB", .min = 1,
            .max = 1 << 20},
           &DataOptions::read_ahead);
  s.member({.name = "request_timeout", .type = Type::kFloat,
            .help = "seconds a remote request may go without a byte before it is retried", .unit = "seconds",
            .min = 0.1, .max = 3600},
           &DataOptions::request_timeout);
  s.member({.name = "max_retries", .type = Type::kInt,
            .help = "retries of a remote request that timed out, was reset, cut short, throttled or got a 5xx",
            .min = 0, .max = 100},
           &DataOptions::max_retries);
  s.member({.name = "cache_dir", .type = Type::kString,
            .help = "a local folder keeping the remote bytes fetched, shared by a node's processes and kept "
                    "across runs; unset for none"},
           &DataOptions::cache_dir);
  s.member({.name = "cache_limit", .type = Type::kFloat,
            .help = "the cache_dir's size on disk at most: the shards used least recently are removed first",
            .unit = "GiB", .min = 1e-6, .max = 1e6},
           &DataOptions::cache_limit);
  return s;
}

}  // namespace

std::string_view to_string(ErrorPolicy policy) { return policy == ErrorPolicy::kSkip ? "skip" : "raise"; }

ErrorPolicy parse_error_policy(std::string_view name) {
  if (name == "raise") return ErrorPolicy::kRaise;
  if (name == "skip") return ErrorPolicy::kSkip;
  throw options::OptionError("on_error", fmt::format("must be raise or skip, not '{}'", name));
}

const options::Schema<AugmentOptions>& augment_options_schema() {
  return options::made_once<make_augment_schema>();
}

const options::Schema<TransformOptions>& transform_options_schema() {
  return options::made_once<make_transform_schema>();
}

const options::Schema<LoaderOptions>& loader_options_schema() {
  return options::made_once<make_loader_schema>();
}

const options::Schema<DataOptions>& data_options_schema() {
  return options::made_once<make_data_schema>();
}

}  // namespace gpufeed::loader
