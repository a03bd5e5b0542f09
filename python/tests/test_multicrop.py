"""Multi-crop views (views=): DINO's collate shape, the presets, one decode per sample, thread
count and resume independence, the DistributedSampler order, and the refusals."""
import pytest
import torch

import gpufeed

# Small views for speed: 2 "global" 32 px and 2 "local" 16 px, the DINOv2 paper's chains.
SMALL = [dict(v, image_size=32 if k < 2 else 16, gaussian_blur_kernel=5)
         for k, v in enumerate(gpufeed.views_preset("dinov2_paper", local_crops_number=2))]


def views_loader(folder, **kw):
    args = dict(batch_size=4, views=SMALL, seed=3, num_workers=2, dtype=torch.uint8, prefetch_next_epoch=False)
    args.update(kw)
    return gpufeed.DataLoader(folder, **args)


def epoch(loader):
    """[(views, labels, indices)] of one epoch, copied."""
    return [([v.clone() for v in views], labels.clone(), list(loader.last_batch["indices"]))
            for views, labels in loader]


def test_presets_as_the_reference_code_and_paper_state():
    assert set(gpufeed._C.views_preset_names()) == {"dino", "dinov2", "dinov2_paper"}
    v2 = gpufeed.views_preset("dinov2")
    assert len(v2) == 10
    assert [v["image_size"] for v in v2] == [224, 224] + [96] * 8
    assert [v["gaussian_blur_p"] for v in v2[:3]] == [0.0, pytest.approx(0.9), 0.5]
    assert [v["gaussian_blur_p"] for v in gpufeed.views_preset("dinov2_paper")[:3]] == [1.0, pytest.approx(0.1), 0.5]
    assert [v["solarize_p"] for v in v2[:3]] == [0.0, pytest.approx(0.2), 0.0]
    assert all(v["interpolation"] == "bicubic" and v["color_jitter_p"] == pytest.approx(0.8) for v in v2)
    assert tuple(v2[0]["color_jitter"]) == pytest.approx((0.4, 0.4, 0.2, 0.1))
    dino = gpufeed.views_preset("dino", local_crops_number=6)
    assert len(dino) == 8 and tuple(dino[0]["scale"]) == pytest.approx((0.4, 1.0))
    with pytest.raises(ValueError, match="dinov2_paper"):
        gpufeed.views_preset("simclr")


def test_batches_are_lists_of_views_in_dinos_collate_shape(folder):
    loader = gpufeed.DataLoader(folder, batch_size=4, views="dinov2", local_crops_number=2, num_workers=2)
    assert len(loader.views) == 4
    views, labels = next(iter(loader))
    assert isinstance(views, list) and len(views) == 4
    assert [tuple(v.shape) for v in views] == [(4, 3, 224, 224)] * 2 + [(4, 3, 96, 96)] * 2
    assert all(v.dtype == torch.float32 and v.is_contiguous() for v in views)
    assert labels.shape == (4,)
    # uint8: zero-copy NHWC views of the slot, one contiguous tensor per view.
    u8 = gpufeed.DataLoader(folder, batch_size=4, views="dinov2", local_crops_number=2, dtype=torch.uint8)
    views, _ = next(iter(u8))
    assert [tuple(v.shape) for v in views] == [(4, 224, 224, 3)] * 2 + [(4, 96, 96, 3)] * 2
    assert all(v.dtype == torch.uint8 and v.is_contiguous() for v in views)


def test_each_view_equals_load_sample_and_every_sample_is_decoded_once(folder):
    loader = views_loader(folder, shuffle=True)
    loader.set_epoch(2)
    batches = epoch(loader)
    assert sum(len(b[1]) for b in batches) == 27
    for views, labels, indices in batches:
        for row, index in enumerate(indices):
            want = loader.load_sample(index, 2)
            assert len(want) == 4
            for k in range(4):
                assert torch.equal(views[k][row], want[k]), (index, k)
            assert labels[row] == loader.targets[index]
    stats = loader.stats()
    assert stats["samples"] == 27 and stats["decodes"] == 27


