// The training schedule's option rows (schedule_options.h) and FFCV's progressive resizing.
#include "gpufeed/harness/schedule_options.h"

// The rows name only the Spec fields they set (designated initialisers); the rest keep their
// defaults on purpose, which GCC's -Wextra would report one by one.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <cmath>
#include <set>
#include <string>

namespace gpufeed::harness {
namespace {

using options::OptionError;
using options::Schema;
using options::Type;
using options::Value;

// The progressive-resizing options: given together (start_ramp may be left at its default).
constexpr const char* kRampOptions[] = {"min_res", "max_res", "end_ramp"};

ResolutionSchedule& resolution(ScheduleOptions& o) {
  if (!o.resolution) o.resolution.emplace();
  return *o.resolution;
}

// A progressive-resizing row: an int field of ResolutionSchedule, unset (0 as a value) without
// the schedule.
template <class M>
void ramp_row(Schema<ScheduleOptions>& s, options::Spec spec, M ResolutionSchedule::*field) {
  s.add(std::move(spec), [field](ScheduleOptions& o, const Value& v) {
          resolution(o).*field = static_cast<M>(std::get<int64_t>(v));
        },
        [field](const ScheduleOptions& o) -> Value {
          return static_cast<int64_t>(o.resolution ? (*o.resolution).*field : M{});
        });
}

// Every row sets its option; then the group checks (the ramp given whole, the resolution valid).
void finish_schedule(ScheduleOptions& o, const std::set<std::string>& given) {
  std::string first_given, missing;
  for (const char* name : {"min_res", "max_res", "end_ramp", "start_ramp"}) {
    if (given.count(name) != 0 && first_given.empty()) first_given = name;
  }
  for (const char* name : kRampOptions) {
    if (given.count(name) == 0) missing += std::string(missing.empty() ? "" : ", ") + "`" + name + "`";
  }
  if (!first_given.empty() && !missing.empty()) {
    throw OptionError(first_given, "is one of progressive resizing's options, which needs `min_res`, `max_res` "
                                   "and `end_ramp` together (`start_ramp` defaults to 0); missing: " + missing);
  }
  if (o.resolution) o.resolution->validate();
}

Schema<ScheduleOptions> make_schedule_schema() {
  Schema<ScheduleOptions> s;
  s.add({.name = "lr_schedule", .type = Type::kChoice,
         .help = "the learning-rate schedule after the warmup, stepped per optimizer step: torch.optim.lr_scheduler's "
                 "constant, StepLR, MultiStepLR, CosineAnnealingLR, OneCycleLR, or FFCV's triangular",
         .words = {"constant", "step", "multistep", "cosine", "onecycle", "triangular"}},
        [](ScheduleOptions& o, const Value& v) { o.lr_schedule = parse_lr_schedule_kind(std::get<std::string>(v)); },
        [](const ScheduleOptions& o) -> Value { return lr_schedule_kind_name(o.lr_schedule); });
  s.member({.name = "lr_peak_epoch", .type = Type::kFloat,
            .help = "triangular: the epoch of the peak (FFCV's lr_peak_epoch)", .unit = "epochs", .min = 0},
           &ScheduleOptions::lr_peak_epoch);
  s.member({.name = "warmup_epochs", .type = Type::kFloat,
            .help = "linear warmup (LinearLR, then the schedule: SequentialLR); 0 = none", .unit = "epochs", .min = 0},
           &ScheduleOptions::warmup_epochs);
  s.member({.name = "warmup_start_factor", .type = Type::kFloat,
            .help = "the warmup starts at the learning rate x this (LinearLR's start_factor; the references' "
                    "--lr-warmup-decay)",
            .min = 0, .max = 1},
           &ScheduleOptions::warmup_start_factor);
  s.member({.name = "lr_step_epochs", .type = Type::kFloat, .help = "step: decay every this many epochs (StepLR)",
            .unit = "epochs", .min = 0},
           &ScheduleOptions::lr_step_epochs);
  s.add({.name = "lr_milestones", .type = Type::kFloats,
         .help = "multistep: the epochs at which to decay, ascending, e.g. 30,60,80 (MultiStepLR)", .unit = "epochs",
         .min = 0},
        [](ScheduleOptions& o, const Value& v) { o.lr_milestones = std::get<std::vector<double>>(v); },
        [](const ScheduleOptions& o) -> Value { return o.lr_milestones; });
  s.member({.name = "lr_gamma", .type = Type::kFloat, .help = "step, multistep: the decay factor", .min = 0},
           &ScheduleOptions::lr_gamma);
  s.member({.name = "min_lr", .type = Type::kFloat, .help = "cosine: the floor (eta_min; absolute, not batch-scaled)",
            .min = 0},
           &ScheduleOptions::min_lr);
  s.member({.name = "onecycle_pct_start", .type = Type::kFloat,
            .help = "onecycle: the fraction of the cycle spent increasing the rate", .min = 0, .max = 1},
           &ScheduleOptions::onecycle_pct_start);
  s.member({.name = "onecycle_div_factor", .type = Type::kFloat,
            .help = "onecycle: the initial rate is the scaled rate / this", .min = 0},
           &ScheduleOptions::onecycle_div_factor);
  s.member({.name = "onecycle_final_div_factor", .type = Type::kFloat,
            .help = "onecycle: the final rate is the initial rate / this", .min = 0},
           &ScheduleOptions::onecycle_final_div_factor);
  // Progressive resizing, FFCV's names (its config's resolution section) and formula.
  ramp_row(s, {.name = "min_res", .type = Type::kInt,
               .help = "progressive resizing (FFCV's): the train crop side up to `start_ramp`", .unit = "pixels",
               .min = 1, .derived_default = "unset (no progressive resizing)"},
           &ResolutionSchedule::min_res);
  ramp_row(s, {.name = "max_res", .type = Type::kInt,
               .help = "progressive resizing: the side from `end_ramp` on (between them: linear, rounded to a "
                       "multiple of 32 as FFCV's get_resolution)",
               .unit = "pixels", .min = 1, .derived_default = "unset"},
           &ResolutionSchedule::max_res);
  ramp_row(s, {.name = "start_ramp", .type = Type::kInt,
               .help = "progressive resizing: the last epoch at `min_res` (0-based, FFCV's start_ramp)",
               .unit = "epochs", .min = 0},
           &ResolutionSchedule::start_ramp);
  ramp_row(s, {.name = "end_ramp", .type = Type::kInt,
               .help = "progressive resizing: the first epoch at `max_res` (0-based, FFCV's end_ramp)",
               .unit = "epochs", .min = 0, .derived_default = "unset"},
           &ResolutionSchedule::end_ramp);
  s.finish(finish_schedule);
  return s;
}

}  // namespace

void ResolutionSchedule::validate() const {
  const auto refuse = [](const char* option, const std::string& what) {
    throw OptionError(option, what + " (progressive resizing, FFCV's resolution schedule)");
  };
  if (min_res < 1) refuse("min_res", "must be >= 1, not " + std::to_string(min_res));
  if (max_res < min_res) {
    refuse("max_res", "must be >= `min_res`, not " + std::to_string(max_res) + " < " + std::to_string(min_res));
  }
  if (start_ramp < 0) refuse("start_ramp", "must be >= 0, not " + std::to_string(start_ramp));
  if (end_ramp < start_ramp) {
    refuse("end_ramp",
           "must be >= `start_ramp`, not " + std::to_string(end_ramp) + " < " + std::to_string(start_ramp));
  }
}

int get_resolution(const ResolutionSchedule& s, int64_t epoch) {
  if (epoch <= s.start_ramp) return s.min_res;
  if (epoch >= s.end_ramp) return s.max_res;
  // np.interp's arithmetic for two points, then np.round (half to even: nearbyint in the default
  // rounding mode) of res / 32.
  const double slope = static_cast<double>(s.max_res - s.min_res) / static_cast<double>(s.end_ramp - s.start_ramp);
  const double res = slope * static_cast<double>(epoch - s.start_ramp) + static_cast<double>(s.min_res);
  return static_cast<int>(std::nearbyint(res / 32.0)) * 32;
}

const options::Schema<ScheduleOptions>& schedule_options_schema() {
  return options::made_once<make_schedule_schema>();
}

}  // namespace gpufeed::harness
