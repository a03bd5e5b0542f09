#!/usr/bin/env python3
"""DINO self-supervised pretraining (student/teacher, multi-crop) fed by gpufeed's views.

    # two processes on the CPU (DDP of the student over Gloo), one epoch of the shared sample
    .venv/bin/torchrun --standalone --nproc-per-node 2 examples/python/train_dino.py \\
        --data ../shared/data/imagenet-sample --device cpu --epochs 1 --batch-size 16 --num-workers 1
    # one process per GPU (NCCL), the DINOv2 recipe's 2 x 224 + 8 x 96 views
    .venv/bin/torchrun --nproc-per-node 8 examples/python/train_dino.py --data DIR --device cuda

gpufeed.DataLoader(views=...) decodes each image once and yields its views as a list of
[N, 3, S, S] float32 tensors (ImageNet mean/std), on --device: the 2 global views, then the
--local-crops-number local ones. --views names a preset (gpufeed.views_preset: "dino", "dinov2",
"dinov2_paper"); --global-size/--local-size resize its views (the list form of views=).

The model is main_dino.py's (facebookresearch/dino) with a ResNet-18 backbone: a DINO head (MLP,
L2-normalised bottleneck, weight-normalised last layer), the student on every view (one backbone
pass per resolution, as MultiCropWrapper), the teacher, an EMA of the student (momentum from
--momentum-teacher to 1 on a cosine), on the global views only; the DINO loss is the cross-entropy
between the centred, sharpened teacher of each global view and the student on every other view.
"""
import argparse
import copy
import itertools
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import gpufeed
from train_imagenet import all_sum, setup_distributed  # torchrun's setup (this folder)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="an ImageFolder tree or a flat folder of images")
    p.add_argument("--views", default="dinov2", help="a gpufeed.views_preset name: dino, dinov2, dinov2_paper")
    p.add_argument("--local-crops-number", type=int, default=8)
    p.add_argument("--global-size", type=int, help="the global views' side (the preset's: 224)")
    p.add_argument("--local-size", type=int, help="the local views' side (the preset's: 96)")
    p.add_argument("-j", "--num-workers", type=int, default=4, help="gpufeed's decode threads per process")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="steps per epoch at most (0: the whole epoch)")
    p.add_argument("-b", "--batch-size", type=int, default=64, help="source images per process")
    p.add_argument("--lr", type=float, default=5e-4, help="AdamW, for a global batch of 256, scaled linearly")
    p.add_argument("--weight-decay", type=float, default=0.04)
    p.add_argument("--out-dim", type=int, default=4096, help="the head's prototypes (DINO: 65536)")
    p.add_argument("--momentum-teacher", type=float, default=0.996)
    p.add_argument("--teacher-temp", type=float, default=0.04)
    p.add_argument("--student-temp", type=float, default=0.1)
    p.add_argument("--center-momentum", type=float, default=0.9)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def make_views(args):
    """The views= value: the preset's name, or its per-view dicts with the sizes overridden."""
    if args.global_size is None and args.local_size is None:
        return {"views": args.views, "local_crops_number": args.local_crops_number}
    views = gpufeed.views_preset(args.views, local_crops_number=args.local_crops_number)
    for k, v in enumerate(views):
        size = args.global_size if k < 2 else args.local_size
        if size is not None:
            v["image_size"] = size
    return {"views": views}


class DINOHead(nn.Module):
    """main_dino.py's head: 3-layer MLP, L2-normalised bottleneck, last layer weight-normalised
    with its norm fixed to 1 (norm_last_layer=True)."""

    def __init__(self, in_dim, out_dim, hidden_dim=2048, bottleneck_dim=256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim),
                                 nn.GELU(), nn.Linear(hidden_dim, bottleneck_dim))
        self.last = nn.Parameter(torch.randn(out_dim, bottleneck_dim) * 0.02)

    def forward(self, x):
        x = F.normalize(self.mlp(x), dim=-1)
        return F.linear(x, F.normalize(self.last, dim=-1))


class MultiCrop(nn.Module):
    """Backbone + head over a list of views: one backbone pass per run of same-size views."""

    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, views):
        feats, start = [], 0
        for end in range(1, len(views) + 1):
            if end == len(views) or views[end].shape[-1] != views[start].shape[-1]:
                feats.append(self.backbone(torch.cat(views[start:end])))
                start = end
        return self.head(torch.cat(feats))


def make_model(args):
    backbone = torchvision.models.resnet18()
    dim = backbone.fc.in_features
    backbone.fc = nn.Identity()
    return MultiCrop(backbone, DINOHead(dim, args.out_dim))


