#!/usr/bin/env python3
"""The PyTorch baseline for `gpufeed train`: the same model fed by torchvision's ImageFolder and
DataLoader (PIL transforms, pin_memory, num_workers), timed the same way.

GPU busy fraction = sum over measured steps of the CUDA-event time of the step's GPU work
(forward, backward, optimizer step, recorded on the training stream) / wall time of those steps.
Prints one JSON object. Used by tools/gpu_check.sh on the GPU machine; runs on the CPU too.
"""
import argparse
import json
import time

import torch
import torchvision
import torchvision.transforms as T


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--num-workers", "--workers", dest="num_workers", type=int, default=8,
                    help="DataLoader(num_workers=...); --workers is the old spelling")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--channels-last", action="store_true")
    args = ap.parse_args()

    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    tf = T.Compose([T.RandomResizedCrop(args.image_size), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ds = torchvision.datasets.ImageFolder(args.data, tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                     num_workers=args.num_workers, pin_memory=device.type == "cuda",
                                     drop_last=True, persistent_workers=args.num_workers > 0)
    model = getattr(torchvision.models, args.arch)(num_classes=len(ds.classes)).to(device)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * args.batch_size / 256, momentum=0.9,
                          weight_decay=1e-4)
    cuda = device.type == "cuda"
    events = []
    step = 0
    wait_s = 0.0
    t_start = None
    while step < args.steps:
        t_wait = time.perf_counter()
        for images, labels in dl:
            if step == args.warmup_steps:
                if cuda:
                    torch.cuda.synchronize()
                t_start = time.perf_counter()
                wait_s = 0.0
            if step >= args.warmup_steps:
                wait_s += time.perf_counter() - t_wait
            images = images.to(device, non_blocking=True).to(memory_format=fmt)
            labels = labels.to(device, non_blocking=True)
            if cuda and step >= args.warmup_steps:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if cuda and step >= args.warmup_steps:
                end.record()
                events.append((start, end))
            step += 1
            if step >= args.steps:
                break
            t_wait = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t_start
    measured = args.steps - args.warmup_steps
    busy_ms = sum(s.elapsed_time(e) for s, e in events) if cuda else float("nan")
    print(json.dumps({
        "loader": "torch.utils.data.DataLoader", "arch": args.arch, "device": str(device),
        "batch_size": args.batch_size, "num_workers": args.num_workers, "bf16": args.bf16,
        "channels_last": args.channels_last, "measured_steps": measured, "seconds": wall,
        "images_per_s": measured * args.batch_size / wall,
        "data_wait_fraction": wait_s / wall,
        "gpu_busy_fraction_events": busy_ms / 1000.0 / wall if cuda else None,
        "torch": torch.__version__, "torchvision": torchvision.__version__,
    }, indent=2))


if __name__ == "__main__":
    main()
