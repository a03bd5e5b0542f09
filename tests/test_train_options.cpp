// TrainOptions' option rows (harness::train_options_schema, harness/src/train_options.cpp): the
// flags `gpufeed train` registered for TrainOptions' fields by hand, with their defaults and
// accepted values, and the rules TrainOptions::validate keeps (the schema's finisher), each
// refusing with the message the Trainer gave.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "gpufeed/harness/trainer.h"
#include "gpufeed/option.h"

namespace {

using gpufeed::harness::TrainOptions;
namespace options = gpufeed::options;

const auto& schema() { return gpufeed::harness::train_options_schema(); }

// The default as --help and docs/OPTIONS.md show it ("" for a derived default).
std::string default_text(const std::string& name) {
  const auto* f = schema().find(name);
  EXPECT_NE(f, nullptr) << name;
  if (f == nullptr) return "?";
  const auto d = schema().default_value(*f);
  return d ? options::format_value(*d) : "";
}

// The message applying `given` to TrainOptions{} throws, or "".
std::string refusal(const std::map<std::string, options::Value>& given, TrainOptions o = {}) {
  try {
    schema().apply(o, given);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string validate_refusal(const TrainOptions& o) {
  try {
    o.validate();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Every flag cmd_train.cpp registered by hand for a TrainOptions field, spelled as it was
// (--dist-timeout for dist_timeout_s, --bucket-mb for ddp_bucket_mb, --no-cudnn-benchmark, the
// loss scaler's --loss-scale-*, the profile's --metrics*/--trace*), with the default it showed
// ("" for none shown).
TEST(TrainOptionSchema, RowsAreTheFlagsTrainRegisteredWithTheirDefaults) {
  const std::map<std::string, std::string> before = {
      {"arch", "resnet18"}, {"epochs", "1"}, {"accum_steps", "1"}, {"lr", "0.1"}, {"momentum", "0.9"},
      {"nesterov", "false"}, {"weight_decay", "0.0001"}, {"norm_weight_decay", ""}, {"bias_weight_decay", ""},
      {"no_decay_norm_bias", "false"}, {"label_smoothing", "0"}, {"clip_grad_norm", "0"}, {"mixup_alpha", "0"},
      {"cutmix_alpha", "0"}, {"model_ema", "false"}, {"model_ema_steps", "32"}, {"model_ema_decay", "0.99998"},
      {"precision", "fp32"}, {"loss_scale_init", "65536"}, {"loss_scale_growth_interval", "2000"},
      {"val_resize_size", "0"}, {"val_crop_size", "0"}, {"val_flip_average", "false"},
      {"max_steps_per_epoch", "0"}, {"device", "cpu"}, {"devices", ""}, {"distributed", "auto"},
      {"dist_backend", "auto"}, {"dist_timeout", "1800"}, {"bucket_mb", "25"}, {"cudnn_benchmark", "true"},
      {"channels_last", "false"}, {"zero_init_residual", "false"}, {"freeze_bn", "false"}, {"sync_bn", "false"},
      {"activation_checkpointing", "false"}, {"ra_sampler", "false"}, {"ra_reps", "3"}, {"init_weights", ""},
      {"init_weights_skip_mismatched", "false"}, {"checkpoint", ""}, {"save_checkpoint", ""},
      {"checkpoint_every_steps", "0"}, {"resume", ""}, {"resume_replan_schedule", "false"}, {"metrics", ""},
      {"metrics_every", "10"}, {"trace", ""}, {"trace_max_events", "400000"}};
  std::set<std::string> names;
  for (const auto& [name, shown] : before) names.insert(name);
  EXPECT_EQ(schema().names(), names);
  for (const auto& [name, shown] : before) EXPECT_EQ(default_text(name), shown) << name;
  // The weight decays' "unset" defaults are other options' values, as their help said.
  EXPECT_EQ(schema().find("norm_weight_decay")->spec.derived_default, "`weight_decay`");
  EXPECT_FALSE(schema().find("bias_weight_decay")->spec.derived_default.empty());
}

// The ranges the hand-made flags checked (kAtLeastOne, NonNegativeNumber, Range, IsMember).
TEST(TrainOptionSchema, AcceptsWhatTheFlagsAccepted) {
  const auto refused = [](const std::string& name, const std::string& text) {
    try {
      options::parse(schema().find(name)->spec, text);
    } catch (const options::OptionError&) {
      return true;
    }
    return false;
  };
  for (const char* name : {"epochs", "accum_steps", "model_ema_steps", "ra_reps", "metrics_every"}) {
    EXPECT_TRUE(refused(name, "0")) << name;
    EXPECT_FALSE(refused(name, "1")) << name;
  }
  for (const char* name : {"norm_weight_decay", "bias_weight_decay", "clip_grad_norm", "mixup_alpha", "cutmix_alpha"}) {
    EXPECT_TRUE(refused(name, "-0.5")) << name;
    EXPECT_FALSE(refused(name, "0")) << name;
  }
  EXPECT_TRUE(refused("label_smoothing", "1"));
  EXPECT_FALSE(refused("label_smoothing", "0.999"));
  EXPECT_TRUE(refused("model_ema_decay", "1.5"));
  EXPECT_FALSE(refused("model_ema_decay", "1"));
  EXPECT_TRUE(refused("val_crop_size", "-1"));
  EXPECT_TRUE(refused("precision", "fp8"));
  EXPECT_TRUE(refused("distributed", "maybe"));
  EXPECT_TRUE(refused("dist_backend", "mpi"));
  EXPECT_EQ(refusal({{"precision", std::string("fp8")}}), "`precision` must be fp32, bf16 or fp16, not 'fp8'");
}

TEST(TrainOptionSchema, RowsSetTheFields) {
  TrainOptions o;
  schema().apply(o, {{"devices", std::string("0,cuda:1")},
                     {"dist_timeout", 60.0},
                     {"bucket_mb", int64_t{50}},
                     {"cudnn_benchmark", false},
                     {"norm_weight_decay", 0.0},
                     {"precision", std::string("bf16")},
                     {"distributed", std::string("off")},
                     {"dist_backend", std::string("gloo")},
                     {"loss_scale_init", 1024.0},
                     {"checkpoint", std::string("final.pt")},
                     {"metrics", std::string("m.jsonl")}});
  EXPECT_EQ(o.dp_devices, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  EXPECT_EQ(o.dist_timeout_s, 60.0);
  EXPECT_EQ(o.ddp_bucket_mb, 50);
  EXPECT_FALSE(o.cudnn_benchmark);
  EXPECT_EQ(o.norm_weight_decay, std::optional<double>(0.0));
  EXPECT_FALSE(o.bias_weight_decay.has_value());
  EXPECT_EQ(o.precision, gpufeed::harness::Precision::kBFloat16);
  EXPECT_EQ(o.distributed, gpufeed::harness::DistributedMode::kOff);
  EXPECT_EQ(o.dist_backend, gpufeed::harness::DistBackend::kGloo);
  EXPECT_EQ(o.grad_scaler.init_scale, 1024.0);
  EXPECT_EQ(o.checkpoint, std::optional<std::filesystem::path>("final.pt"));
  EXPECT_EQ(o.profile.metrics_path, std::optional<std::filesystem::path>("m.jsonl"));
  EXPECT_FALSE(o.resume.has_value());
}

// Each rule check_options kept in the Trainer, now TrainOptions::validate (run by the schema's
// finisher and by the Trainer's constructor), refusing with the Trainer's message.
TEST(TrainOptionSchema, TheFinisherRefusesWhatTheTrainerRefused) {
  EXPECT_EQ(refusal({{"sync_bn", true}, {"freeze_bn", true}}),
            "Trainer: `sync_bn` and `freeze_bn` do not combine: frozen BatchNorm uses its running statistics, so "
            "there are no batch statistics to synchronise");
  EXPECT_EQ(refusal({{"sync_bn", true}, {"devices", std::string("0,1")}}),
            "Trainer: `sync_bn` (SyncBatchNorm) needs one process per device (gpufeed launch, torchrun or srun); "
            "it does not combine with DataParallel (`devices`)");
  EXPECT_EQ(refusal({{"activation_checkpointing", true}, {"devices", std::string("0")}}),
            "Trainer: `activation_checkpointing` does not combine with DataParallel (`devices`): use one process "
            "per device (gpufeed launch, torchrun or srun)");
  EXPECT_EQ(refusal({{"init_weights_skip_mismatched", true}}),
            "Trainer: init_weights_exclude / init_weights_skip_mismatched without init_weights");
  EXPECT_EQ(refusal({{"init_weights_skip_mismatched", true}, {"init_weights", std::string("w.pt")}}), "");
  EXPECT_EQ(refusal({{"val_resize_size", int64_t{200}}}),  // below the crop, image_size 224
            "Trainer: val_resize_size must be >= val_crop_size (0 = derived), got 200 and 0");
  EXPECT_EQ(refusal({{"val_resize_size", int64_t{200}}, {"val_crop_size", int64_t{176}}}), "");
  EXPECT_EQ(refusal({{"max_steps_per_epoch", int64_t{-1}}}),
            "Trainer: max_steps_per_epoch must be >= 0 (0 = whole epoch)");
  EXPECT_EQ(refusal({{"lr", -0.5}}), "Trainer: lr must be finite and >= 0, got -0.500000");
  EXPECT_EQ(refusal({{"momentum", -1.0}}), "Trainer: momentum must be finite and >= 0");
  EXPECT_EQ(refusal({{"weight_decay", -1.0}}), "Trainer: weight_decay must be finite and >= 0");
  TrainOptions batch_of_one;
  batch_of_one.loader.batch_size = 1;
  EXPECT_EQ(refusal({}, batch_of_one),
            "Trainer: batch_size 1 cannot train BatchNorm (PyTorch: \"Expected more than 1 value per channel when "
            "training\"); use a larger batch or `freeze_bn`");
  EXPECT_EQ(refusal({{"freeze_bn", true}}, batch_of_one), "");
}

// The rules outside the rows' ranges (a struct filled in C++, not through the schema).
TEST(TrainOptionSchema, ValidateRefusesWhatTheTrainerRefused) {
  TrainOptions o;
  EXPECT_EQ(validate_refusal(o), "");
  o.epochs = 0;
  EXPECT_EQ(validate_refusal(o), "Trainer: epochs, batch_size and accum_steps must be >= 1, image_size >= 8");
  o = {};
  o.label_smoothing = 1;
  EXPECT_EQ(validate_refusal(o), "Trainer: label_smoothing must be in [0, 1)");
  o = {};
  o.clip_grad_norm = -2;
  EXPECT_EQ(validate_refusal(o), "Trainer: clip_grad_norm must be finite and >= 0 (0 = off), got -2");
  o = {};
  o.cutmix_alpha = -1;
  EXPECT_EQ(validate_refusal(o), "Trainer: mixup_alpha and cutmix_alpha must be finite and >= 0 (0 = off)");
  o = {};
  o.model_ema = true;
  o.model_ema_decay = 1.5;
  EXPECT_EQ(validate_refusal(o), "Trainer: model_ema_steps must be >= 1 and model_ema_decay in [0, 1], got 32 and 1.5");
  o = {};
  o.ra_sampler = true;
  o.ra_reps = 0;
  EXPECT_EQ(validate_refusal(o), "Trainer: ra_reps must be >= 1, got 0");
  o = {};
  o.norm_weight_decay = -1;
  EXPECT_EQ(validate_refusal(o), "Trainer: norm_weight_decay must be finite and >= 0");
  o = {};
  o.schedule.resolution = gpufeed::harness::ResolutionSchedule{.min_res = 4, .max_res = 4, .start_ramp = 0, .end_ramp = 0};
  EXPECT_EQ(validate_refusal(o),
            "Trainer: progressive resizing gives epoch 0 (0-based) an image size of 4 (FFCV's get_resolution: "
            "min_res 4, max_res 4, rounded to multiples of 32 inside the ramp); sizes must be >= 8");
}

}  // namespace