class DINOLoss(nn.Module):
    """main_dino.py's DINOLoss: teacher softmax((t - center) / teacher_temp) of each global view
    against the student's log_softmax(s / student_temp) on every other view; the center is an EMA of
    the teacher's batch mean over all ranks."""

    def __init__(self, args, num_views):
        super().__init__()
        self.args, self.num_views = args, num_views
        self.register_buffer("center", torch.zeros(1, args.out_dim))

    def forward(self, student_out, teacher_out):
        student = (student_out / self.args.student_temp).chunk(self.num_views)
        teacher = F.softmax((teacher_out - self.center) / self.args.teacher_temp, dim=-1).detach().chunk(2)
        terms = [torch.sum(-t * F.log_softmax(s, dim=-1), dim=-1).mean()
                 for i, t in enumerate(teacher) for v, s in enumerate(student) if v != i]
        self.update_center(teacher_out)
        return sum(terms) / len(terms)

    @torch.no_grad()
    def update_center(self, teacher_out):
        batch_center = teacher_out.sum(dim=0, keepdim=True)
        count = torch.tensor([float(len(teacher_out))], device=teacher_out.device)
        if dist.is_initialized():
            dist.all_reduce(batch_center)
            dist.all_reduce(count)
        m = self.args.center_momentum
        self.center.mul_(m).add_(batch_center / count, alpha=1 - m)


@torch.no_grad()
def update_teacher(student, teacher, momentum):
    for ps, pt in zip(student.parameters(), teacher.parameters()):
        pt.mul_(momentum).add_(ps.detach(), alpha=1 - momentum)


def main():
    args = parse_args()
    rank, world_size, device = setup_distributed(args)
    torch.manual_seed(args.seed)
    loader = gpufeed.DataLoader(args.data, batch_size=args.batch_size, num_workers=args.num_workers, shuffle=True,
                                seed=args.seed, device=device, rank=rank, world_size=world_size, **make_views(args))
    student = make_model(args).to(device)
    if device.type == "cuda" and world_size > 1:
        student = nn.SyncBatchNorm.convert_sync_batchnorm(student)  # as main_dino.py for BN backbones
    teacher = copy.deepcopy(student).requires_grad_(False)
    if world_size > 1:
        student = nn.parallel.DistributedDataParallel(student, device_ids=[device.index] if device.type == "cuda" else None)
    student_module = student.module if world_size > 1 else student
    steps_per_epoch = min(len(loader), args.max_steps) if args.max_steps else len(loader)
    num_views = 2 + args.local_crops_number
    criterion = DINOLoss(args, num_views).to(device)
    lr = args.lr * args.batch_size * world_size / 256
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=args.weight_decay)
    if rank == 0:
        print(f"views {args.views}: {num_views} per image; {steps_per_epoch} steps/epoch of {args.batch_size} x "
              f"{world_size} process(es) on {device}; lr {lr:.4g}", flush=True)
    total_steps, step = args.epochs * steps_per_epoch, 0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        student.train()
        loss_sum = steps = images = wait = 0.0
        t0 = t_ready = time.perf_counter()
        for views, _ in itertools.islice(loader, steps_per_epoch):
            wait += time.perf_counter() - t_ready
            teacher_out = teacher(views[:2])  # the teacher sees the global views only
            loss = criterion(student(views), teacher_out)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(student.parameters(), 3.0)
            optimizer.step()
            momentum = 1 - (1 - args.momentum_teacher) * (math.cos(math.pi * step / total_steps) + 1) / 2
            update_teacher(student_module, teacher, momentum)
            loss_sum, steps, images, step = loss_sum + loss.item(), steps + 1, images + views[0].shape[0], step + 1
            t_ready = time.perf_counter()
        seconds = time.perf_counter() - t0
        loss_sum, steps, images = all_sum([loss_sum, steps, images], device)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  steps {int(steps / world_size)}  loss {loss_sum / steps:.4f}  "
                  f"images/s {images / seconds:.1f}  data_wait {100 * wait / seconds:.1f}%  time {seconds:.1f}s",
                  flush=True)
    if rank == 0:
        stats = loader.stats()  # every view of a sample comes from one decode
        print(f"rank 0 decoded {stats['decodes']} times for {stats['samples']} samples", flush=True)
    ok = math.isfinite(loss_sum)
    if dist.is_initialized():
        # As train_imagenet.py: a barrier lets Gloo's last all-reduce finish, then skip the Gloo
        # teardown that can hang at exit (pytorch#75097).
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if ok else 1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
