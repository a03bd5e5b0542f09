#!/usr/bin/env python3
"""ImageNet training in the shape of PyTorch's examples/imagenet/main.py, with a choice of loader.

    # one process, CPU
    .venv/bin/python examples/python/train_imagenet.py --data ../shared/data/hymenoptera --device cpu \\
        --arch resnet18 --epochs 2 --batch-size 16 --image-size 64 --workers 2
    # two processes (DDP, Gloo on the CPU, NCCL on CUDA), either loader
    .venv/bin/torchrun --nproc-per-node 2 examples/python/train_imagenet.py --data DIR --device cpu --loader torch
    .venv/bin/torchrun --nproc-per-node 8 examples/python/train_imagenet.py --data DIR --device cuda --amp

--data holds train/ and val/ ImageFolder trees (or is one tree: training only). --loader gpufeed reads them with gpufeed.DataLoader
(decode threads in this process, normalised batches already on the device); --loader torch with
torchvision's ImageFolder + transforms and torch.utils.data.DataLoader (worker processes), the
same recipe: RandomResizedCrop + RandomHorizontalFlip for training, Resize + CenterCrop for
validation, ImageNet mean/std, DistributedSampler(shuffle=True, seed) with set_epoch. Both run
under gpufeed.profile, so every epoch prints throughput and data wait like `gpufeed train`, and
the run ends with its step breakdown and verdict (--metrics/--trace write the files).

The torchvision references' recipe flags, same names: --auto-augment ta_wide|ra|imagenet (with
--interpolation for its geometric ops), --random-erase P, --label-smoothing, --mixup-alpha and
--cutmix-alpha (torchvision.transforms.v2.MixUp/CutMix, one of them per batch, on the device
batch). With --loader gpufeed the per-sample ones run on gpufeed's threads (DataLoader keywords
auto_augment, augment_interpolation, random_erase); with --loader torch in torchvision's
transforms. E.g. the V2 recipe's data side:

    .venv/bin/python examples/python/train_imagenet.py --data DIR --auto-augment ta_wide \
        --random-erase 0.1 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 --image-size 176
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as T

import gpufeed


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="folder with train/ and val/ ImageFolder trees")
    p.add_argument("--loader", choices=("gpufeed", "torch"), default="gpufeed")
    p.add_argument("-a", "--arch", default="resnet18", help="a torchvision.models name")
    p.add_argument("-j", "--workers", "--num-workers", dest="workers", type=int, default=4,
                   help="decode threads (gpufeed: num_workers) or worker processes (torch's DataLoader); -j/--workers as in PyTorch's examples/imagenet")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("-b", "--batch-size", type=int, default=256, help="per process")
    p.add_argument("--lr", type=float, default=0.1, help="for a global batch of 256, scaled linearly")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--amp", action="store_true", help="autocast: bfloat16 on the CPU, float16 + GradScaler on CUDA")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-p", "--print-freq", type=int, default=0, help="print every N steps (0: epoch lines only)")
    p.add_argument("--metrics", help="gpufeed.profile's metrics JSON lines (tools/bench/plot.py draws them)")
    p.add_argument("--trace", help="gpufeed.profile's Chrome trace")
    p.add_argument("--checkpoint", help="write the final model state_dict here (rank 0)")
    p.add_argument("--no-val", action="store_true", help="skip validation")
    # torchvision's classification references' recipe flags
    p.add_argument("--auto-augment", choices=("ta_wide", "ra", "imagenet"), help="per-sample policy after the flip")
    p.add_argument("--interpolation", choices=("nearest", "bilinear"), default="bilinear",
                   help="the policy's geometric ops (the references' default: bilinear)")
    p.add_argument("--random-erase", type=float, default=0.0, help="RandomErasing probability")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--mixup-alpha", type=float, default=0.0)
    p.add_argument("--cutmix-alpha", type=float, default=0.0)
    return p.parse_args()


def setup_distributed(args):
    """torchrun's contract: RANK, WORLD_SIZE, LOCAL_RANK; NCCL on CUDA, Gloo on the CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
    rank = dist.get_rank() if world_size > 1 else 0
    if args.device.startswith("cuda"):
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank if args.device == "cuda" else torch.device(args.device).index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return rank, world_size, device


