"""torch.amp.GradScaler's per-step behaviour, for the C++ GradScaler (tests/test_harness.cpp,
GradScaler.*): a Linear(4, 3) trained with SGD (momentum 0.9) under a scaler with
growth_interval 2, gradients poisoned with inf or NaN at some steps. Writes amp.json with the
initial weights, the data, the poisoned steps and, after every step, the scale, the growth
tracker, whether the step ran, and the weights."""
import json
import pathlib

import torch


def make(out: pathlib.Path) -> None:
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(3, 4, generator=g))
        lin.bias.copy_(torch.randn(3, generator=g))
    x = torch.randn(10, 8, 4, generator=g)
    y = torch.randn(10, 8, 3, generator=g)
    case = {"weight": lin.weight.tolist(), "bias": lin.bias.tolist(), "x": x.tolist(), "y": y.tolist(),
            "init_scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2,
            "lr": 0.1, "momentum": 0.9, "poison": {"2": "inf", "3": "nan", "7": "-inf"}, "steps": []}
    opt = torch.optim.SGD(lin.parameters(), lr=case["lr"], momentum=case["momentum"])
    scaler = torch.amp.GradScaler("cpu", init_scale=case["init_scale"], growth_factor=case["growth_factor"],
                                  backoff_factor=case["backoff_factor"], growth_interval=case["growth_interval"])
    for k in range(10):
        opt.zero_grad(set_to_none=True)
        loss = ((lin(x[k]) - y[k]) ** 2).mean()
        scaler.scale(loss).backward()
        if str(k) in case["poison"]:
            lin.weight.grad[1, 2] = float(case["poison"][str(k)])
        before = lin.weight.detach().clone()
        scale_used = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        case["steps"].append({"scale_used": scale_used, "scale": scaler.get_scale(),
                              "growth_tracker": int(scaler._get_growth_tracker()),
                              "stepped": not torch.equal(before, lin.weight.detach()),
                              "weight": lin.weight.tolist(), "bias": lin.bias.tolist()})
    (out / "amp.json").write_text(json.dumps(case))
