"""gpufeed.DataLoader over WebDataset tar shards (written here by webdataset's TarWriter): the same
batches as over the folder holding the same files, and the labels webdataset reads."""
import pytest
import torch

from conftest import make_image_folder

wds = pytest.importorskip("webdataset", reason="webdataset is not installed (setup.sh installs it)")
import gpufeed  # noqa: E402


def test_shards_give_the_folders_batches_and_webdatasets_labels(tmp_path):
    folder = make_image_folder(tmp_path / "train", per_class=7, seed=3)
    files = sorted((p.parent.name, p) for p in folder.rglob("*.jpg"))
    classes = sorted({c for c, _ in files})
    shards = tmp_path / "shards"
    shards.mkdir()
    for s in range(0, len(files), 8):
        with wds.TarWriter(str(shards / f"train-{s // 8:06d}.tar")) as sink:
            for c, p in files[s:s + 8]:
                sink.write({"__key__": f"{c}/{p.stem}", "jpg": p.read_bytes(), "cls": classes.index(c)})
    pattern = str(shards / "train-{000000..000002}.tar")
    wds_labels = [int(x["cls"]) for x in wds.WebDataset(pattern, shardshuffle=False, empty_check=False)]

    def batches(root):
        loader = gpufeed.DataLoader(root, batch_size=5, shuffle=True, seed=2, num_workers=2,
                                    image_size=48, dtype=torch.uint8, index_cache="off")
        loader.set_epoch(1)
        out = [(x.clone(), y.clone()) for x, y in loader]
        return loader, out

    by_folder, a = batches(folder)
    by_shards, b = batches(pattern)
    assert [label for _, label in by_shards.samples] == wds_labels
    assert by_shards.samples[0][0].endswith("train-000000.tar:ants/" + files[0][1].stem + ".jpg")
    assert len(a) == len(b) == 5
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb)
        assert torch.equal(ya, yb)
