"""Per-step learning rates from torch.optim.lr_scheduler, for the C++ WarmupCosineSchedule."""
import json
import pathlib

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR


def make(out: pathlib.Path) -> None:
    cases = []
    for base_lr, warmup, total, start, eta_min in [(0.1, 5, 50, 0.1, 0.0), (0.4, 0, 30, 0.1, 0.0),
                                                   (0.05, 10, 11, 0.25, 0.001), (1.0, 3, 200, 0.01, 0.0)]:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=base_lr)
        cos = CosineAnnealingLR(opt, T_max=total - warmup, eta_min=eta_min)
        if warmup > 0:
            sched = SequentialLR(opt, [LinearLR(opt, start_factor=start, total_iters=warmup), cos],
                                 milestones=[warmup])
        else:
            sched = cos
        lrs = []
        for _ in range(total):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        cases.append({"base_lr": base_lr, "warmup": warmup, "total": total, "start_factor": start,
                      "min_lr": eta_min, "lrs": lrs})
    (out / "schedule.json").write_text(json.dumps(cases))
