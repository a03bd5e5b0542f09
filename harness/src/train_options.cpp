// TrainOptions' option rows (train_options_schema, trainer.h) and the rules the options keep on
// their own (TrainOptions::validate). Plain fields only: no torch call here.
#include "gpufeed/harness/trainer.h"

// The rows name only the Spec fields they set (designated initialisers); the rest keep their
// defaults on purpose, which GCC's -Wextra would report one by one.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gpufeed::harness {
namespace {

using options::Schema;
using options::Spec;
using options::Type;
using options::Value;

// A double as std::ostream prints it ("0.99998", "-1"): the rules' messages.
std::string shown(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string distributed_mode_name(DistributedMode m) {
  switch (m) {
    case DistributedMode::kAuto: return "auto";
    case DistributedMode::kOn: return "on";
    case DistributedMode::kOff: return "off";
  }
  return "auto";
}

// A path row: "" is unset (std::nullopt). `field` reaches the optional path inside TrainOptions.
template <class Reach>
void path_row(Schema<TrainOptions>& s, Spec spec, Reach field) {
  s.add(std::move(spec),
        [field](TrainOptions& o, const Value& v) {
          const auto& text = std::get<std::string>(v);
          field(o) = text.empty() ? std::nullopt : std::optional<std::filesystem::path>(text);
        },
        [field](const TrainOptions& o) -> Value {
          const auto& p = field(const_cast<TrainOptions&>(o));
          return p ? p->string() : std::string();
        });
}

// An optional weight decay: unset unless given (its default is another option's value).
void decay_row(Schema<TrainOptions>& s, Spec spec, std::optional<double> TrainOptions::*field) {
  s.add(std::move(spec), [field](TrainOptions& o, const Value& v) { o.*field = std::get<double>(v); },
        [field](const TrainOptions& o) -> Value { return (o.*field).value_or(0.0); });
}

// "0,1" or "cuda:0,cuda:1": CUDA indices become "cuda:N"; empty items are dropped.
std::vector<std::string> parse_devices(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string d;
  while (std::getline(in, d, ',')) {
    if (d.empty()) continue;
    out.push_back(std::all_of(d.begin(), d.end(), ::isdigit) ? "cuda:" + d : d);
  }
  return out;
}

void add_data_rows(Schema<TrainOptions>& s) {
  s.member({.name = "arch", .type = Type::kString,
            .help = "the ResNet: resnet18, resnet34, resnet50, resnet101 or resnet152"},
           &TrainOptions::arch);
  s.member({.name = "epochs", .type = Type::kInt, .help = "training epochs", .unit = "epochs", .min = 1},
           &TrainOptions::epochs);
  s.member({.name = "accum_steps", .type = Type::kInt, .help = "micro-batches per optimizer step (gradient accumulation)",
            .min = 1},
           &TrainOptions::accum_steps);
  s.member({.name = "val_resize_size", .type = Type::kInt,
            .help = "validation Resize (shorter side); 0: the validation crop x 256 / 224", .unit = "pixels", .min = 0},
           &TrainOptions::val_resize_size);
  s.member({.name = "val_crop_size", .type = Type::kInt, .help = "validation CenterCrop; 0: `image_size`",
            .unit = "pixels", .min = 0},
           &TrainOptions::val_crop_size);
  s.member({.name = "val_flip_average", .type = Type::kBool,
            .help = "validate on the mean logits of each image and its horizontal flip (FFCV's lr_tta)"},
           &TrainOptions::val_flip_average);
  s.member({.name = "max_steps_per_epoch", .type = Type::kInt,
            .help = "stop each epoch after this many optimizer steps; 0 = the whole epoch", .unit = "steps"},
           &TrainOptions::max_steps_per_epoch);
  s.member({.name = "ra_sampler", .type = Type::kBool,
            .help = "repeated-augmentation sampler (torchvision references' RASampler)"},
           &TrainOptions::ra_sampler);
  s.member({.name = "ra_reps", .type = Type::kInt, .help = "`ra_sampler`: repetitions of each image per epoch",
            .min = 1},
           &TrainOptions::ra_reps);
}

void add_optimizer_rows(Schema<TrainOptions>& s) {
  s.member({.name = "lr", .type = Type::kFloat,
            .help = "learning rate per 256 images, scaled by the global batch (batch size x accum steps x ranks) / 256"},
           &TrainOptions::lr);
  s.member({.name = "momentum", .type = Type::kFloat, .help = "SGD momentum"}, &TrainOptions::momentum);
  s.member({.name = "nesterov", .type = Type::kBool, .help = "Nesterov momentum"}, &TrainOptions::nesterov);
  s.member({.name = "weight_decay", .type = Type::kFloat, .help = "SGD weight decay"}, &TrainOptions::weight_decay);
  decay_row(s, {.name = "norm_weight_decay", .type = Type::kFloat,
                .help = "weight decay of norm layers' parameters (torchvision references)", .min = 0,
                .derived_default = "`weight_decay`"},
            &TrainOptions::norm_weight_decay);
  decay_row(s, {.name = "bias_weight_decay", .type = Type::kFloat,
                .help = "weight decay of every bias, norm layers' included (torchvision references)", .min = 0,
                .derived_default = "as the other weight decays say"},
            &TrainOptions::bias_weight_decay);
  s.member({.name = "no_decay_norm_bias", .type = Type::kBool,
            .help = "`norm_weight_decay` 0 and `bias_weight_decay` 0 (each unless given)"},
           &TrainOptions::no_decay_norm_bias);
  s.member({.name = "label_smoothing", .type = Type::kFloat,
            .help = "CrossEntropyLoss's label_smoothing (soft targets too)", .min = 0, .max = 0.999},
           &TrainOptions::label_smoothing);
  s.member({.name = "clip_grad_norm", .type = Type::kFloat,
            .help = "clip the gradients' total 2-norm to this (clip_grad_norm_, after unscaling under fp16); 0 = off",
            .min = 0},
           &TrainOptions::clip_grad_norm);
  s.member({.name = "mixup_alpha", .type = Type::kFloat,
            .help = "MixUp on the device, lam ~ Beta(a, a); 0 = off (with `cutmix_alpha`: one of the two per batch)",
            .min = 0},
           &TrainOptions::mixup_alpha);
  s.member({.name = "cutmix_alpha", .type = Type::kFloat, .help = "CutMix on the device, lam ~ Beta(a, a); 0 = off",
            .min = 0},
           &TrainOptions::cutmix_alpha);
  s.member({.name = "model_ema", .type = Type::kBool,
            .help = "keep and validate an EMA of the weights and buffers (torchvision references)"},
           &TrainOptions::model_ema);
  s.member({.name = "model_ema_steps", .type = Type::kInt, .help = "`model_ema`: optimizer steps between updates",
            .unit = "steps", .min = 1},
           &TrainOptions::model_ema_steps);
  s.member({.name = "model_ema_decay", .type = Type::kFloat,
            .help = "`model_ema`: decay per update before the references' adjustment for world size, batch and steps",
            .min = 0, .max = 1},
           &TrainOptions::model_ema_decay);
  s.add({.name = "precision", .type = Type::kChoice, .help = "the forward pass's arithmetic: bf16 autocast, or fp16 autocast with loss scaling",
         .words = {"fp32", "bf16", "fp16"}},
        [](TrainOptions& o, const Value& v) { o.precision = parse_precision(std::get<std::string>(v)); },
        [](const TrainOptions& o) -> Value { return precision_name(o.precision); });
  s.add({.name = "loss_scale_init", .type = Type::kFloat, .help = "fp16: initial loss scale"},
        [](TrainOptions& o, const Value& v) { o.grad_scaler.init_scale = std::get<double>(v); },
        [](const TrainOptions& o) -> Value { return o.grad_scaler.init_scale; });
  s.add({.name = "loss_scale_growth_interval", .type = Type::kInt, .help = "fp16: finite steps before growing",
         .unit = "steps"},
        [](TrainOptions& o, const Value& v) { o.grad_scaler.growth_interval = std::get<int64_t>(v); },
        [](const TrainOptions& o) -> Value { return o.grad_scaler.growth_interval; });
}

void add_device_rows(Schema<TrainOptions>& s) {
  s.member({.name = "device", .type = Type::kString, .help = "cpu, cuda or cuda:N (distributed: cuda = cuda:LOCAL_RANK)"},
           &TrainOptions::device);
  s.add({.name = "devices", .type = Type::kString,
         .help = "DataParallel over these devices: 0,1,... (CUDA indices) or full names"},
        [](TrainOptions& o, const Value& v) { o.dp_devices = parse_devices(std::get<std::string>(v)); },
        [](const TrainOptions& o) -> Value {
          std::string text;
          for (const auto& d : o.dp_devices) text += (text.empty() ? "" : ",") + d;
          return text;
        });
  s.add({.name = "distributed", .type = Type::kChoice, .help = "join a distributed run: auto = when torchrun's or Slurm's environment is set",
         .words = {"auto", "on", "off"}},
        [](TrainOptions& o, const Value& v) { o.distributed = parse_distributed_mode(std::get<std::string>(v)); },
        [](const TrainOptions& o) -> Value { return distributed_mode_name(o.distributed); });
  s.add({.name = "dist_backend", .type = Type::kChoice, .help = "the collective backend; auto = NCCL on CUDA, Gloo on CPU",
         .words = {"auto", "nccl", "gloo"}},
        [](TrainOptions& o, const Value& v) { o.dist_backend = parse_dist_backend(std::get<std::string>(v)); },
        [](const TrainOptions& o) -> Value { return dist_backend_name(o.dist_backend); });
  s.member({.name = "dist_timeout", .type = Type::kFloat, .help = "rendezvous and collective timeout",
            .unit = "seconds"},
           &TrainOptions::dist_timeout_s);
  s.member({.name = "bucket_mb", .type = Type::kInt, .help = "DDP gradient bucket size", .unit = "MiB"},
           &TrainOptions::ddp_bucket_mb);
  s.member({.name = "cudnn_benchmark", .type = Type::kBool, .help = "cudnn.benchmark on CUDA"},
           &TrainOptions::cudnn_benchmark);
  s.member({.name = "channels_last", .type = Type::kBool, .help = "model and inputs in channels_last"},
           &TrainOptions::channels_last);
  s.member({.name = "zero_init_residual", .type = Type::kBool, .help = "each block starts as the identity"},
           &TrainOptions::zero_init_residual);
  s.member({.name = "freeze_bn", .type = Type::kBool,
            .help = "BatchNorm in eval mode (running statistics, not updated)"},
           &TrainOptions::freeze_bn);
  s.member({.name = "sync_bn", .type = Type::kBool,
            .help = "SyncBatchNorm: BatchNorm statistics over all ranks' batches together (distributed runs; "
                    "not with `devices` or `freeze_bn`)"},
           &TrainOptions::sync_bn);
  s.member({.name = "activation_checkpointing", .type = Type::kBool,
            .help = "recompute the ResNet stages' activations in backward instead of keeping them (less memory, "
                    "about one more forward of compute; not with `devices`)"},
           &TrainOptions::activation_checkpointing);
}

void add_checkpoint_rows(Schema<TrainOptions>& s) {
  path_row(s, {.name = "init_weights", .type = Type::kString,
               .help = "load this state_dict first (Python or gpufeed file; wrapper prefixes module., _orig_mod., "
                       "model. are stripped): fine-tuning"},
           [](TrainOptions& o) -> auto& { return o.init_weights; });
  s.member({.name = "init_weights_skip_mismatched", .type = Type::kBool,
            .help = "with `init_weights`: keys whose shape differs keep their fresh initialisation (a warning names "
                    "them) instead of stopping"},
           &TrainOptions::init_weights_skip_mismatched);
  path_row(s, {.name = "checkpoint", .type = Type::kString,
               .help = "write the final state_dict here (torch.load-able); {rank}: every rank writes one"},
           [](TrainOptions& o) -> auto& { return o.checkpoint; });
  path_row(s, {.name = "save_checkpoint", .type = Type::kString,
               .help = "training checkpoint (model, optimizer, schedule, sampler, RNG), written every epoch and on "
                       "SIGINT/SIGTERM (without it, a stopped run writes <`checkpoint`>.train.pt or "
                       "./gpufeed_train_checkpoint.pt)"},
           [](TrainOptions& o) -> auto& { return o.save_checkpoint; });
  s.member({.name = "checkpoint_every_steps", .type = Type::kInt,
            .help = "also write the training checkpoint every N optimizer steps; 0 = only at epoch ends and on stop",
            .unit = "steps"},
           &TrainOptions::checkpoint_every_steps);
  path_row(s, {.name = "resume", .type = Type::kString, .help = "resume from this training checkpoint"},
           [](TrainOptions& o) -> auto& { return o.resume; });
  s.member({.name = "resume_replan_schedule", .type = Type::kBool,
            .help = "with `resume`: accept a changed LR schedule plan (e.g. more `epochs`) and continue on the new "
                    "plan (without it such a resume is refused, naming what changed)"},
           &TrainOptions::resume_replan_schedule);
}

void add_report_rows(Schema<TrainOptions>& s) {
  path_row(s, {.name = "metrics", .type = Type::kString,
               .help = "write JSON-lines metrics here (tools/bench/plot.py draws them)"},
           [](TrainOptions& o) -> auto& { return o.profile.metrics_path; });
  s.add({.name = "metrics_every", .type = Type::kInt, .help = "steps per metrics record", .unit = "steps", .min = 1},
        [](TrainOptions& o, const Value& v) { o.profile.metrics_every_steps = std::get<int64_t>(v); },
        [](const TrainOptions& o) -> Value { return o.profile.metrics_every_steps; });
  path_row(s, {.name = "trace", .type = Type::kString,
               .help = "write a Chrome trace (Perfetto, chrome://tracing) here"},
           [](TrainOptions& o) -> auto& { return o.profile.trace_path; });
  s.add({.name = "trace_max_events", .type = Type::kInt,
         .help = "trace size bound: the first and the last half of the run are kept", .unit = "events"},
        [](TrainOptions& o, const Value& v) { o.profile.trace_max_events = std::get<int64_t>(v); },
        [](const TrainOptions& o) -> Value { return o.profile.trace_max_events; });
}

Schema<TrainOptions> make_train_schema() {
  Schema<TrainOptions> s;
  add_data_rows(s);
  add_optimizer_rows(s);
  add_device_rows(s);
  add_checkpoint_rows(s);
  add_report_rows(s);
  s.finish([](TrainOptions& o, const std::set<std::string>&) { o.validate(); });
  return s;
}

// The rules, each with its own message ("Trainer: ..."): refuse(message) when broken.
void refuse(const std::string& message) { throw std::invalid_argument("Trainer: " + message); }

void validate_sizes(const TrainOptions& o) {
  if (o.epochs < 1 || o.loader.batch_size < 1 || o.loader.transform.rrc.size < 8 || o.accum_steps < 1) {
    refuse("epochs, batch_size and accum_steps must be >= 1, image_size >= 8");
  }
  if (const auto& r = o.schedule.resolution) {
    r->validate();
    for (int64_t e = 0; e < o.epochs; ++e) {
      if (const int side = get_resolution(*r, e); side < 8) {
        refuse("progressive resizing gives epoch " + std::to_string(e) + " (0-based) an image size of " +
               std::to_string(side) + " (FFCV's get_resolution: min_res " + std::to_string(r->min_res) +
               ", max_res " + std::to_string(r->max_res) +
               ", rounded to multiples of 32 inside the ramp); sizes must be >= 8");
      }
    }
  }
}

// The validation sizes and the epoch's shape.
void validate_epoch(const TrainOptions& o) {
  const int crop = o.val_crop_size > 0 ? o.val_crop_size : o.loader.transform.rrc.size;
  if (o.val_resize_size < 0 || o.val_crop_size < 0 || (o.val_resize_size > 0 && o.val_resize_size < crop)) {
    refuse("val_resize_size must be >= val_crop_size (0 = derived), got " + std::to_string(o.val_resize_size) +
           " and " + std::to_string(o.val_crop_size));
  }
  if (o.ra_sampler && o.ra_reps < 1) refuse("ra_reps must be >= 1, got " + std::to_string(o.ra_reps));
  if (o.max_steps_per_epoch < 0) refuse("max_steps_per_epoch must be >= 0 (0 = whole epoch)");
}

// torch.optim.SGD's own checks, and the loss's and the mixers', made before any work.
void validate_optimizer(const TrainOptions& o) {
  const auto finite_at_least_zero = [](double v) { return std::isfinite(v) && v >= 0; };
  if (o.label_smoothing < 0 || o.label_smoothing >= 1) refuse("label_smoothing must be in [0, 1)");
  if (!finite_at_least_zero(o.lr)) refuse("lr must be finite and >= 0, got " + std::to_string(o.lr));
  if (!finite_at_least_zero(o.momentum)) refuse("momentum must be finite and >= 0");
  for (const auto& [name, wd] : {std::pair<const char*, std::optional<double>>{"weight_decay", o.weight_decay},
                                 {"norm_weight_decay", o.norm_weight_decay},
                                 {"bias_weight_decay", o.bias_weight_decay}}) {
    if (wd && !finite_at_least_zero(*wd)) refuse(std::string(name) + " must be finite and >= 0");
  }
  if (!finite_at_least_zero(o.clip_grad_norm)) {
    refuse("clip_grad_norm must be finite and >= 0 (0 = off), got " + shown(o.clip_grad_norm));
  }
  if (!finite_at_least_zero(o.mixup_alpha) || !finite_at_least_zero(o.cutmix_alpha)) {
    refuse("mixup_alpha and cutmix_alpha must be finite and >= 0 (0 = off)");
  }
  if (o.model_ema && (o.model_ema_steps < 1 || !(o.model_ema_decay >= 0 && o.model_ema_decay <= 1))) {
    refuse("model_ema_steps must be >= 1 and model_ema_decay in [0, 1], got " + std::to_string(o.model_ema_steps) +
           " and " + shown(o.model_ema_decay));
  }
}

// Options that do not combine.
void validate_combinations(const TrainOptions& o) {
  if (o.loader.batch_size == 1 && !o.freeze_bn) {
    refuse("batch_size 1 cannot train BatchNorm (PyTorch: \"Expected more than 1 value per channel when "
           "training\"); use a larger batch or `freeze_bn`");
  }
  if (o.sync_bn && !o.dp_devices.empty()) {
    refuse("`sync_bn` (SyncBatchNorm) needs one process per device (gpufeed launch, torchrun or srun); it does "
           "not combine with DataParallel (`devices`)");
  }
  if (o.activation_checkpointing && !o.dp_devices.empty()) {
    refuse("`activation_checkpointing` does not combine with DataParallel (`devices`): use one process per "
           "device (gpufeed launch, torchrun or srun)");
  }
  if (o.sync_bn && o.freeze_bn) {
    refuse("`sync_bn` and `freeze_bn` do not combine: frozen BatchNorm uses its running statistics, so there "
           "are no batch statistics to synchronise");
  }
  if (!o.init_weights && (!o.init_weights_exclude.empty() || o.init_weights_skip_mismatched)) {
    refuse("init_weights_exclude / init_weights_skip_mismatched without init_weights");
  }
}

}  // namespace

void TrainOptions::validate() const {
  validate_sizes(*this);
  validate_optimizer(*this);
  validate_epoch(*this);
  validate_combinations(*this);
}

const options::Schema<TrainOptions>& train_options_schema() { return options::made_once<make_train_schema>(); }

}  // namespace gpufeed::harness
