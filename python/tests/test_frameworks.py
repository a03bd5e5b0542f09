"""The call orders of training frameworks' loops against gpufeed.DataLoader, with the frameworks
themselves (PyTorch Lightning's fit loop, Accelerate's DataLoaderShard, torch's DataLoader over a
DistributedSampler) as the oracle: every epoch must come out in DistributedSampler's order for
the epoch the loop set, whatever iterators the loop made ahead of set_epoch."""
import random

import pytest
import torch

import gpufeed

N = 27  # the `folder` fixture's samples
SEED = 2


def gpufeed_loader(folder, **kw):
    return gpufeed.DataLoader(folder, batch_size=4, shuffle=True, seed=SEED, image_size=8, dtype=torch.uint8,
                              num_workers=1, prefetch_depth=3, **kw)


def torch_loader():
    """The oracle: torch's DataLoader over range(N) (a batch is its indices) with the
    DistributedSampler gpufeed's order is index for index."""
    sampler = torch.utils.data.DistributedSampler(range(N), num_replicas=1, rank=0, shuffle=True, seed=SEED)
    return torch.utils.data.DataLoader(range(N), batch_size=4, sampler=sampler)


def distributed_order(epoch):
    sampler = torch.utils.data.DistributedSampler(range(N), num_replicas=1, rank=0, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    order = list(sampler)
    return [order[k:k + 4] for k in range(0, N, 4)]


def test_an_iterator_runs_the_epoch_set_before_its_first_next_and_one_that_never_yields_uses_none(folder):
    """The rule of torch's DataLoader over a DistributedSampler, call for call."""
    g = gpufeed_loader(folder)
    early_a, early_b = iter(g), iter(g)  # Lightning's fit loop: two iterators before set_epoch(0)
    g.set_epoch(0)
    assert [list(g.last_batch["indices"]) for _ in g] == distributed_order(0)
    g.set_epoch(1)
    assert [list(g.last_batch["indices"]) for _ in g] == distributed_order(1)
    it = iter(g)
    g.set_epoch(3)  # between iter() and the first next(): the epoch set last is the one run
    assert [list(g.last_batch["indices"]) for _ in it] == distributed_order(3)
    # Without set_epoch, the epochs count by themselves from the last one that yielded.
    unused = iter(g)
    del unused
    assert [list(g.last_batch["indices"]) for _ in g] == distributed_order(4)
    with pytest.raises(RuntimeError, match="superseded"):
        next(early_a)


@pytest.mark.parametrize("seed", range(8))
def test_random_call_orders_yield_what_torch_dataloader_over_a_distributed_sampler_yields(folder, seed):
    """iter, next on any live iterator, set_epoch, in random orders: gpufeed with sampler= and
    torch's DataLoader with an identical DistributedSampler yield the same index batches (the one
    documented difference: an older iterator a newer iter() replaced raises)."""
    rng = random.Random(seed)
    g_sampler = torch.utils.data.DistributedSampler(range(N), num_replicas=1, rank=0, shuffle=True, seed=SEED)
    g = gpufeed.DataLoader(folder, batch_size=4, sampler=g_sampler, image_size=8, dtype=torch.uint8,
                           num_workers=1, prefetch_depth=3)
    oracle = torch_loader()
    iterators = []
    log = []
    for _ in range(80):
        op = rng.choices(["iter", "next", "set_epoch"], [2, 8, 2])[0]
        if op == "next" and not iterators:
            op = "iter"
        log.append(op)
        if op == "iter":
            iterators.append((iter(g), iter(oracle)))
        elif op == "set_epoch":
            epoch = rng.randrange(4)
            g_sampler.set_epoch(epoch)
            oracle.sampler.set_epoch(epoch)
        else:
            k = len(iterators) - 1 if rng.random() < 0.8 else rng.randrange(len(iterators))
            g_it, o_it = iterators[k]
            try:
                next(g_it)
                got = list(g.last_batch["indices"])
            except StopIteration:
                got = "stop"
            except RuntimeError as e:
                assert "superseded" in str(e) and k < len(iterators) - 1, log
                continue
            want = next(o_it, "stop")
            assert got == (want if want == "stop" else want.tolist()), log


class _Recorder:
    """A LightningModule that records each training batch's dataset indices per epoch."""

    def __new__(cls, loader, indices_of):
        pl = pytest.importorskip("pytorch_lightning")

        class Recorder(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.zeros(1))
                self.seen = {}

            def train_dataloader(self):
                return loader

            def training_step(self, batch, batch_idx):
                self.seen.setdefault(self.current_epoch, []).append(indices_of(batch))
                return (self.weight * 0).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Recorder()


def _fit(module, epochs):
    pl = pytest.importorskip("pytorch_lightning")
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module)
    return module.seen


def test_lightning_fit_loop_runs_each_epoch_in_the_order_it_gives_torch_dataloader(folder):
    """PyTorch Lightning's fit loop makes iterators before it calls set_epoch(0) through
    loader.sampler, then set_epoch(e) before each epoch's iter(): its epochs over gpufeed are its
    epochs over torch's DataLoader with the same DistributedSampler."""
    pytest.importorskip("pytorch_lightning", reason="pytorch-lightning is not installed (setup.sh)")
    want = _fit(_Recorder(torch_loader(), lambda batch: batch.tolist()), 3)
    g = gpufeed_loader(folder)
    got = _fit(_Recorder(g, lambda batch: list(g.last_batch["indices"])), 3)
    assert want == {e: distributed_order(e) for e in range(3)}  # the oracle is DistributedSampler's order
    assert got == want


def _accelerate_epochs(loader, epochs):
    """Accelerate's loop over a prepared loader: for a torch DataLoader its DataLoaderShard (which
    calls set_epoch(iteration) at each iter() and reads one batch ahead); gpufeed's loader, which
    accelerate.prepare returns as it is, driven in the same call order."""
    accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed (setup.sh)")
    accelerator = accelerate.Accelerator(cpu=True)
    prepared = accelerator.prepare(loader)
    seen = {}
    if isinstance(loader, torch.utils.data.DataLoader):
        assert isinstance(prepared, accelerate.data_loader.DataLoaderShard)
        for epoch in range(epochs):
            seen[epoch] = [b.tolist() for b in prepared]
        return seen
    assert prepared is loader
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        it = iter(loader)
        next(it)
        rows, current = [], list(loader.last_batch["indices"])
        for _ in it:  # one batch ahead, as DataLoaderShard reads
            rows.append(current)
            current = list(loader.last_batch["indices"])
        seen[epoch] = rows + [current]
    return seen


def test_accelerate_loop_runs_each_epoch_in_the_order_it_gives_torch_dataloader(folder):
    want = _accelerate_epochs(torch_loader(), 3)
    assert want == {e: distributed_order(e) for e in range(3)}
    assert _accelerate_epochs(gpufeed_loader(folder), 3) == want
