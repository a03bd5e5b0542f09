"""One rank of test_loader.py's torchrun test: iterate two epochs, write the indices and labels."""
import json
import sys

import torch
import torch.distributed as dist

import gpufeed

folder, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
loader = gpufeed.DataLoader(folder, batch_size=4, shuffle=True, seed=5, num_workers=1, image_size=32)
result = {"rank": loader.rank, "world_size": loader.world_size, "targets": loader.targets, "indices": {}, "labels": {}}
for epoch in (1, 2):
    loader.set_epoch(epoch)
    indices, labels = [], []
    for images, y in loader:
        indices += loader.last_batch["indices"]
        labels += y.tolist()
    result["indices"][epoch] = indices
    result["labels"][epoch] = labels
    # The ranks step together (every rank has the same number of batches).
    t = torch.tensor([len(indices)])
    dist.all_reduce(t)
    assert t.item() == 2 * len(indices)
with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
