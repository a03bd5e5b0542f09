"""A training script shaped like PyTorch's examples/imagenet/main.py (distributed train +
validate), with its two DataLoader lines replaced by gpufeed.DataLoader, for one rank under
torchrun (Gloo, CPU). Kept as main.py has it: the ImageFolder + DistributedSampler(shuffle=False,
drop_last=True) of the validation set, the validation's AverageMeter all_reduce, and the
auxiliary torch DataLoader over Subset(val_loader.dataset, ...) for the samples the sampler left
out. Writes what each rank counted and which validation indices it saw.

One departure from main.py: under CPython < 3.12 the auxiliary loader's workers start with
forkserver, not the default fork. There a fork() while another thread of the parent holds the
interpreter's thread-state lock (HEAD_LOCK; a C thread entering Python takes it without the GIL)
leaves the child blocked forever in PyOS_AfterFork_Child (CPython gh-112275, fixed in 3.12). Right
after the validation's all_reduce it happened here in about one run of this script in a hundred
(gdb: the worker child in _PyThreadState_DeleteExcept, no gpufeed frame on its stack); main.py on
3.11 has the same hazard.

    torchrun --nproc-per-node 2 imagenet_main_worker.py TRAIN_DIR VAL_DIR OUT_DIR
"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision.datasets as datasets
from torch.utils.data import Subset

import gpufeed

BATCH_SIZE, WORKERS, EPOCHS = 4, 2, 2
AUX_START = "forkserver" if sys.version_info < (3, 12) else None  # None: the platform's default (fork)


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n

    def all_reduce(self):
        total = torch.tensor([self.sum, self.count], dtype=torch.float32)
        dist.all_reduce(total, dist.ReduceOp.SUM)
        self.sum, self.count = total.tolist()


def accuracy(output, target):
    return (output.argmax(1) == target).float().mean().item() * 100


def train(train_loader, model, criterion, optimizer, epoch, seen):
    model.train()
    for images, target in train_loader:
        seen.extend(train_loader.last_batch["indices"])
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(val_loader, model, criterion, world_size, seen):
    top1 = AverageMeter()

    def run_validate(loader, record):
        with torch.no_grad():
            for images, target in loader:
                record(loader)
                top1.update(accuracy(model(images), target), images.size(0))

    model.eval()
    run_validate(val_loader, lambda loader: seen["main"].extend(loader.last_batch["indices"]))
    top1.all_reduce()
    if len(val_loader.sampler) * world_size < len(val_loader.dataset):
        aux_range = range(len(val_loader.sampler) * world_size, len(val_loader.dataset))
        aux_val_dataset = Subset(val_loader.dataset, aux_range)
        aux_val_loader = torch.utils.data.DataLoader(aux_val_dataset, batch_size=BATCH_SIZE, shuffle=False,
                                                     num_workers=WORKERS, multiprocessing_context=AUX_START)
        seen["aux"].extend(aux_range)
        run_validate(aux_val_loader, lambda loader: None)
    return top1


def main():
    traindir, valdir, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 3))
    model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)

    val_dataset = datasets.ImageFolder(valdir)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    # The two replaced lines (main.py: torch.utils.data.DataLoader(train_dataset, ...) and
    # DataLoader(val_dataset, ..., sampler=val_sampler)).
    train_loader = gpufeed.DataLoader(traindir, batch_size=BATCH_SIZE, shuffle=True, num_workers=WORKERS,
                                      image_size=32)
    val_loader = gpufeed.DataLoader(valdir, batch_size=BATCH_SIZE, train=False, image_size=32,
                                    num_workers=WORKERS, sampler=val_sampler)

    result = {"rank": rank, "epochs": []}
    for epoch in range(EPOCHS):
        train_loader.set_epoch(epoch)  # main.py: train_sampler.set_epoch(epoch)
        train_seen, val_seen = [], {"main": [], "aux": []}
        train(train_loader, model, criterion, optimizer, epoch, train_seen)
        top1 = validate(val_loader, model, criterion, world_size, val_seen)
        result["epochs"].append({"train": train_seen, "val_main": val_seen["main"], "val_aux": val_seen["aux"],
                                 "top1_count": top1.count, "val_size": len(val_loader.dataset),
                                 "sampler_len": len(val_loader.sampler)})
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
