#!/usr/bin/env python3
"""Pipeline-parallel training of a torchvision ResNet fed by gpufeed (torch.distributed.pipelining).

    # 2 stages, one process each, CPU (Gloo)
    .venv/bin/torchrun --nproc-per-node 2 examples/python/train_pipeline.py --data DIR --device cpu \\
        --stages 2 --microbatches 4 --batch-size 16 --image-size 64 --epochs 2
    # DP x PP = 2 x 2: two pipelines of 2 stages, 4 processes
    .venv/bin/torchrun --nproc-per-node 4 examples/python/train_pipeline.py --data DIR --device cpu \\
        --stages 2 --dp 2 --microbatches 4 --batch-size 16 --image-size 64
    # CUDA (NCCL): one device per process; or both stages in one process on one device
    .venv/bin/torchrun --nproc-per-node 8 examples/python/train_pipeline.py --data DIR --stages 4 --dp 2
    .venv/bin/torchrun --nproc-per-node 1 examples/python/train_pipeline.py --data DIR --stages 2

The model is split into --stages K stages at the ResNet's stage boundaries: four segments (stem +
layer1, layer2, layer3, layer4 + pooling + fc), stage i taking segments [4i/K, 4(i+1)/K). The
processes form --dp D pipelines of P = world_size / D processes; process p of pipeline d is global
rank d * P + p and holds stages p, p + P, ... (K / P of them: one with P = K, the usual case).
Each step splits a batch of --batch-size into --microbatches M micro-batches, which
torch.distributed.pipelining runs through the stages by --schedule gpipe (ScheduleGPipe; with
several stages per process ScheduleLoopedBFS) or 1f1b (Schedule1F1B; ScheduleInterleaved1F1B),
with gradients accumulated over the micro-batches and scaled by 1/M: the gradient of the batch
mean of per-micro-batch mean losses, as gradient accumulation over the same M micro-batches
gives, BatchNorm normalising each micro-batch on its own.

gpufeed's part: the first stage's gpufeed.DataLoader decodes the images; the process holding the
last stage reads the same batches' labels from a gpufeed.DataLoader(labels_only=True) over the
same dataset and keywords, which yields the labels of the same samples in the same order without
decoding (the order is a function of the seed, the epoch, the rank and the world size). Every
pipeline's loaders are sharded as rank = pipeline index, world_size = D, so the D pipelines
read disjoint shards of each epoch. After each step, every stage's gradients are averaged over
the D copies of that stage (one all-reduce per process over its data-parallel group), then each
process's SGD steps its own stages. BatchNorm's running statistics stay per pipeline.

--record DIR writes DIR/rank<R>.pt per process: its stages' state_dicts, its per-step losses
(last stage, one per micro-batch) and the dataset indices and labels of each batch its loader
yielded.
"""
import argparse
import os
import time
from typing import Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, ScheduleLoopedBFS)

import gpufeed

