"""Checkpoint files as people have them, written by the venv's PyTorch, for the C++ loader tests
(tests/test_harness.cpp, Checkpoint.*):

  ckpt_plain_cuda.pt     torch.save(model.state_dict()): an OrderedDict (with _metadata), its
                         storages tagged as saved from 'cuda:0' (a tagger registered like CUDA's,
                         so no GPU is needed to write it)
  ckpt_nested_module.pt  {"epoch", "model": DDP-style "module."-prefixed OrderedDict,
                         "optimizer": SGD state_dict with momentum buffers, "args":
                         argparse.Namespace, "best_acc1": tensor, "tag": bytes}, pickle protocol 4
  ckpt_io.pt             {"x": input [2, 3, 64, 64], "logits": torchvision's eval-mode logits}

The model is torchvision.models.resnet18(num_classes=10) with randomised BatchNorm affine
parameters and running statistics, so eval-mode logits depend on every tensor in the file.
"""
import argparse
import collections
import pathlib

import torch
import torchvision


def _cuda_tagger(storage):
    # Same contract as torch.serialization's own taggers: a location string or None.
    return "cuda:0" if storage.device.type == "cpu" else None


def make(out: pathlib.Path) -> None:
    torch.manual_seed(3)
    m = torchvision.models.resnet18(num_classes=10)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.1, 0.1)
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.num_batches_tracked.fill_(7)
    m.eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = m(x)
    sd = m.state_dict()
    assert isinstance(sd, collections.OrderedDict) and hasattr(sd, "_metadata")

    entry = (1, _cuda_tagger, lambda obj, location: None)
    torch.serialization._package_registry.append(entry)
    torch.serialization._package_registry.sort(key=lambda e: e[0])
    try:
        torch.save(sd, out / "ckpt_plain_cuda.pt")
    finally:
        torch.serialization._package_registry.remove(entry)

    # DDP-style keys, cloned before a training step changes the model; the step (on a copy)
    # gives the optimizer state momentum buffers.
    prefixed = collections.OrderedDict(("module." + k, v.clone()) for k, v in sd.items())
    other = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    other(x).sum().backward()
    opt.step()
    nested = {
        "epoch": 5,
        "model": prefixed,
        "optimizer": opt.state_dict(),
        "args": argparse.Namespace(lr=0.1, arch="resnet18", milestones=[30, 60]),
        "best_acc1": torch.tensor(0.5),
        "tag": b"\x00\xffbytes",
    }
    torch.save(nested, out / "ckpt_nested_module.pt", pickle_protocol=4)
    torch.save({"x": x, "logits": logits}, out / "ckpt_io.pt")