def make_loaders(args, device, rank, world_size):
    train_dir, val_dir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    if not os.path.isdir(train_dir):  # a single ImageFolder tree: train on it, no validation
        train_dir, args.no_val = args.data, True
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    if args.loader == "gpufeed":
        common = dict(batch_size=args.batch_size, num_workers=args.workers, image_size=args.image_size,
                      device=device, dtype=torch.float32, memory_format=memory_format, seed=args.seed,
                      rank=rank, world_size=world_size)
        train = gpufeed.DataLoader(train_dir, shuffle=True, train=True, auto_augment=args.auto_augment,
                                   augment_interpolation=args.interpolation, random_erase=args.random_erase,
                                   **common)
        val = None if args.no_val else gpufeed.DataLoader(val_dir, shuffle=False, train=False, **common)
        return train, val, len(train.classes)
    normalize = T.Normalize(mean=gpufeed._loader.IMAGENET_MEAN, std=gpufeed._loader.IMAGENET_STD)
    train_tf = [T.RandomResizedCrop(args.image_size), T.RandomHorizontalFlip()]
    if args.auto_augment:  # as the references' ClassificationPresetTrain
        mode = T.InterpolationMode(args.interpolation)
        train_tf.append({"ta_wide": lambda: T.TrivialAugmentWide(interpolation=mode),
                         "ra": lambda: T.RandAugment(interpolation=mode),
                         "imagenet": lambda: T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=mode)}
                        [args.auto_augment]())
    train_tf += [T.ToTensor(), normalize]
    if args.random_erase > 0:
        train_tf.append(T.RandomErasing(p=args.random_erase))
    train_set = torchvision.datasets.ImageFolder(train_dir, T.Compose(train_tf))
    sampler = torch.utils.data.DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                                  seed=args.seed)
    pin = device.type == "cuda"
    train = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                                        num_workers=args.workers, pin_memory=pin,
                                        persistent_workers=args.workers > 0)
    val = None
    if not args.no_val:
        val_set = torchvision.datasets.ImageFolder(val_dir, T.Compose([
            T.Resize(round(args.image_size * 256 / 224)), T.CenterCrop(args.image_size), T.ToTensor(), normalize]))
        val_sampler = torch.utils.data.DistributedSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False)
        val = torch.utils.data.DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler,
                                          num_workers=args.workers, pin_memory=pin)
    return train, val, len(train_set.classes)


def set_epoch(loader, epoch):
    if isinstance(loader, gpufeed.DataLoader):
        loader.set_epoch(epoch)
    else:
        loader.sampler.set_epoch(epoch)


def to_device(images, labels, device, channels_last):
    """torch's loader yields CPU tensors; gpufeed's are on the device already (a no-op then)."""
    images = images.to(device, non_blocking=True)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device, non_blocking=True)


def accuracy(output, target, topk=(1,)):
    """Number of correct predictions within the top k (examples/imagenet's accuracy, as counts)."""
    with torch.no_grad():
        _, pred = output.topk(max(topk), 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum().item() for k in topk]


def all_sum(values, device):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def batch_mix(args, num_classes):
    """The references' MixUp/CutMix: one of them per batch (RandomChoice) with soft targets."""
    from torchvision.transforms import v2
    mixes = []
    if args.mixup_alpha > 0:
        mixes.append(v2.MixUp(alpha=args.mixup_alpha, num_classes=num_classes))
    if args.cutmix_alpha > 0:
        mixes.append(v2.CutMix(alpha=args.cutmix_alpha, num_classes=num_classes))
    return v2.RandomChoice(mixes) if mixes else None