def test_views_are_the_same_for_any_thread_count_and_across_a_resume(folder):
    one = epoch(views_loader(folder, num_workers=1, shuffle=True))
    two_loader = views_loader(folder, num_workers=2, shuffle=True)
    two = epoch(two_loader)
    auto = epoch(views_loader(folder, num_workers="auto", shuffle=True))
    assert [b[2] for b in one] == [b[2] for b in two] == [b[2] for b in auto]
    for a, b, c in zip(one, two, auto):
        assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(a[0], b[0], c[0]))
    # Mid-epoch resume: state_dict after 3 batches, a new loader continues with the same views.
    loader = views_loader(folder, shuffle=True)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    resumed = views_loader(folder, shuffle=True)
    resumed.load_state_dict(state)
    rest = epoch(resumed)
    assert [b[2] for b in rest] == [b[2] for b in two[3:]]
    for a, b in zip(rest, two[3:]):
        assert all(torch.equal(x, y) for x, y in zip(a[0], b[0]))


def test_distributed_ranks_follow_distributed_sampler_and_share_the_views(folder):
    whole = {i: [v[r] for v in views] for views, _, idx in epoch(views_loader(folder, shuffle=True))
             for r, i in enumerate(idx)}
    for rank in (0, 1):
        loader = views_loader(folder, shuffle=True, rank=rank, world_size=2)
        sampler = torch.utils.data.DistributedSampler(range(27), num_replicas=2, rank=rank, shuffle=True, seed=3)
        batches = epoch(loader)
        assert [i for b in batches for i in b[2]] == list(sampler)
        for views, _, idx in batches:
            for r, i in enumerate(idx):
                assert all(torch.equal(views[k][r], whole[i][k]) for k in range(4)), (rank, i)


def test_views_given_view_by_view_and_their_errors(folder):
    views = [dict(image_size=24, interpolation="bicubic", hflip_p=0.0), dict(image_size=12, scale=(0.05, 0.4))]
    loader = gpufeed.DataLoader(folder, batch_size=5, views=views, dtype=torch.uint8, num_workers=1)
    batch, _ = next(iter(loader))
    assert [tuple(v.shape) for v in batch] == [(5, 24, 24, 3), (5, 12, 12, 3)]
    assert [(v["image_size"], v["interpolation"], v["hflip_p"]) for v in loader.views] == \
        [(24, "bicubic", 0.0), (12, "bilinear", 0.5)]
    assert tuple(loader.views[1]["scale"]) == pytest.approx((0.05, 0.4))
    # dataset[i] as a torch Dataset: the views of sample i.
    sample, label = loader.dataset[3]
    assert isinstance(sample, list) and [tuple(v.shape) for v in sample] == [(24, 24, 3), (12, 12, 3)]
    with pytest.raises(ValueError, match=r"views\[1\]: 'train' is not a view keyword"):
        gpufeed.DataLoader(folder, views=[dict(image_size=24), dict(train=False)])
    with pytest.raises(TypeError, match=r"views\[0\] must be a dict"):
        gpufeed.DataLoader(folder, views=[224])
    with pytest.raises(ValueError, match=r"views\[0\].grayscale_p"):
        gpufeed.DataLoader(folder, views=[dict(grayscale_p=2.0)])
    with pytest.raises(ValueError, match="local_crops_number"):
        gpufeed.DataLoader(folder, local_crops_number=4)
    with pytest.raises(ValueError, match="augmentation"):
        gpufeed.DataLoader(folder, views="dino", color_jitter=0.4)
    with pytest.raises(ValueError, match="views"):
        gpufeed.DataLoader(folder, views="dino", max_image_size=256)
    with pytest.raises(ValueError, match="own fixed size"):
        gpufeed.DataLoader(folder, views="dino").set_image_size(128)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the engine's per-view copy and "
                    "conversion); runs in tools/gpu_check.sh")
def test_cuda_views_equal_the_cpu_path(folder):
    for dtype, memory_format in ((torch.float32, torch.channels_last), (torch.uint8, torch.contiguous_format)):
        args = dict(batch_size=4, views=SMALL, seed=3, num_workers=2, shuffle=True, dtype=dtype,
                    memory_format=memory_format)
        cpu = gpufeed.DataLoader(folder, **args)
        gpu = gpufeed.DataLoader(folder, device="cuda", **args)
        batches = 0
        for (cv, cl), (gv, gl) in zip(cpu, gpu):
            batches += 1
            assert len(gv) == 4 and all(v.is_cuda for v in gv)
            assert torch.equal(cl, gl.cpu())
            for c, g in zip(cv, gv):
                assert c.shape == g.shape and torch.equal(c, g.cpu()), dtype
        assert batches == 7
