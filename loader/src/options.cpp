// The loader's option schema (gpufeed/option.h), beside its struct (loader.h): every user-facing
// field of LoaderOptions, declared once, with the transforms room's schema mounted. `gpufeed
// bench`, `gpufeed train` and gpufeed.DataLoader build their flags and keywords from the rows.
#include <fmt/format.h>

// The rows name only the Spec fields they set (designated initialisers); the rest keep their
// defaults on purpose, which GCC's -Wextra would report one by one.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/option_sets.h"
#include "gpufeed/loader/rank_sampler.h"
#include "gpufeed/transforms/transform.h"

namespace gpufeed::loader {
namespace {

using options::Schema;
using options::Type;
using options::Value;

/// The largest image side an option may name: image_size's bound, in pixels.
double largest_side() { return *transforms::transform_options_schema().find("image_size")->spec.max; }

Schema<LoaderOptions> make_loader_schema() {
  Schema<LoaderOptions> s;
  s.member({.name = "batch_size", .type = Type::kInt, .help = "samples per batch (DataLoader's batch_size)",
            .unit = "samples", .min = 1, .python_default = int64_t{1}},
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
         .help = "seed of the shuffled order and of the augmentations' draws (sample i of epoch e draws from (seed, e, i))",
         .seed_range = true},
        [](LoaderOptions& o, const Value& v) { o.seed = static_cast<uint64_t>(std::get<int64_t>(v)); },
        [](const LoaderOptions& o) -> Value { return static_cast<int64_t>(o.seed); });
  s.add({.name = "shuffle_order", .type = Type::kChoice,
         .help = "the shuffled order dealt to the ranks: exact = DistributedSampler's, index for index PyTorch's; "
                 "shards = the shard-aware order (whole shards mixed within a window, one global order for any "
                 "world size, each rank reading a contiguous run of it; needs .tar shards); auto = shards for remote (URL) shards, exact otherwise",
         .words = {"auto", "exact", "shards"}},
        [](LoaderOptions& o, const Value& v) { o.shuffle_order = parse_shuffle_order(std::get<std::string>(v)); },
        [](const LoaderOptions& o) -> Value { return std::string(to_string(o.shuffle_order)); });
  s.member({.name = "shard_window", .type = Type::kInt,
            .help = "shuffle_order shards: shards (or pieces of shards) whose samples are shuffled together, the "
                    "shards a rank holds open at once (keep it at most half of remote_shards_in_flight)",
            .unit = "shards", .min = 1},
           &LoaderOptions::shard_window);
  s.member({.name = "shard_partitions", .type = Type::kInt,
            .help = "shuffle_order shards: runs of shards the global order is cut into; with at least as many shards, "
                    "each shard goes to one rank per epoch when the world size divides it (24: 1, 2, 3, 4, 6, 8, 12, 24)",
            .min = 1},
           &LoaderOptions::shard_partitions);
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
            .unit = "pixels", .min = 0, .max = largest_side()},
           &LoaderOptions::max_image_size);
  s.member({.name = "prefetch_next_epoch", .type = Type::kBool,
            .help = "decode the next epoch's first batches while this one ends, so it starts without a wait"},
           &LoaderOptions::prefetch_next_epoch);
  s.add({.name = "decode_device", .type = Type::kChoice,
         .help = "where JPEGs are decoded: cpu (the workers, libjpeg-turbo), gpu (nvImageCodec's nvJPEG on the "
                 "CUDA device the batches go to; other formats stay on the CPU) or auto (each batch shared, in the "
                 "proportion that keeps both busy); gpu and auto need a CUDA device and "
                 "nvidia-nvimgcodec-cu13[nvjpeg]",
         .words = {"cpu", "gpu", "auto"}},
        [](LoaderOptions& o, const Value& v) { o.decode_device = parse_decode_device(std::get<std::string>(v)); },
        [](const LoaderOptions& o) -> Value { return std::string(to_string(o.decode_device)); });
  s.member({.name = "gpu_decode_budget", .type = Type::kFloat,
            .help = "decode_device auto: the most GPU time the decoder may take, as a fraction of the time between "
                    "batches (the training step)",
            .min = 0.01, .max = 1},
           &LoaderOptions::gpu_decode_budget);
  s.add({.name = "views", .type = Type::kChoice,
         .help = "multi-crop views of every sample from one decode, a self-supervised recipe's: dino "
                 "(facebookresearch/dino), dinov2 (facebookresearch/dinov2 as its code runs: GaussianBlur "
                 "probabilities 0/0.9/0.5), dinov2_paper (the paper's 1/0.1/0.5); batches hold a list of views, "
                 "2 global (224 px) then local_crops_number local (96 px); none = the single-view transform",
         .words = {"none", "dino", "dinov2", "dinov2_paper"}},
        [](LoaderOptions& o, const Value& v) {
          const std::string& name = std::get<std::string>(v);
          const int locals = o.views.local_crops_number;
          o.views = name == "none" ? transforms::ViewsOptions{} : transforms::views_preset(name, locals);
          o.views.local_crops_number = locals;
        },
        [](const LoaderOptions& o) -> Value {
          if (o.views.empty()) return std::string("none");
          return o.views.preset.empty() ? std::string("custom") : o.views.preset;
        });
  s.add({.name = "local_crops_number", .type = Type::kInt,
         .help = "views preset: the number of local crops (DINO's local_crops_number)", .unit = "views", .min = 0,
         .max = 64, .derived_default = "the preset's, 8"},
        [](LoaderOptions& o, const Value& v) {
          const int n = static_cast<int>(std::get<int64_t>(v));
          if (!o.views.preset.empty()) o.views = transforms::views_preset(o.views.preset, n);
          o.views.local_crops_number = n;
        },
        [](const LoaderOptions& o) -> Value {
          return int64_t{o.views.local_crops_number < 0 ? 8 : o.views.local_crops_number};
        });
  s.mount(transforms::transform_options_schema(), [](LoaderOptions& o) -> transforms::TransformOptions& { return o.transform; });
  s.finish([](LoaderOptions& o, const std::set<std::string>& given) {  // after the transform's
    if (given.count("local_crops_number") != 0 && o.views.preset.empty()) {
      throw options::OptionError("local_crops_number", "needs a views preset (views = dino, dinov2 or dinov2_paper)");
    }
    o.validate();
  });
  return s;
}

}  // namespace

