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
    make_foreign_layouts(out, m, sd)


# --- state_dicts as wrapped, old, or other-headed models leave them -------------------------------
#
#  ckpt_compile_ddp.pt    torch.compile(DistributedDataParallel(model)).state_dict() from a real
#                         1-rank Gloo group: keys "_orig_mod.module.conv1.weight"
#  ckpt_ddp_compile.pt    DistributedDataParallel(torch.compile(model)).state_dict(): "module._orig_mod."
#  ckpt_lightning.pt      a Lightning-style checkpoint: {"state_dict": {"model.module." + key},
#                         "optimizer_states": [...], "epoch", "pytorch-lightning_version", ...}
#  ckpt_no_nbt.pt         a state_dict without BatchNorm's num_batches_tracked and without
#                         _metadata (as PyTorch < 0.4.1 wrote, and as {k: v} dict copies are)
#  ckpt_no_nbt_v1.pt      the same as an OrderedDict whose _metadata says BatchNorm version 1
#                         (PyTorch 0.4.0), nested under "state_dict" beside "epoch"
#  ckpt_r18_1000.pt       torchvision.models.resnet18() (1000 classes) state_dict: fine-tuning source
# Every file is first loaded by torchvision the way the reference does (strict load_state_dict after
# the wrapper is peeled), so the C++ side is held to what PyTorch accepts.
def make_foreign_layouts(out: pathlib.Path, m: torch.nn.Module,
                         sd: "collections.OrderedDict") -> None:
    import os
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"), rank=0,
                                world_size=1)
        try:
            wrapped = torchvision.models.resnet18(num_classes=10)
            wrapped.load_state_dict(sd)
            compiled_ddp = torch.compile(torch.nn.parallel.DistributedDataParallel(wrapped))
            a = compiled_ddp.state_dict()
            assert next(iter(a)).startswith("_orig_mod.module."), next(iter(a))
            torch.save(a, out / "ckpt_compile_ddp.pt")
            ddp_compiled = torch.nn.parallel.DistributedDataParallel(torch.compile(wrapped))
            b = ddp_compiled.state_dict()
            assert next(iter(b)).startswith("module._orig_mod."), next(iter(b))
            torch.save(b, out / "ckpt_ddp_compile.pt")
        finally:
            dist.destroy_process_group()

    lightning = {
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": collections.OrderedDict(("model.module." + k, v) for k, v in sd.items()),
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}],
        "lr_schedulers": [],
        "hyper_parameters": {"lr": 0.1, "arch": "resnet18"},
    }
    torch.save(lightning, out / "ckpt_lightning.pt")

    no_nbt = collections.OrderedDict((k, v) for k, v in sd.items() if not k.endswith("num_batches_tracked"))
    assert len(no_nbt) == len(sd) - 20
    check = torchvision.models.resnet18(num_classes=10)
    check.load_state_dict(no_nbt, strict=True)  # torch accepts it: no _metadata, no version
    torch.save(no_nbt, out / "ckpt_no_nbt.pt")
    v1 = m.state_dict()
    for k in [k for k in v1 if k.endswith("num_batches_tracked")]:
        del v1[k]
        v1._metadata[k[: -len(".num_batches_tracked")]]["version"] = 1
    check.load_state_dict(v1, strict=True)  # BatchNorm version 1: torch fills the buffer in
    torch.save({"epoch": 90, "state_dict": v1}, out / "ckpt_no_nbt_v1.pt")

    torch.manual_seed(11)
    torch.save(torchvision.models.resnet18().state_dict(), out / "ckpt_r18_1000.pt")
