#pragma once
// Learning-rate schedules, stepped once per optimizer step, as closed-form functions of the step
// number (so a resumed run needs only the step to be where it was).
//
// Each one gives the per-step learning rates (and, for OneCycle, momenta) that
// torch.optim.lr_scheduler gives when its scheduler is stepped once per optimizer step. With a
// warmup, the reference is torch's own composition:
//   SequentialLR(opt, [LinearLR(opt, start_factor=warmup_start_factor, total_iters=warmup_steps),
//                      MAIN], milestones=[warmup_steps])
// so the main schedule starts counting at the end of the warmup: its length is
// total_steps - warmup_steps, and step sizes and milestones count from the end of the warmup.
// tests/test_harness.cpp compares every kind, with and without warmup, with the venv's PyTorch
// (tests/goldens/gen_schedule.py).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpufeed::harness {

/// The main schedule after the (optional) warmup.
enum class LrScheduleKind {
  kConstant,   ///< base_lr throughout (torch: no scheduler, or LinearLR warmup alone)
  kStep,       ///< torch.optim.lr_scheduler.StepLR(step_size, gamma)
  kMultiStep,  ///< torch.optim.lr_scheduler.MultiStepLR(milestones, gamma)
  kCosine,    ///< torch.optim.lr_scheduler.CosineAnnealingLR(T_max = main length, eta_min = min_lr)
  kOneCycle,  ///< torch.optim.lr_scheduler.OneCycleLR(max_lr = base_lr, total_steps = main length)
  /// FFCV's ImageNet "cyclic" (triangular) schedule (ffcv-imagenet train_imagenet.py,
  /// get_cyclic_lr): per epoch e, L(e) = np.interp(e, [0, peak_epoch, epochs],
  /// [1e-4 base_lr, base_lr, 0]); step i of epoch e (of steps_per_epoch) gets
  /// np.interp(i, [0, steps_per_epoch], [L(e), L(e + 1)]). No warmup (it ramps up by itself).
  kTriangular,
};

/// How OneCycle moves between its phase endpoints (torch's `anneal_strategy`).
enum class AnnealStrategy {
  kCos,     ///< "cos": end + (start - end) * (1 + cos(pi * pct)) / 2
  kLinear,  ///< "linear": start + (end - start) * pct
};

/// A schedule's parameters; the defaults are torch's.
struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  /// The optimizer's learning rate (already batch-scaled); OneCycle's max_lr.
  double base_lr = 0.1;
  /// Optimizer steps in the whole run, warmup included; > warmup_steps.
  int64_t total_steps = 1;

  /// Linear warmup length in optimizer steps (0: none). LinearLR semantics: step k < warmup has
  /// lr = L * (f + (1 - f) * k / warmup), where L is the main schedule's first learning rate
  /// (base_lr, or base_lr / div_factor for OneCycle) and f = warmup_start_factor.
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0.1;  ///< LinearLR's start_factor, in (0, 1]

  /// kStep: multiply by gamma every step_size steps (after the warmup). >= 1.
  int64_t step_size = 1;
  /// kMultiStep: multiply by gamma at each of these steps (counted after the warmup), ascending.
  std::vector<int64_t> milestones;
  /// kStep, kMultiStep: the decay factor.
  double gamma = 0.1;

  /// kCosine: eta_min, the floor reached at total_steps.
  double min_lr = 0.0;

  /// kOneCycle: fraction of the cycle spent increasing the learning rate, in [0, 1].
  double pct_start = 0.3;
  /// kOneCycle: initial_lr = base_lr / div_factor.
  double div_factor = 25.0;
  /// kOneCycle: min_lr = initial_lr / final_div_factor (reached at the last step).
  double final_div_factor = 1e4;
  /// kOneCycle: cosine or linear annealing between phase endpoints.
  AnnealStrategy anneal = AnnealStrategy::kCos;
  /// kOneCycle: torch's three_phase (up, back down to initial_lr, then annihilate).
  bool three_phase = false;
  /// kOneCycle: cycle momentum inversely to the learning rate between base_momentum and
  /// max_momentum (torch's cycle_momentum; momentum() returns the values).
  bool cycle_momentum = true;
  double base_momentum = 0.85;  ///< kOneCycle: momentum at the peak learning rate
  double max_momentum = 0.95;   ///< kOneCycle: momentum at the start and end of the cycle

  /// kTriangular: optimizer steps per epoch (total_steps must be a multiple of it), >= 1.
  int64_t steps_per_epoch = 1;
  /// kTriangular: the epoch at which the rate peaks (FFCV's lr_peak_epoch), in (0, epochs].
  double peak_epoch = 2;
};

/// Parses "constant", "step", "multistep", "cosine", "onecycle" or "triangular". Throws std::invalid_argument
/// naming the value and listing the known ones.
LrScheduleKind parse_lr_schedule_kind(const std::string& name);
/// The name parse_lr_schedule_kind accepts for `kind`.
std::string lr_schedule_kind_name(LrScheduleKind kind);

/// A schedule: per-step learning rate (and OneCycle's momentum) in closed form.
class LrSchedule {
 public:
  /// Validates the whole plan up front, so every step's rate is finite. Throws
  /// std::invalid_argument naming the schedule and the value for: total_steps <= warmup_steps,
  /// warmup_steps < 0, a non-finite or negative base_lr; warmup_start_factor outside (0, 1]
  /// (LinearLR's check); kStep: step_size < 1 (StepLR divides by it); kStep/kMultiStep:
  /// unsorted milestones, gamma not finite or < 0; kCosine: min_lr not finite or < 0;
  /// kOneCycle: pct_start outside [0, 1], div factors not finite or <= 0, and a phase of zero
  /// width that holds a step (pct_start x steps == 1, pct_start == 1, three_phase with
  /// 2 pct_start x steps - 2 == steps - 1), where torch's OneCycleLR raises ZeroDivisionError;
  /// kTriangular: a warmup, steps_per_epoch < 1 or not dividing total_steps, peak_epoch outside
  /// (0, epochs].
  explicit LrSchedule(LrScheduleOptions options);

  /// Learning rate for optimizer step `step` (0-based: the rate used by the step-th call of
  /// optimizer.step()). Steps past the end keep the last step's rate; negative steps are 0.
  double lr(int64_t step) const;

  /// OneCycle with cycle_momentum: the momentum torch's OneCycleLR sets for `step` (during the
  /// warmup, max_momentum). Otherwise std::nullopt: the optimizer's momentum is left alone.
  std::optional<double> momentum(int64_t step) const;

  /// The options in force.
  const LrScheduleOptions& options() const { return options_; }

 private:
  double main_lr(int64_t k) const;  // k counted from the end of the warmup
  double onecycle(int64_t k, bool momentum) const;
  std::vector<double> onecycle_phase_ends() const;  // OneCycleLR's end_step per phase

  LrScheduleOptions options_;
};

}  // namespace gpufeed::harness