std::string_view to_string(DecodeDevice device) {
  switch (device) {
    case DecodeDevice::kGpu: return "gpu";
    case DecodeDevice::kAuto: return "auto";
    case DecodeDevice::kCpu: break;
  }
  return "cpu";
}

DecodeDevice parse_decode_device(std::string_view name) {
  if (name == "cpu") return DecodeDevice::kCpu;
  if (name == "gpu") return DecodeDevice::kGpu;
  if (name == "auto") return DecodeDevice::kAuto;
  throw options::OptionError("decode_device", fmt::format("must be cpu, gpu or auto, not '{}'", name));
}

std::string_view to_string(ErrorPolicy policy) { return policy == ErrorPolicy::kSkip ? "skip" : "raise"; }

ErrorPolicy parse_error_policy(std::string_view name) {
  if (name == "raise") return ErrorPolicy::kRaise;
  if (name == "skip") return ErrorPolicy::kSkip;
  throw options::OptionError("on_error", fmt::format("must be raise or skip, not '{}'", name));
}

const options::Schema<LoaderOptions>& loader_options_schema() {
  return options::made_once<make_loader_schema>();
}

const std::vector<options::OptionSet>& dataloader_option_sets() {
  static const std::vector<options::OptionSet> sets = {options::option_set("loader", loader_options_schema()),
                                                      options::option_set("data", datasets::data_options_schema())};
  return sets;
}

}  // namespace gpufeed::loader
