"""Per-step learning rates (and OneCycle momenta) from torch.optim.lr_scheduler, for the C++
LrSchedule: every kind, with and without a LinearLR warmup composed through SequentialLR, stepped
once per optimizer step. Writes schedule.json: a list of cases, each with the C++ options and the
rates (and momenta) torch's optimizer saw at steps 0 .. total-1."""
import json
import pathlib

import torch
from torch.optim.lr_scheduler import (ConstantLR, CosineAnnealingLR, LinearLR, MultiStepLR,
                                      OneCycleLR, SequentialLR, StepLR)


def run(case: dict) -> dict:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=case["base_lr"], momentum=0.9)
    total, warmup = case["total"], case["warmup"]
    main_len = total - warmup
    kind = case["kind"]
    if kind == "constant":
        main = ConstantLR(opt, factor=1.0, total_iters=0)
    elif kind == "step":
        main = StepLR(opt, step_size=case["step_size"], gamma=case["gamma"])
    elif kind == "multistep":
        main = MultiStepLR(opt, milestones=case["milestones"], gamma=case["gamma"])
    elif kind == "cosine":
        main = CosineAnnealingLR(opt, T_max=main_len, eta_min=case["min_lr"])
    elif kind == "onecycle":
        main = OneCycleLR(opt, max_lr=case["base_lr"], total_steps=main_len,
                          pct_start=case["pct_start"], anneal_strategy=case["anneal"],
                          div_factor=case["div_factor"], final_div_factor=case["final_div_factor"],
                          three_phase=case["three_phase"])
    else:
        raise ValueError(kind)
    if warmup > 0:
        sched = SequentialLR(opt, [LinearLR(opt, start_factor=case["start_factor"],
                                            total_iters=warmup), main], milestones=[warmup])
    else:
        sched = main
    lrs, momenta = [], []
    for _ in range(total):
        lrs.append(opt.param_groups[0]["lr"])
        momenta.append(opt.param_groups[0]["momentum"])
        opt.step()
        sched.step()
    out = dict(case)
    out["lrs"] = lrs
    if kind == "onecycle":
        out["momenta"] = momenta
    return out


def make(out: pathlib.Path) -> None:
    base = {"start_factor": 0.1, "step_size": 1, "gamma": 0.1, "milestones": [], "min_lr": 0.0,
            "pct_start": 0.3, "anneal": "cos", "div_factor": 25.0, "final_div_factor": 1e4,
            "three_phase": False}
    cases = []
    for warmup in (0, 5):
        cases += [
            {"kind": "constant", "base_lr": 0.2, "total": 20},
            {"kind": "step", "base_lr": 0.1, "total": 40, "step_size": 7, "gamma": 0.5},
            {"kind": "multistep", "base_lr": 0.4, "total": 50, "milestones": [10, 25, 26],
             "gamma": 0.2},
            {"kind": "cosine", "base_lr": 0.1, "total": 50},
            {"kind": "cosine", "base_lr": 0.05, "total": 31, "min_lr": 0.001, "start_factor": 0.25},
            {"kind": "onecycle", "base_lr": 1.0, "total": 40},
            {"kind": "onecycle", "base_lr": 0.5, "total": 37, "pct_start": 0.25,
             "anneal": "linear", "div_factor": 10.0, "final_div_factor": 100.0},
            {"kind": "onecycle", "base_lr": 0.8, "total": 45, "three_phase": True},
        ]
        for c in cases[-8:]:
            c["warmup"] = warmup
    cases.append({"kind": "cosine", "base_lr": 1.0, "total": 200, "warmup": 3, "start_factor": 0.01})
    cases = [run({**base, **c}) for c in cases]
    (out / "schedule.json").write_text(json.dumps(cases))
    make_raises(out)


# Configurations torch.optim.lr_scheduler refuses when stepped once per optimizer step (scheduler
# .step() after each of the `total` optimizer steps, the last one included), and neighbours it
# accepts: schedule_raises.json, [{...case, "raises": bool, "error": "ZeroDivisionError(...)"}].
def make_raises(out: pathlib.Path) -> None:
    base = {"base_lr": 0.1, "warmup": 0, "start_factor": 0.1, "step_size": 1, "gamma": 0.1,
            "milestones": [], "min_lr": 0.0, "pct_start": 0.3, "anneal": "cos",
            "div_factor": 25.0, "final_div_factor": 1e4, "three_phase": False}
    cases = [
        # OneCycle: a phase of zero width holding a step.
        {"kind": "onecycle", "total": 2, "pct_start": 0.5},     # 2 steps: a zero-width warm-up
        {"kind": "onecycle", "total": 10, "pct_start": 0.1},    # pct_start x total == 1
        {"kind": "onecycle", "total": 1, "pct_start": 1.0},
        {"kind": "onecycle", "total": 3, "pct_start": 1.0},     # the last phase, at step T
        {"kind": "onecycle", "total": 4, "pct_start": 0.25, "three_phase": True},
        {"kind": "onecycle", "total": 7, "pct_start": 4 / 7, "three_phase": True},  # 2pT-2 == T-1
        {"kind": "onecycle", "total": 7, "warmup": 5, "pct_start": 0.5},  # main part: 2 steps
        # ... and neighbours torch accepts.
        {"kind": "onecycle", "total": 1, "pct_start": 0.3},
        {"kind": "onecycle", "total": 2, "pct_start": 0.0},
        {"kind": "onecycle", "total": 3, "pct_start": 0.5},
        {"kind": "onecycle", "total": 10, "pct_start": 0.3, "three_phase": True},
        {"kind": "onecycle", "total": 20, "pct_start": 0.99},
        # LinearLR's start_factor check; StepLR's step_size (division by zero at its first step).
        {"kind": "cosine", "total": 10, "warmup": 2, "start_factor": 0.0},
        {"kind": "cosine", "total": 10, "warmup": 2, "start_factor": 1.0},
        {"kind": "step", "total": 10, "step_size": 0},
        {"kind": "step", "total": 10, "step_size": 3},
    ]
    results = []
    for c in cases:
        case = {**base, **c}
        try:
            case = run(case)
            case.update(raises=False, error="")
        except (ValueError, ZeroDivisionError) as e:
            case.update(raises=True, error=repr(e))
        results.append(case)
    (out / "schedule_raises.json").write_text(json.dumps(results))
