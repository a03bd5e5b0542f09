#include "gpufeed/harness/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace gpufeed::harness {
namespace {

// OneCycleLR._annealing_cos / _annealing_linear, same arithmetic order.
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
  throw std::invalid_argument("unknown LR schedule '" + name +
                              "' (known: constant, step, multistep, cosine, onecycle)");
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
  }
  return "?";
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  if (o.warmup_steps < 0 || o.total_steps <= o.warmup_steps) {
    throw std::invalid_argument("LrSchedule: need 0 <= warmup_steps < total_steps, got warmup " +
                                std::to_string(o.warmup_steps) + ", total " +
                                std::to_string(o.total_steps));
  }
  if (o.step_size < 1) throw std::invalid_argument("LrSchedule: step_size must be >= 1");
  if (!std::is_sorted(o.milestones.begin(), o.milestones.end())) {
    throw std::invalid_argument("LrSchedule: milestones must be ascending");
  }
  if (o.pct_start < 0 || o.pct_start > 1) {
    throw std::invalid_argument("LrSchedule: pct_start must be in [0, 1]");
  }
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
  const double t = static_cast<double>(total);
  if (o.three_phase) {
    phases = {{o.pct_start * t - 1, initial_lr, o.base_lr, o.max_momentum, o.base_momentum},
              {2 * o.pct_start * t - 2, o.base_lr, initial_lr, o.base_momentum, o.max_momentum},
              {t - 1, initial_lr, min_lr, o.max_momentum, o.max_momentum}};
  } else {
    phases = {{o.pct_start * t - 1, initial_lr, o.base_lr, o.max_momentum, o.base_momentum},
              {t - 1, o.base_lr, min_lr, o.base_momentum, o.max_momentum}};
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
