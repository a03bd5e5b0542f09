"""torchvision ResNet references for tests/test_resnet.cpp.

Writes, into `out`:

resnet_names.json
    For resnet18/34/50/101/152 with num_classes=1000: named_parameters(), named_buffers() and
    named_modules() in torchvision's order, as [name, shape] (modules: [name, class name]), and
    the parameter count. Built on the meta device: shapes only, no weights.

resnet18_c10.pt, resnet50_c10.pt
    torch.save() of a plain dict (not an OrderedDict: LibTorch's torch::pickle_load cannot
    rebuild one, pytorch#100741), all tensors contiguous float32/int64 on the CPU:
      "seed":   int, the torch.manual_seed() the model was built under
      "state":  {name: tensor} for every parameter and buffer (torchvision's names)
      "input":  [2, 3, 64, 64] float32
      "logits": [2, 10] float32, the model's output in eval mode
    The model is built right after torch.manual_seed(seed), so its conv and fc weights are
    torchvision's initialisation for that seed (the C++ test rebuilds them under the same seed).
    Only BatchNorm is changed afterwards: running statistics from three train-mode passes over
    random batches, then weight and bias perturbed, so that eval mode is not an identity.
"""
import json
import pathlib

import torch
import torchvision

_ARCHS = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]


def _names(arch: str) -> dict:
    with torch.device("meta"):
        m = getattr(torchvision.models, arch)(num_classes=1000)
    return {
        "parameters": [[n, list(p.shape)] for n, p in m.named_parameters()],
        "buffers": [[n, list(b.shape)] for n, b in m.named_buffers()],
        "modules": [[n, type(s).__name__] for n, s in m.named_modules()],
        "num_parameters": sum(p.numel() for p in m.parameters()),
    }


def _reference(arch: str, seed: int, path: pathlib.Path) -> None:
    torch.manual_seed(seed)
    model = getattr(torchvision.models, arch)(num_classes=10)
    # Everything random from here on uses its own generator: the global stream above is the
    # one the C++ test replays to check the initialisation.
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.train()
        for _ in range(3):
            model(torch.randn(8, 3, 64, 64, generator=g))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(1.0 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
        model.eval()
        x = torch.randn(2, 3, 64, 64, generator=g)
        logits = model(x)
    state = {n: t.detach().clone().contiguous() for n, t in model.state_dict().items()}
    torch.save({"seed": seed, "state": dict(state), "input": x.contiguous(),
                "logits": logits.contiguous()}, path)


def make(out: pathlib.Path) -> None:
    (out / "resnet_names.json").write_text(json.dumps({a: _names(a) for a in _ARCHS}))
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))  # the machine is shared; this takes seconds anyway
    try:
        _reference("resnet18", 0, out / "resnet18_c10.pt")
        _reference("resnet50", 1, out / "resnet50_c10.pt")
    finally:
        torch.set_num_threads(threads)
