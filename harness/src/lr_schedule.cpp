#include "gpufeed/harness/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

namespace gpufeed::harness {
namespace {

// OneCycleLR._annealing_cos / _annealing_linear, same arithmetic order.
// numpy.interp for increasing xs, same arithmetic: slope * (x - xs[j]) + ys[j] on the segment
// with xs[j] <= x < xs[j + 1]; ys[0] left of xs[0], ys.back() from xs.back() on.
double np_interp(double x, const std::vector<double>& xs, const std::vector<double>& ys) {
  if (x < xs.front()) return ys.front();
  if (x >= xs.back()) return ys.back();
  size_t j = 0;
  while (j + 2 < xs.size() && x >= xs[j + 1]) ++j;
  const double slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]);
  return slope * (x - xs[j]) + ys[j];
}

double anneal(AnnealStrategy s, double start, double end, double pct) {
  if (s == AnnealStrategy::kCos) {
    const double cos_out = std::cos(std::numbers::pi * pct) + 1.0;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

}  // namespace

LrScheduleKind parse_lr_schedule_kind(const std::string& name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "step") return LrScheduleKind::kStep;
  if (name == "multistep") return LrScheduleKind::kMultiStep;
  if (name == "cosine") return LrScheduleKind::kCosine;
  if (name == "onecycle") return LrScheduleKind::kOneCycle;
  if (name == "triangular") return LrScheduleKind::kTriangular;
  throw std::invalid_argument("unknown LR schedule '" + name +
                              "' (known: constant, step, multistep, cosine, onecycle, triangular)");
}

