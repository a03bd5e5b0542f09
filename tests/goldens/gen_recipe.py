"""Recipe pieces (tests/test_recipe.cpp): torchvision references' parameter groups, cross-entropy
with label smoothing on class indices and soft targets, clip_grad_norm_."""
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


def make(out: pathlib.Path) -> None:
    (out / "recipe.json").write_text(json.dumps({
        "weight_decay_groups": _groups(out), "cross_entropy": _cross_entropy(), "clip_grad_norm": _clip()}))
