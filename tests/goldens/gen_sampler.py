"""Index orders from torch.utils.data.DistributedSampler and torch.randperm."""
import json
import pathlib

import torch
from torch.utils.data import DistributedSampler


class _Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


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
    (out / "sampler.json").write_text(json.dumps({"randperm": perms, "distributed": cases}))
