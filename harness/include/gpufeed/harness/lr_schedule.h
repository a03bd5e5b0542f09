#pragma once
#include <cstdint>

namespace gpufeed::harness {

/// Cosine annealing with a linear warmup, stepped once per optimizer step. Equivalent to
/// torch.optim.lr_scheduler.SequentialLR([LinearLR(start_factor, total_iters=warmup_steps),
/// CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min=min_lr)], milestones=[warmup_steps])
/// evaluated in closed form:
///   step < warmup:  base_lr * (start_factor + (1 - start_factor) * step / warmup)
///   otherwise:      min_lr + (base_lr - min_lr) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2
struct WarmupCosineSchedule {
  double base_lr = 0.1;        ///< learning rate after warmup (already batch-scaled)
  int64_t warmup_steps = 0;    ///< linear warmup length, optimizer steps
  int64_t total_steps = 1;     ///< whole run, optimizer steps (> warmup_steps)
  double start_factor = 0.1;   ///< warmup starts at base_lr * start_factor
  double min_lr = 0.0;         ///< floor of the cosine

  /// Learning rate for optimizer step `step` (0-based). Steps past total_steps return min_lr.
  double lr(int64_t step) const;
};

}  // namespace gpufeed::harness
