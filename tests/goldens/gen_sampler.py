"""Index orders from torch.utils.data.DistributedSampler and torch.randperm, and the torchvision
references' RASampler (reimplemented below from its description)."""
import json
import math
import pathlib

import torch
from torch.utils.data import DistributedSampler


class _Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def ra_sampler_indices(n, num_replicas, rank, shuffle, seed, epoch, repetitions, multiple=256):
    """torchvision's references/classification/sampler.py RASampler, written from its description
    (the references are not part of the torchvision package): torch.randperm(n) with a generator
    seeded seed + epoch (or range(n)); each index repeated `repetitions` times in a row; padded
    from its start to total_size = ceil(n * repetitions / num_replicas) * num_replicas; this
    rank's slice [rank:total_size:num_replicas]; its first
    floor(n // multiple * multiple / num_replicas) entries. Returns (indices, len)."""
    num_samples = int(math.ceil(n * float(repetitions) / num_replicas))
    total_size = num_samples * num_replicas
    num_selected = int(math.floor(n // multiple * multiple / num_replicas))
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    indices = [i for i in order for _ in range(repetitions)]
    indices += indices[: total_size - len(indices)]
    assert len(indices) == total_size
    mine = indices[rank:total_size:num_replicas]
    assert len(mine) == num_samples
    return mine[:num_selected], num_selected


def _ra_cases():
    cases = []
    for n, multiple in [(0, 256), (255, 256), (256, 256), (300, 256), (1000, 256), (1031, 256), (7, 1), (10, 1),
                        (10, 4)]:
        for world in [1, 2, 3, 4, 8]:
            for reps in [1, 3, 4]:
                if 0 < n * reps < math.ceil(n * reps / world) * world - n * reps:
                    continue  # the references' assertion: padding longer than the list
                for shuffle, seed in [(True, 0), (True, 1234), (False, 0)]:
                    for rank in range(world):
                        epochs = []
                        for epoch in [0, 1, 7]:
                            idx, length = ra_sampler_indices(n, world, rank, shuffle, seed, epoch, reps, multiple)
                            epochs.append({"epoch": epoch, "indices": idx})
                        cases.append({"n": n, "num_replicas": world, "rank": rank, "shuffle": shuffle,
                                      "seed": seed, "repetitions": reps, "selection_multiple": multiple,
                                      "len": length, "epochs": epochs})
    return cases


def make(out: pathlib.Path) -> None:
    perms = []
    for n, seed in [(0, 0), (1, 0), (2, 1), (10, 5), (100, 0), (1000, 42), (4097, 7),
                    (17, 2**32 + 3), (50, 2**63 - 1)]:
        g = torch.Generator()
        g.manual_seed(seed)
        perms.append({"n": n, "seed": seed, "perm": torch.randperm(n, generator=g).tolist()})

    cases = []
    for n in [0, 1, 3, 7, 10, 64, 101]:
        for world in [1, 2, 3, 4, 8, 16]:
            for drop_last in [False, True]:
                for shuffle in [True, False]:
                    for seed in [0, 1234]:
                        for rank in range(world):
                            s = DistributedSampler(_Len(n), num_replicas=world, rank=rank,
                                                   shuffle=shuffle, seed=seed, drop_last=drop_last)
                            epochs = []
                            for epoch in [0, 1, 5]:
                                s.set_epoch(epoch)
                                epochs.append({"epoch": epoch, "indices": list(iter(s))})
                            cases.append({"n": n, "num_replicas": world, "rank": rank,
                                          "shuffle": shuffle, "seed": seed,
                                          "drop_last": drop_last, "len": len(s),
                                          "epochs": epochs})
    (out / "sampler.json").write_text(json.dumps({"randperm": perms, "distributed": cases,
                                                 "ra_sampler": _ra_cases()}))