std::string lr_schedule_kind_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kStep:
      return "step";
    case LrScheduleKind::kMultiStep:
      return "multistep";
    case LrScheduleKind::kCosine:
      return "cosine";
    case LrScheduleKind::kOneCycle:
      return "onecycle";
    case LrScheduleKind::kTriangular:
      return "triangular";
  }
  return "?";
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  const auto bad = [&](const std::string& why) {
    throw std::invalid_argument("LrSchedule (" + lr_schedule_kind_name(o.kind) + "): " + why);
  };
  const auto num = [](double v) { return std::to_string(v); };
  if (o.warmup_steps < 0 || o.total_steps <= o.warmup_steps) {
    bad("need 0 <= warmup_steps < total_steps, got warmup " + std::to_string(o.warmup_steps) +
        ", total " + std::to_string(o.total_steps) + " optimizer steps");
  }
  if (!std::isfinite(o.base_lr) || o.base_lr < 0) bad("the learning rate must be finite and >= 0, got " + num(o.base_lr));
  // torch.optim.lr_scheduler.LinearLR: "Starting multiplicative factor expected to be greater
  // than 0 and less or equal to 1."
  if (o.warmup_steps > 0 && !(o.warmup_start_factor > 0 && o.warmup_start_factor <= 1)) {
    bad("warmup_start_factor must be in (0, 1] (LinearLR's start_factor), got " + num(o.warmup_start_factor));
  }
  switch (o.kind) {
    case LrScheduleKind::kConstant:
      break;
    case LrScheduleKind::kStep:
    case LrScheduleKind::kMultiStep:
      // StepLR divides by step_size (ZeroDivisionError at its first step with 0).
      if (o.kind == LrScheduleKind::kStep && o.step_size < 1) bad("step_size must be >= 1, got " + std::to_string(o.step_size));
      if (!std::is_sorted(o.milestones.begin(), o.milestones.end())) bad("milestones must be ascending");
      if (!std::isfinite(o.gamma) || o.gamma < 0) bad("gamma must be finite and >= 0, got " + num(o.gamma));
      break;
    case LrScheduleKind::kCosine:
      if (!std::isfinite(o.min_lr) || o.min_lr < 0) bad("min_lr must be finite and >= 0, got " + num(o.min_lr));
      break;
    case LrScheduleKind::kTriangular: {
      if (o.warmup_steps > 0) bad("no warmup: the triangular schedule ramps up to its peak by itself (peak_epoch)");
      if (o.steps_per_epoch < 1 || o.total_steps % o.steps_per_epoch != 0) {
        bad("steps_per_epoch must be >= 1 and divide total_steps, got " + std::to_string(o.steps_per_epoch) + " and " +
            std::to_string(o.total_steps));
      }
      const double epochs = static_cast<double>(o.total_steps / o.steps_per_epoch);
      if (!(o.peak_epoch > 0 && o.peak_epoch <= epochs)) {
        bad("peak_epoch must be in (0, epochs = " + num(epochs) + "], got " + num(o.peak_epoch));
      }
      break;
    }
    case LrScheduleKind::kOneCycle: {
      // OneCycleLR's own ValueError, then what makes its arithmetic divide by zero or overflow.
      if (!(o.pct_start >= 0 && o.pct_start <= 1)) bad("pct_start must be in [0, 1], got " + num(o.pct_start));
      if (!std::isfinite(o.div_factor) || o.div_factor <= 0 || !std::isfinite(o.final_div_factor) ||
          o.final_div_factor <= 0) {
        bad("div_factor and final_div_factor must be finite and > 0, got " + num(o.div_factor) + " and " +
            num(o.final_div_factor));
      }
      if (!std::isfinite(o.base_momentum) || !std::isfinite(o.max_momentum)) bad("momenta must be finite");
      // OneCycleLR computes pct = (step - start) / (end - start) within the phase holding the
      // step, for steps 0 .. T (the scheduler.step() after the last optimizer step included).
      // A phase of zero width holding one of those steps divides by zero: torch raises
      // ZeroDivisionError. That is phase 1 when pct_start * T == 1 (it holds step 0), and the
      // last phase when it starts at T - 1 (it holds step T): pct_start == 1, or with
      // three_phase 2 * pct_start * T - 2 == T - 1.
      const int64_t total = o.total_steps - o.warmup_steps;
      const auto ends = onecycle_phase_ends();
      const double t = static_cast<double>(total);
      const std::string setup = "pct_start " + num(o.pct_start) + " x " + std::to_string(total) +
                                " steps" + (o.warmup_steps > 0 ? " (after the warmup)" : "") +
                                (o.three_phase ? ", three_phase" : "");
      if (ends[0] == 0.0) {
        bad("the warm-up phase has zero width (" + setup +
            " = 1 step): torch.optim.lr_scheduler.OneCycleLR divides by zero at step 0 "
            "(ZeroDivisionError) and the learning rate would be NaN; change pct_start or the number "
            "of steps");
      }
      if (ends[ends.size() - 2] == t - 1) {
        bad("the last phase has zero width (" + setup +
            "): torch.optim.lr_scheduler.OneCycleLR divides by zero when stepped after the last "
            "step (ZeroDivisionError); use pct_start < " + (o.three_phase ? "(T + 1) / (2 T)" : std::string("1")));
      }
      break;
    }
  }
}

std::vector<double> LrSchedule::onecycle_phase_ends() const {
  const auto& o = options_;
  const double t = static_cast<double>(o.total_steps - o.warmup_steps);
  // OneCycleLR's _schedule_phases[i]["end_step"], same arithmetic.
  if (o.three_phase) return {o.pct_start * t - 1, 2 * o.pct_start * t - 2, t - 1};
  return {o.pct_start * t - 1, t - 1};
}