# The ResNet's children, in forward order, as four segments; the stages are cut between segments.
SEGMENTS: Tuple[Tuple[str, ...], ...] = (("conv1", "bn1", "relu", "maxpool", "layer1"), ("layer2",), ("layer3",),
                                         ("layer4", "avgpool", "flatten", "fc"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="an ImageFolder tree (gpufeed.DataLoader's root)")
    p.add_argument("-a", "--arch", default="resnet18",
                   help="a torchvision ResNet: resnet18..152, resnext*, wide_resnet*")
    p.add_argument("--stages", type=int, default=2, help="K pipeline stages, 1..4")
    p.add_argument("--dp", type=int, default=1,
                   help="D data-parallel pipelines (world_size = D x processes per pipeline)")
    p.add_argument("--microbatches", type=int, default=4, help="M micro-batches per batch (divides --batch-size)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    p.add_argument("-b", "--batch-size", type=int, default=64, help="per pipeline")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.1,
                   help="for a global batch of 256 (D x --batch-size), scaled linearly")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("-j", "--workers", "--num-workers", dest="workers", type=int, default=2,
                   help="decode threads of the first stage's loader")
    p.add_argument("--seed", type=int, default=0, help="the model's initialisation and the loaders' order")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--record", default=None, help="write DIR/rank<R>.pt: stage weights, losses, batch indices")
    args = p.parse_args(argv)
    if not 1 <= args.stages <= len(SEGMENTS):
        p.error(f"--stages must be in 1..{len(SEGMENTS)} (the ResNet's stage boundaries)")
    if args.batch_size % args.microbatches:
        p.error("--microbatches must divide --batch-size (every micro-batch has the same shape)")
    return args


def make_model(arch: str, num_classes: int, seed: int) -> nn.Module:
    """The whole torchvision model, initialised from `seed` (the same weights in every process)."""
    if not arch.startswith(("resnet", "resnext", "wide_resnet")):
        raise ValueError(f"--arch {arch}: the stage split needs a torchvision ResNet")
    torch.manual_seed(seed)
    return torchvision.models.__dict__[arch](num_classes=num_classes)


def split_stages(model: nn.Module, num_stages: int) -> List[nn.Sequential]:
    """`model` (a torchvision ResNet) as `num_stages` nn.Sequential stages sharing its modules:
    stage i runs SEGMENTS[4i/K : 4(i+1)/K]. Stage 0 takes [N, 3, S, S] images, the last returns
    [N, num_classes] logits; chaining them is model.forward."""
    model.flatten = nn.Flatten(1)  # torch.flatten(x, 1) of ResNet.forward, as a module
    n = len(SEGMENTS)
    stages = []
    for i in range(num_stages):
        names = [name for seg in SEGMENTS[i * n // num_stages:(i + 1) * n // num_stages] for name in seg]
        stages.append(nn.Sequential(*[getattr(model, name) for name in names]))
    return stages


def stage_shapes(arch: str, num_classes: int, num_stages: int, micro_batch: int,
                 image_size: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Each stage's (input, output) for one micro-batch of [micro_batch, 3, S, S] float32 images, as
    meta tensors (computed on a meta-device copy of the model). Given to PipelineStage as
    input_args/output_args, they replace its shape inference, which runs the stage once on zeros
    in train mode: an extra update of BatchNorm's running statistics that gradient accumulation
    does not make."""
    with torch.device("meta"):
        parts = split_stages(torchvision.models.__dict__[arch](num_classes=num_classes), num_stages)
    x = torch.empty(micro_batch, 3, image_size, image_size, device="meta")
    shapes = []
    # With autograd on (meta tensors: no memory, no compute), so that a later stage's input and every
    # stage's output say they carry gradients: torch >= 2.12 reads requires_grad from these to
    # decide which received activations get a gradient.
    for i, part in enumerate(parts):
        y = part(x)
        shapes.append((x.detach().requires_grad_(i > 0), y.detach().requires_grad_(True)))
        x = y
    return shapes


def loader_keywords(args, rank: int, world_size: int) -> Dict:
    """The keywords every stage's gpufeed.DataLoader shares: same batches, same order. drop_last
    keeps every batch full, so every step splits into M equal micro-batches."""
    return dict(batch_size=args.batch_size, shuffle=True, seed=args.seed, drop_last=True, train=True,
                image_size=args.image_size, rank=rank, world_size=world_size)


def make_optimizer(params, args) -> torch.optim.Optimizer:
    """SGD at --lr x (global batch / 256), the global batch being D x --batch-size."""
    lr = args.lr * args.batch_size * args.dp / 256
    return torch.optim.SGD(params, lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)


class Stage(PipelineStage):
    """PipelineStage whose start-up handshake leaves out the neighbours in this process: a schedule
    with several stages per process hands their tensors over in memory, but its first step still
    sends a handshake to every neighbour stage, this process's too, which Gloo refuses (its pair
    to itself is never connected) and which carries nothing."""

    def _get_init_p2p_neighbors_ops(self):
        return [op for op in super()._get_init_p2p_neighbors_ops() if op.group_peer != self.group_rank]


def make_schedule(stages: Sequence[PipelineStage], args):
    """GPipe or 1F1B over M micro-batches, mean cross entropy per micro-batch, gradients scaled by 1/M."""
    loss = nn.CrossEntropyLoss()
    if len(stages) == 1:
        cls = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
        return cls(stages[0], n_microbatches=args.microbatches, loss_fn=loss)
    cls = ScheduleLoopedBFS if args.schedule == "gpipe" else ScheduleInterleaved1F1B
    return cls(list(stages), n_microbatches=args.microbatches, loss_fn=loss)


class Layout:
    """Where this process sits: pipeline `pipeline` (of `dp`), position `position` (of `per_pipeline`
    processes), its stage indices, and its process groups (pp: its pipeline; dp: the processes at
    its position in every pipeline). Every process creates every group, in the same order."""

    def __init__(self, rank: int, world_size: int, dp: int, num_stages: int):
        if world_size % dp:
            raise ValueError(f"world size {world_size} is not a multiple of --dp {dp}")
        self.dp, self.per_pipeline = dp, world_size // dp
        if num_stages % self.per_pipeline:
            raise ValueError(f"--stages {num_stages} is not a multiple of the {self.per_pipeline} processes "
                             f"per pipeline")
        self.pipeline, self.position = divmod(rank, self.per_pipeline)
        self.stage_indices = list(range(self.position, num_stages, self.per_pipeline))
        self.first = 0 in self.stage_indices
        self.last = num_stages - 1 in self.stage_indices
        P = self.per_pipeline
        for d in range(dp):
            g = dist.new_group([d * P + p for p in range(P)])
            if d == self.pipeline:
                self.pp_group = g
        for p in range(P):
            g = dist.new_group([d * P + p for d in range(dp)])
            if p == self.position:
                self.dp_group = g


def average_gradients(params: Sequence[nn.Parameter], group, size: int) -> None:
    """Each gradient averaged over the `size` processes of `group` (one flat all-reduce)."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat.div_(size)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)


def main(argv=None):
    args = parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    lay = Layout(rank, world_size, args.dp, args.stages)

    # The first stage reads images; the other processes read labels only (the one holding the last
    # stage uses them; the rest only count the steps). Pipeline d reads shard d of D.
    kw = loader_keywords(args, rank=lay.pipeline, world_size=lay.dp)
    if lay.first:
        loader = gpufeed.DataLoader(args.data, num_workers=args.workers, device=device, **kw)
    else:
        loader = gpufeed.DataLoader(args.data, labels_only=True, device=device, **kw)

    model = make_model(args.arch, len(loader.classes), args.seed)
    parts = split_stages(model, args.stages)
    modules = [parts[i].to(device) for i in lay.stage_indices]
    shapes = stage_shapes(args.arch, len(loader.classes), args.stages, args.batch_size // args.microbatches,
                          args.image_size)
    stages = [Stage(m, i, args.stages, device, input_args=shapes[i][0], output_args=shapes[i][1],
                    group=lay.pp_group) for m, i in zip(modules, lay.stage_indices)]
    schedule = make_schedule(stages, args)
    params = [p for m in modules for p in m.parameters()]
    opt = make_optimizer(params, args)

    if rank == lay.per_pipeline - 1:
        print(f"pipeline: {args.arch}, {args.stages} stages x {lay.dp} pipeline(s), {lay.per_pipeline} process(es) "
              f"per pipeline, {args.schedule}, {args.microbatches} micro-batches of "
              f"{args.batch_size // args.microbatches}; {len(loader)} steps/epoch on {device.type}", flush=True)
    record = {"rank": rank, "pipeline": lay.pipeline, "stages": lay.stage_indices, "losses": [], "indices": [],
              "labels": []}
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        loss_sum = torch.zeros(3, dtype=torch.float64)  # summed loss, correct, samples (last stage)
        for images, labels in loader:
            losses: List[torch.Tensor] = []
            inputs = (images,) if lay.first else ()
            target = labels if lay.last else None
            out = schedule.step(*inputs, target=target, losses=losses if lay.last else None)
            if lay.dp > 1:
                average_gradients(params, lay.dp_group, lay.dp)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if args.record:
                record["indices"].append(list(loader.last_batch["indices"]))
                record["labels"].append(labels.tolist())
            if lay.last:
                step_losses = [v.item() for v in losses]
                record["losses"].append(step_losses)
                loss_sum[0] += sum(step_losses) / len(step_losses) * labels.numel()
                loss_sum[1] += (out.detach().argmax(1) == labels).sum().item() if out is not None else 0
                loss_sum[2] += labels.numel()
        if lay.last:  # the epoch's figures over every pipeline
            if lay.dp > 1:
                totals = loss_sum.to(device)
                dist.all_reduce(totals, group=lay.dp_group)
                loss_sum = totals.cpu()
            elapsed = time.perf_counter() - t0
            if lay.pipeline == 0:
                print(f"epoch {epoch + 1}/{args.epochs}  loss {loss_sum[0] / loss_sum[2]:.4f}  "
                      f"top1 {100 * loss_sum[1] / loss_sum[2]:.1f}%  images/s {loss_sum[2] / elapsed:.1f}  "
                      f"time {elapsed:.1f}s", flush=True)
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        record["state"] = {i: {k: v.detach().cpu() for k, v in m.state_dict().items()}
                           for i, m in zip(lay.stage_indices, modules)}
        torch.save(record, os.path.join(args.record, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
