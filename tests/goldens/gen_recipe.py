"""Recipe pieces (tests/test_recipe.cpp): torchvision references' parameter groups, cross-entropy
with label smoothing on class indices and soft targets, clip_grad_norm_, v2.MixUp / v2.CutMix
with fixed parameters and CutMix's box arithmetic, the references' ExponentialMovingAverage, FFCV's
triangular schedule and progressive resizing (get_resolution); and a PNG folder with its mirror image for test-time flip averaging."""
import json
import pathlib

import torch
import torchvision

_NORM_CLASSES = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
                 torch.nn.modules.instancenorm._InstanceNorm, torch.nn.LocalResponseNorm)


def set_weight_decay(model, weight_decay, norm_weight_decay, bias_weight_decay):
    """torchvision's references/classification/utils.py set_weight_decay, written from its
    description (the references are not part of the torchvision package): walk the modules,
    each module's own parameters first; a custom key ("bias") matches the parameter's own name
    and wins; else a norm layer's parameter goes to "norm" when norm_weight_decay is set; else
    "other". Groups in the order other, norm, custom keys; empty ones dropped."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {"other": [], "norm": []}
    decay = {"other": weight_decay, "norm": norm_weight_decay}
    keys = []
    if bias_weight_decay is not None:
        groups["bias"] = []
        decay["bias"] = bias_weight_decay
        keys.append("bias")

    def add(module):
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if name in keys:
                groups[name].append(names[id(p)])
            elif norm_weight_decay is not None and isinstance(module, _NORM_CLASSES):
                groups["norm"].append(names[id(p)])
            else:
                groups["other"].append(names[id(p)])
        for child in module.children():
            add(child)

    add(model)
    return [{"key": k, "weight_decay": decay[k], "names": v} for k, v in groups.items() if v]


def _groups(out):
    model = torchvision.models.resnet18(num_classes=10)
    cases = []
    for wd, norm, bias in [(1e-4, None, None), (1e-4, 0.0, None), (1e-4, None, 0.0), (5e-5, 0.0, 0.0),
                           (1e-4, 1e-5, 2e-5)]:
        cases.append({"weight_decay": wd, "norm_weight_decay": norm, "bias_weight_decay": bias,
                      "groups": set_weight_decay(model, wd, norm, bias)})
    return cases


def _cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, generator=g) * 3
    labels = torch.randint(0, 5, (6,), generator=g)
    soft = torch.softmax(torch.randn(6, 5, generator=g) * 2, dim=1)
    cases = []
    for eps in [0.0, 0.1, 0.25]:
        crit = torch.nn.CrossEntropyLoss(label_smoothing=eps)
        cases.append({"label_smoothing": eps, "hard": crit(logits, labels).item(),
                      "soft": crit(logits, soft).item()})
    return {"logits": logits.tolist(), "labels": labels.tolist(), "soft": soft.tolist(), "cases": cases}


def _clip():
    g = torch.Generator().manual_seed(1)
    shapes = [(4, 3, 3, 3), (4,), (10, 4)]
    grads = [torch.randn(s, generator=g) for s in shapes]
    cases = []
    for max_norm in [0.5, 5.0, 1e6]:
        params = [torch.zeros(s, requires_grad=True) for s in shapes]
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        cases.append({"max_norm": max_norm, "total_norm": total.item(),
                      "grads": [p.grad.flatten().tolist() for p in params]})
    return {"shapes": [list(s) for s in shapes], "grads": [gr.flatten().tolist() for gr in grads], "cases": cases}


def _fixed(transform, params):
    """Runs a v2 MixUp/CutMix with its parameters fixed (make_params, _get_params in older
    torchvision, replaced)."""
    for name in ("make_params", "_get_params"):
        if hasattr(transform, name):
            setattr(transform, name, lambda flat_inputs: dict(params))
    return transform


def _mix():
    from torchvision.transforms import v2
    g = torch.Generator().manual_seed(2)
    images = torch.randn(4, 3, 6, 10, generator=g)
    labels = torch.tensor([0, 2, 1, 2])
    out = {"images": images.flatten().tolist(), "shape": list(images.shape), "labels": labels.tolist(),
           "num_classes": 3, "mixup": [], "cutmix": [], "cutmix_draws": []}
    for lam in [0.3, 0.87]:
        im, lb = _fixed(v2.MixUp(alpha=1.0, num_classes=3), {"lam": lam})(images.clone(), labels.clone())
        out["mixup"].append({"lam": lam, "images": im.flatten().tolist(), "labels": lb.tolist()})
    for box in [(2, 1, 7, 5), (0, 0, 10, 6), (9, 5, 10, 6), (3, 2, 3, 4)]:
        x1, y1, x2, y2 = box
        lam = float(1.0 - (x2 - x1) * (y2 - y1) / (10 * 6))
        im, lb = _fixed(v2.CutMix(alpha=1.0, num_classes=3), {"box": box, "lam_adjusted": lam})(
            images.clone(), labels.clone())
        out["cutmix"].append({"box": list(box), "lam": lam, "images": im.flatten().tolist(), "labels": lb.tolist()})
    # CutMix's box arithmetic: its own draws (global RNG), then the same draws again by hand.
    for seed, alpha, (h, w) in [(0, 1.0, (6, 10)), (1, 0.2, (224, 224)), (2, 1.0, (176, 176)), (3, 5.0, (7, 13)),
                                (4, 0.5, (32, 48)), (5, 1.0, (1, 1))]:
        t = v2.CutMix(alpha=alpha, num_classes=3)
        torch.manual_seed(seed)
        params = (t.make_params if hasattr(t, "make_params") else t._get_params)([torch.zeros(2, 3, h, w)])
        torch.manual_seed(seed)
        lam = float(torch.distributions.Beta(torch.tensor([alpha]), torch.tensor([alpha])).sample(()))
        r_x = int(torch.randint(w, size=(1,)))
        r_y = int(torch.randint(h, size=(1,)))
        out["cutmix_draws"].append({"lam": lam, "r_x": r_x, "r_y": r_y, "height": h, "width": w,
                                    "box": list(params["box"]), "lam_adjusted": params["lam_adjusted"]})
    return out


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """The references' utils.ExponentialMovingAverage, written from its description: an
    AveragedModel over parameters and buffers with avg = decay * avg + (1 - decay) * value."""

    def __init__(self, model, decay):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, "cpu", ema_avg, use_buffers=True)


def _tiny_model():
    # Mirrored in tests/test_recipe.cpp (torch::nn::Sequential, the same names and shapes).
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                               torch.nn.Linear(64, 5))


def _state(model):
    return {k: {"shape": list(v.shape), "values": v.flatten().tolist()} for k, v in model.state_dict().items()}


def _ema():
    torch.manual_seed(3)
    model = _tiny_model()
    ema = ExponentialMovingAverage(model, decay=0.9)
    g = torch.Generator().manual_seed(4)
    states = []
    for k in range(6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
        model.train()
        model(torch.randn(2, 3, 6, 6, generator=g))  # BatchNorm statistics and num_batches_tracked move
        states.append(_state(model))
        ema.update_parameters(model)
        if k < 2:  # the references' warmup: n_averaged.fill_(0) after each update
            ema.n_averaged.fill_(0)
    adjusted = []
    for decay, world, batch, steps, epochs in [(0.99998, 8, 128, 32, 600), (0.99998, 1, 32, 32, 3), (0.9, 2, 64, 4, 1)]:
        alpha = min(1.0, (1.0 - decay) * (world * batch * steps / epochs))
        adjusted.append({"decay": decay, "world_size": world, "batch_size": batch, "ema_steps": steps,
                         "epochs": epochs, "adjusted": 1.0 - alpha})
    return {"states": states, "averaged": _state(ema.module), "n_averaged": int(ema.n_averaged),
            "keys": list(ema.state_dict().keys()), "adjusted": adjusted}


def _triangular():
    """FFCV's ImageNet cyclic schedule (ffcv-imagenet train_imagenet.py get_cyclic_lr and the
    per-iteration np.interp of train_loop), per optimizer step."""
    import numpy as np
    cases = []
    for lr, epochs, peak, iters in [(1.7, 5, 2, 7), (0.5, 16, 2, 3), (1.0, 4, 1.5, 5), (0.3, 3, 3, 4), (2.0, 1, 1, 6)]:
        def get_lr(epoch):
            return np.interp([epoch], [0, peak, epochs], [1e-4 * lr, lr, 0])[0]
        lrs = []
        for epoch in range(epochs):
            lrs += np.interp(np.arange(iters), [0, iters], [get_lr(epoch), get_lr(epoch + 1)]).tolist()
        cases.append({"base_lr": lr, "epochs": epochs, "peak_epoch": peak, "steps_per_epoch": iters, "lrs": lrs})
    return cases


def _resolution():
    """FFCV's progressive resizing (ffcv-imagenet train_imagenet.py get_resolution, written from
    its definition): min_res up to start_ramp, max_res from end_ramp, in between np.interp's line
    rounded with np.round to a multiple of 32; per 0-based epoch."""
    import numpy as np
    cases = []
    for min_res, max_res, start, end, epochs in [
            (160, 192, 65, 76, 88),   # rn50_88_epochs.yaml
            (160, 192, 11, 13, 16),   # a shorter ramp
            (160, 160, 0, 0, 4),      # FFCV's defaults: no ramp
            (32, 64, 0, 2, 3),        # the CLI test's: 48 rounds half to even, to 64
            (32, 96, 0, 2, 3),        # the resume test's
            (128, 224, 10, 20, 24),   # 176 at epoch 15 is a half (5.5 x 32): to 192
            (160, 180, 2, 8, 10),     # max_res not a multiple of 32: the ramp reaches 192
            (170, 250, 3, 7, 9),      # min_res not a multiple of 32: the ramp starts at 160
            (100, 300, 1, 6, 8), (64, 256, 5, 5, 8), (8, 40, 0, 4, 5)]:
        def get_resolution(epoch):
            if epoch <= start:
                return min_res
            if epoch >= end:
                return max_res
            res = np.interp([epoch], [start, end], [min_res, max_res])[0]
            return int(np.round(res / 32)) * 32
        cases.append({"min_res": min_res, "max_res": max_res, "start_ramp": start, "end_ramp": end,
                      "sizes": [get_resolution(e) for e in range(epochs)]})
    return cases


def _flip_folders(out):
    """flip_val/orig and flip_val/mirror: the same 32 x 32 PNGs (lossless), left-right mirrored in
    the second, one per class of tests/test_util.h's tiny dataset."""
    from PIL import Image
    g = torch.Generator().manual_seed(5)
    for c in range(4):
        pixels = torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy()
        for name, arr in [("orig", pixels), ("mirror", pixels[:, ::-1, :].copy())]:
            folder = out / "flip_val" / name / f"class_{c:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(arr).save(folder / "img_00000.png")


def make(out: pathlib.Path) -> None:
    _flip_folders(out)
    (out / "recipe.json").write_text(json.dumps({
        "weight_decay_groups": _groups(out), "cross_entropy": _cross_entropy(), "clip_grad_norm": _clip(),
        "mix": _mix(), "ema": _ema(),
        "triangular": _triangular(), "resolution": _resolution()}))