double LrSchedule::onecycle(int64_t k, bool want_momentum) const {
  const auto& o = options_;
  const int64_t total = o.total_steps - o.warmup_steps;
  const double initial_lr = o.base_lr / o.div_factor;
  const double min_lr = initial_lr / o.final_div_factor;
  struct Phase {
    double end_step, start_lr, end_lr, start_m, end_m;
  };
  std::vector<Phase> phases;
  const std::vector<double> e = onecycle_phase_ends();
  if (o.three_phase) {
    phases = {{e[0], initial_lr, o.base_lr, o.max_momentum, o.base_momentum},
              {e[1], o.base_lr, initial_lr, o.base_momentum, o.max_momentum},
              {e[2], initial_lr, min_lr, o.max_momentum, o.max_momentum}};
  } else {
    phases = {{e[0], initial_lr, o.base_lr, o.max_momentum, o.base_momentum},
              {e[1], o.base_lr, min_lr, o.base_momentum, o.max_momentum}};
  }
  const double step_num = static_cast<double>(std::min(k, total - 1));
  double start_step = 0.0;
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& p = phases[i];
    if (step_num <= p.end_step || i + 1 == phases.size()) {
      const double pct = (step_num - start_step) / (p.end_step - start_step);
      return want_momentum ? anneal(o.anneal, p.start_m, p.end_m, pct)
                           : anneal(o.anneal, p.start_lr, p.end_lr, pct);
    }
    start_step = p.end_step;
  }
  return 0.0;  // unreachable: the last phase always answers
}

double LrSchedule::main_lr(int64_t k) const {
  const auto& o = options_;
  const int64_t span = o.total_steps - o.warmup_steps;
  switch (o.kind) {
    case LrScheduleKind::kConstant:
      return o.base_lr;
    case LrScheduleKind::kStep:
      return o.base_lr * std::pow(o.gamma, static_cast<double>(k / o.step_size));
    case LrScheduleKind::kMultiStep: {
      const auto passed =
          std::upper_bound(o.milestones.begin(), o.milestones.end(), k) - o.milestones.begin();
      return o.base_lr * std::pow(o.gamma, static_cast<double>(passed));
    }
    case LrScheduleKind::kCosine: {
      const double t = static_cast<double>(std::min(k, span)) / static_cast<double>(span);
      return o.min_lr + (o.base_lr - o.min_lr) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
    }
    case LrScheduleKind::kOneCycle:
      return onecycle(k, /*momentum=*/false);
    case LrScheduleKind::kTriangular: {
      // FFCV: lr_start, lr_end = get_lr(epoch), get_lr(epoch + 1);
      // lrs = np.interp(np.arange(iters), [0, iters], [lr_start, lr_end]).
      const double epochs = static_cast<double>(o.total_steps / o.steps_per_epoch);
      const std::vector<double> xs{0.0, o.peak_epoch, epochs}, ys{1e-4 * o.base_lr, o.base_lr, 0.0};
      const int64_t e = k / o.steps_per_epoch, i = k % o.steps_per_epoch;
      const double start = np_interp(static_cast<double>(e), xs, ys), end = np_interp(static_cast<double>(e + 1), xs, ys);
      return np_interp(static_cast<double>(i), {0.0, static_cast<double>(o.steps_per_epoch)}, {start, end});
    }
  }
  return o.base_lr;
}

double LrSchedule::lr(int64_t step) const {
  const auto& o = options_;
  step = std::clamp<int64_t>(step, 0, o.total_steps - 1);
  if (step < o.warmup_steps) {
    // LinearLR warms up towards the main schedule's own first rate.
    const double target =
        o.kind == LrScheduleKind::kOneCycle ? o.base_lr / o.div_factor : o.base_lr;
    const double t = static_cast<double>(step) / static_cast<double>(o.warmup_steps);
    return target * (o.warmup_start_factor + (1.0 - o.warmup_start_factor) * t);
  }
  return main_lr(step - o.warmup_steps);
}

std::optional<double> LrSchedule::momentum(int64_t step) const {
  const auto& o = options_;
  if (o.kind != LrScheduleKind::kOneCycle || !o.cycle_momentum) return std::nullopt;
  step = std::clamp<int64_t>(step, 0, o.total_steps - 1);
  if (step < o.warmup_steps) return o.max_momentum;
  return onecycle(step - o.warmup_steps, /*momentum=*/true);
}

}  // namespace gpufeed::harness