def train_one_epoch(prof, model, criterion, optimizer, scaler, args, device, epoch, mix):
    model.train()
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    loss_sum = correct = seen = 0.0
    for step, (images, labels) in enumerate(prof):
        images, labels = to_device(images, labels, device, args.channels_last)
        # soft targets [N, classes] when mixing; accuracy stays on the hard labels
        images, targets = mix(images, labels) if mix is not None else (images, labels)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
            output = model(images)
            loss = criterion(output, targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        prof.phase("forward_backward")  # DDP's all-reduce overlaps backward; it ends in here
        scaler.step(optimizer)
        scaler.update()
        prof.phase("optimizer")
        loss_sum += loss.item() * labels.numel()
        correct += accuracy(output, labels)[0]
        seen += labels.numel()
        if args.print_freq and step % args.print_freq == 0 and args.rank == 0:
            print(f"  epoch {epoch + 1} step {step}/{len(prof)} loss {loss.item():.4f}", flush=True)
    return all_sum([loss_sum, correct, seen], device)


def validate(loader, model, criterion, args, device):
    model.eval()
    loss_sum = c1 = c5 = seen = 0.0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = to_device(images, labels, device, args.channels_last)
            with torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16,
                                enabled=args.amp):
                output = model(images)
            loss_sum += criterion(output.float(), labels).item() * labels.numel()
            top1, top5 = accuracy(output, labels, topk=(1, min(5, output.shape[1])))
            c1, c5, seen = c1 + top1, c5 + top5, seen + labels.numel()
    loss_sum, c1, c5, seen = all_sum([loss_sum, c1, c5, seen], device)
    return loss_sum / seen, c1 / seen, c5 / seen


def main():
    args = parse_args()
    rank, world_size, device = setup_distributed(args)
    args.rank = rank
    torch.manual_seed(args.seed)
    train_loader, val_loader, num_classes = make_loaders(args, device, rank, world_size)
    model = torchvision.models.__dict__[args.arch](num_classes=num_classes).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing).to(device)
    mix = batch_mix(args, num_classes)
    lr = args.lr * args.batch_size * world_size / 256
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and device.type == "cuda")
    if rank == 0:
        print(f"loader {args.loader}: {len(train_loader)} steps/epoch of {args.batch_size} x {world_size} "
              f"process(es) on {device}; lr {lr:.4g} for a global batch of {args.batch_size * world_size}", flush=True)
    # Every rank times its own steps; rank 0 writes the files and prints the report.
    prof = gpufeed.profile(train_loader, device=device, epochs=args.epochs, model=args.arch,
                           metrics=args.metrics if rank == 0 else None, trace=args.trace if rank == 0 else None,
                           verbose=rank == 0)
    for epoch in range(args.epochs):
        set_epoch(train_loader, epoch)
        t0 = time.perf_counter()
        loss_sum, correct, seen = train_one_epoch(prof, model, criterion, optimizer, scaler, args, device, epoch, mix)
        seconds = time.perf_counter() - t0
        lr_now = scheduler.get_last_lr()[0]
        scheduler.step()
        ep = prof.epochs_done[-1]
        images_per_s = all_sum([ep["images"] / max(ep["wall_ms"] / 1000, 1e-9)], device)[0]
        line = (f"epoch {epoch + 1}/{args.epochs}  loss {loss_sum / seen:.4f}  top1 {100 * correct / seen:.1f}%  "
                f"images/s {images_per_s:.1f}  data_wait {100 * ep['data_wait_fraction']:.1f}%  lr {lr_now:.4g}  "
                f"time {seconds:.1f}s")
        if val_loader is not None:
            vl, v1, v5 = validate(val_loader, model, criterion, args, device)
            line += f"  val_loss {vl:.4f}  val_top1 {100 * v1:.1f}%  val_top5 {100 * v5:.1f}%"
        if rank == 0:
            print(line, flush=True)
    if rank == 0 and args.checkpoint:
        state = model.module.state_dict() if world_size > 1 else model.state_dict()
        torch.save(state, args.checkpoint)
        print(f"checkpoint: {args.checkpoint}", flush=True)
    if dist.is_initialized():
        # A Gloo worker thread may still hold the last all-reduce's tensor, whose release needs
        # the GIL; destroy_process_group joins that thread holding the GIL (pytorch#75097). A
        # barrier (its wait releases the GIL) lets it finish first.
        dist.barrier()
        # Every rank is past its last collective and rank 0's files are written; ending the
        # process here skips the Gloo teardown that can still hang at exit (a CI run of this
        # example hung for 10 minutes after its checkpoint line).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if math.isfinite(loss_sum) else 1)
    return 0 if math.isfinite(loss_sum) else 1


if __name__ == "__main__":
    raise SystemExit(main())
