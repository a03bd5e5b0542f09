#include "gpufeed/harness/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace gpufeed::harness {

double WarmupCosineSchedule::lr(int64_t step) const {
  if (step < warmup_steps) {
    const double t = static_cast<double>(step) / static_cast<double>(warmup_steps);
    return base_lr * (start_factor + (1.0 - start_factor) * t);
  }
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
  if (step - warmup_steps >= span) return min_lr;
  const double t = static_cast<double>(step - warmup_steps) / static_cast<double>(span);
  return min_lr + (base_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
}

}  // namespace gpufeed::harness
