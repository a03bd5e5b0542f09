#pragma once
// The training schedule's options: the learning-rate schedule in epochs (lr_schedule.h turns it
// into a per-step plan) and FFCV's progressive resizing (the train crop side per epoch). Each
// user-facing field is one row of schedule_options_schema() (gpufeed/option.h), the one
// declaration `gpufeed train`'s flags (--lr-schedule, --warmup-epochs, --min-res, ...), their
// help, defaults and checks come from. No torch.

#include <cstdint>
#include <optional>
#include <vector>

#include "gpufeed/harness/lr_schedule.h"
#include "gpufeed/option.h"

namespace gpufeed::harness {

/// FFCV's progressive resizing: the ImageNet example's train crop size per epoch
/// (ffcv-imagenet train_imagenet.py, config section "resolution": min_res, max_res, start_ramp,
/// end_ramp; its rn50 configs, e.g. rn50_88_epochs.yaml, ramp 160 -> 192 over epochs 65 -> 76).
struct ResolutionSchedule {
  int min_res = 160;         ///< side before and at start_ramp, pixels (>= 1)
  int max_res = 192;         ///< side from end_ramp on, pixels (>= min_res, as FFCV asserts)
  int64_t start_ramp = 0;    ///< last epoch at min_res, 0-based (FFCV's default 0), >= 0
  int64_t end_ramp = 0;      ///< first epoch at max_res, 0-based, >= start_ramp
  /// Throws options::OptionError (std::invalid_argument) naming the option (`max_res`), its
  /// value and the accepted range.
  void validate() const;
};

/// FFCV's get_resolution(epoch) for a 0-based epoch: min_res for epoch <= start_ramp, max_res
/// for epoch >= end_ramp, between them np.interp(epoch, [start_ramp, end_ramp], [min_res,
/// max_res]) (slope (max - min) / (end - start) times (epoch - start) plus min, in double) rounded
/// to the NEAREST multiple of 32 with numpy's round (half to even: 176 -> 192, 208 -> 192):
/// int(np.round(res / 32)) * 32. So inside the ramp the side can fall outside [min_res,
/// max_res] when they are not multiples of 32 (160 -> 180: 176 -> 192), and to 0 for sides
/// below 16. Pure; does not validate (validate() does). tests/test_recipe.cpp compares it with
/// tests/goldens/gen_recipe.py's numpy rendering of the formula.
int get_resolution(const ResolutionSchedule& schedule, int64_t epoch);

/// The schedule of a training run, in epochs (the trainer turns epochs into optimizer steps:
/// Trainer's plan, LrScheduleOptions). Defaults: torchvision's ImageNet reference (cosine, no
/// warmup) and torch.optim.lr_scheduler's own parameter defaults.
struct ScheduleOptions {
  LrScheduleKind lr_schedule = LrScheduleKind::kCosine;  ///< the main schedule after the warmup
  double warmup_epochs = 0;          ///< linear warmup length, epochs (fractions allowed); 0 = none
  double warmup_start_factor = 0.1;  ///< LinearLR's start_factor, in (0, 1]
  double lr_step_epochs = 30;        ///< kStep: decay every this many epochs (after the warmup)
  std::vector<double> lr_milestones; ///< kMultiStep: epochs (after the warmup) at which to decay
  double lr_gamma = 0.1;             ///< kStep, kMultiStep: decay factor
  double min_lr = 0.0;               ///< kCosine: floor (absolute, not batch-scaled)
  double onecycle_pct_start = 0.3;   ///< kOneCycle: fraction of the cycle spent increasing the rate
  double onecycle_div_factor = 25.0;          ///< kOneCycle: initial lr = scaled lr / this
  double onecycle_final_div_factor = 1e4;     ///< kOneCycle: final lr = initial lr / this
  double lr_peak_epoch = 2;          ///< kTriangular: epoch of the peak (FFCV's lr.lr_peak_epoch)
  /// Progressive resizing (FFCV's; get_resolution): epoch e (0-based) trains at
  /// get_resolution(*resolution, e). Unset: the loader's image_size every epoch. Its options
  /// (min_res, max_res, end_ramp, and start_ramp, default 0) are given together or not at all.
  std::optional<ResolutionSchedule> resolution;
};

/// The rows of ScheduleOptions: lr_schedule (constant, step, multistep, cosine, onecycle,
/// triangular), warmup_epochs, warmup_start_factor, lr_step_epochs, lr_milestones, lr_gamma,
/// min_lr, onecycle_pct_start, onecycle_div_factor, onecycle_final_div_factor, lr_peak_epoch,
/// min_res, max_res, start_ramp, end_ramp. Its finisher refuses part of the progressive-resizing
/// group (options::OptionError naming the missing options) and validates the resolution schedule.
const options::Schema<ScheduleOptions>& schedule_options_schema();

}  // namespace gpufeed::harness
